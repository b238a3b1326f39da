/**
 * Summaries of V8 .cpuprofile files (node --cpu-prof, /debug/profile/cpu): self time per function
 * and per file, and the call tree pruned for a flame graph (svg.ts flameGraph); the same tree of a
 * .heapprofile (/debug/profile/heap).
 */
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

export interface ProfileEntry {
  name: string;
  /** Share of all samples, 0..1. */
  share: number;
}

export interface ProfileSummary {
  file: string;
  /** Busy (non-idle) time sampled, ms; shares are relative to it. */
  samplesMs: number;
  topFunctions: ProfileEntry[];
  topFiles: ProfileEntry[];
  /** Busy time as a call tree (frames narrower than FLAME_MIN_SHARE dropped). */
  flame?: FlameNode;
}

/** One frame of the call tree: a function called from its parent's frame. */
export interface FlameNode {
  /** Function name, `(anonymous)`, or V8's own: `(garbage collector)`, `(program)`, a native. */
  name: string;
  /** Short source location (`src/proxy/forward.ts:12`, `undici/lib/...`, `node:events:471`), '' for natives. */
  at: string;
  /** Time sampled in this frame itself / with everything it called, ms (heap profiles: bytes). */
  self: number;
  total: number;
  /** Widest first. */
  children: FlameNode[];
}

/** Frames narrower than this share of the busy time are left out of the flame tree (results.json stays small). */
export const FLAME_MIN_SHARE = 0.002;

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}

/** A V8 CPU profile (`.cpuprofile`: node --cpu-prof, /debug/profile/cpu). */
export interface CpuProfile {
  nodes: Array<{ id: number; callFrame: CallFrame; children?: number[] }>;
  samples: number[];
  timeDeltas: number[];
}

/** A frame's file, short: `undici/lib/…` for a dependency; from src/, dist/ (the built image) or bench/ for this repository's. */
export function shortUrl(url: string): string {
  const path = url.replace(/^file:\/\//, '');
  const deps = path.lastIndexOf('/node_modules/');
  if (deps >= 0) return path.slice(deps + '/node_modules/'.length);
  return path.replace(/.*\/(src|dist|bench)\//, '$1/');
}

export function summarizeProfile(file: string, top = 15, flameMinShare = FLAME_MIN_SHARE): ProfileSummary {
  const prof = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  // Shares are of busy time: the process sits idle while other targets are measured. The tops are
  // taken from the whole tree, which is then pruned for the flame graph.
  const flame = flameTree(prof, 0);
  const summary = { file, samplesMs: flame.total, topFunctions: topFunctions(flame, top), topFiles: topFiles(flame, top), flame };
  pruneFlame(flame, flameMinShare);
  return summary;
}

/** A profile's call tree in the shape both V8 formats reduce to: a frame, its own value, its callees. */
interface RawFrame {
  callFrame: CallFrame;
  self: number;
  children: RawFrame[];
}

/**
 * The profile's busy time as a call tree rooted at `all`: V8's `(idle)` is left out, frames with
 * the same function and location under one parent are merged, children sorted widest first, and
 * frames narrower than `minShare` of the busy time dropped (their time stays in their parent's total).
 * Values in ms.
 */
export function flameTree(prof: CpuProfile, minShare = FLAME_MIN_SHARE): FlameNode {
  const selfUs = new Map<number, number>();
  for (let i = 0; i < prof.samples.length; i++) selfUs.set(prof.samples[i]!, (selfUs.get(prof.samples[i]!) ?? 0) + (prof.timeDeltas[i] ?? 0));
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const raw = (id: number): RawFrame | undefined => {
    const n = byId.get(id);
    if (n === undefined || n.callFrame.functionName === '(idle)') return undefined;
    const children: RawFrame[] = [];
    for (const c of n.children ?? []) {
      const child = raw(c);
      if (child !== undefined) children.push(child);
    }
    return { callFrame: n.callFrame, self: (selfUs.get(id) ?? 0) / 1000, children };
  };
  return rootedTree(prof.nodes[0] ? raw(prof.nodes[0].id) : undefined, minShare);
}

/** A V8 sampling heap profile (`.heapprofile`, HeapProfiler.stopSampling). */
export interface HeapProfile {
  head: HeapProfileNode;
}

interface HeapProfileNode {
  callFrame: CallFrame;
  /** Bytes of sampled allocations made in this frame itself and alive when sampling stopped. */
  selfSize: number;
  children: HeapProfileNode[];
}

/** The same tree as flameTree's, of a heap profile: bytes still alive, by where they were allocated. */
export function heapFlameTree(prof: HeapProfile, minShare = FLAME_MIN_SHARE): FlameNode {
  const raw = (n: HeapProfileNode): RawFrame => ({ callFrame: n.callFrame, self: n.selfSize, children: n.children.map(raw) });
  return rootedTree(raw(prof.head), minShare);
}

/** Merged, pruned and rooted at `all` (V8's `(root)` frame becomes it). */
function rootedTree(root: RawFrame | undefined, minShare: number): FlameNode {
  const top = root === undefined ? undefined : toFlame(root);
  const all: FlameNode = { name: 'all', at: '', self: top?.self ?? 0, total: top?.total ?? 0, children: top?.children ?? [] };
  return pruneFlame(all, minShare);
}

/** Drops, in place, the frames of `tree` narrower than `minShare` of the whole (their time stays in their parent's total). */
export function pruneFlame(tree: FlameNode, minShare: number): FlameNode {
  prune(tree, tree.total * minShare);
  return tree;
}

function toFlame(raw: RawFrame): FlameNode {
  const url = shortUrl(raw.callFrame.url);
  const node: FlameNode = {
    name: raw.callFrame.functionName || '(anonymous)',
    at: url ? `${url}:${raw.callFrame.lineNumber + 1}` : '',
    self: raw.self,
    total: raw.self,
    children: [],
  };
  const merged = new Map<string, FlameNode>();
  for (const c of raw.children) {
    const child = toFlame(c);
    node.total += child.total;
    const key = `${child.name}\u0000${child.at}`;
    const same = merged.get(key);
    if (same === undefined) merged.set(key, child);
    else mergeInto(same, child);
  }
  node.children = [...merged.values()];
  return node;
}

/** Self value per function, largest first, as shares of the whole tree. */
export function topFunctions(root: FlameNode, top = 15): ProfileEntry[] {
  return topBy(root, top, (n) => (n.at ? `${n.name} (${n.at})` : n.name));
}

/** Self value per file (a native frame: its name in brackets), largest first. */
export function topFiles(root: FlameNode, top = 15): ProfileEntry[] {
  return topBy(root, top, (n) => (n.at ? n.at.slice(0, n.at.lastIndexOf(':')) : `(${n.name.replace(/^\((.*)\)$/, '$1')})`));
}

function topBy(root: FlameNode, top: number, key: (n: FlameNode) => string): ProfileEntry[] {
  const by = new Map<string, number>();
  const walk = (n: FlameNode): void => {
    if (n.self > 0 && n !== root) by.set(key(n), (by.get(key(n)) ?? 0) + n.self);
    n.children.forEach(walk);
  };
  walk(root);
  return [...by.entries()].sort((a, b) => b[1] - a[1]).slice(0, top).map(([name, v]) => ({ name, share: root.total > 0 ? v / root.total : 0 }));
}

function mergeInto(into: FlameNode, from: FlameNode): void {
  into.self += from.self;
  into.total += from.total;
  for (const c of from.children) {
    const same = into.children.find((x) => x.name === c.name && x.at === c.at);
    if (same === undefined) into.children.push(c);
    else mergeInto(same, c);
  }
}

/**
 * Drops frames narrower than `min`, sorts, and rounds to 1/100 of the unit (10 µs of a CPU profile,
 * which samples every ~1 ms; a heap profile's bytes are whole already): results.json stays small.
 */
function prune(node: FlameNode, min: number): void {
  node.self = Math.round(node.self * 100) / 100;
  node.total = Math.round(node.total * 100) / 100;
  node.children = node.children.filter((c) => c.total >= min).sort((a, b) => b.total - a.total);
  for (const c of node.children) prune(c, min);
}

/**
 * The biggest file in `dir` whose name matches `pattern`; undefined when there is none. Node writes
 * one profile per thread (tsx runs its loader in a worker), so the biggest — the main thread's — wins.
 */
export function biggestProfile(dir: string, pattern = /\.cpuprofile$/): string | undefined {
  let files: string[];
  try {
    files = readdirSync(dir).filter((f) => pattern.test(f));
  } catch {
    return undefined;
  }
  const biggest = files.map((f) => ({ f: join(dir, f), size: statSync(join(dir, f)).size })).sort((a, b) => b.size - a.size)[0];
  return biggest?.f;
}

/** The main thread's CPU profile in `dir`, summarised; undefined when there is none. */
export function summarizeDir(dir: string, top = 15, flameMinShare = FLAME_MIN_SHARE): ProfileSummary | undefined {
  const file = biggestProfile(dir);
  return file === undefined ? undefined : summarizeProfile(file, top, flameMinShare);
}
