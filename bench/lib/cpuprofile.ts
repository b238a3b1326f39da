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

export interface CpuProfile {
  nodes: Array<{ id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }>;
  samples: number[];
  timeDeltas: number[];
}

/** A frame's file, short: `undici/lib/…` for a dependency; src/, dist/ (the built image) or bench/ for Sluice's own. */
export function shortUrl(url: string): string {
  const path = url.replace(/^file:\/\//, '');
  const deps = path.lastIndexOf('/node_modules/');
  if (deps >= 0) return path.slice(deps + '/node_modules/'.length);
  return path.replace(/.*\/(src|dist|bench)\//, '$1/');
}

export function summarizeProfile(file: string, top = 15, flameMinShare = FLAME_MIN_SHARE): ProfileSummary {
  const prof = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const fn = new Map<string, number>();
  const files = new Map<string, number>();
  let total = 0;
  for (let i = 0; i < prof.samples.length; i++) {
    const node = byId.get(prof.samples[i]!);
    const d = prof.timeDeltas[i] ?? 0;
    if (node === undefined) continue;
    const cf = node.callFrame;
    // Shares are of busy time: the process sits idle while other targets are measured.
    if (cf.functionName === '(idle)') continue;
    total += d;
    const url = shortUrl(cf.url);
    const key = url ? `${cf.functionName || '(anonymous)'} (${url}:${cf.lineNumber + 1})` : cf.functionName || '(native)';
    fn.set(key, (fn.get(key) ?? 0) + d);
    const fk = url || `(${cf.functionName || 'native'})`;
    files.set(fk, (files.get(fk) ?? 0) + d);
  }
  const topOf = (m: Map<string, number>): ProfileEntry[] =>
    [...m.entries()].sort((a, b) => b[1] - a[1]).slice(0, top).map(([name, v]) => ({ name, share: total > 0 ? v / total : 0 }));
  return { file, samplesMs: total / 1000, topFunctions: topOf(fn), topFiles: topOf(files), flame: flameTree(prof, flameMinShare) };
}

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
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
  prune(all, all.total * minShare);
  return all;
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

/** Self value per function, largest first, as shares of `total`. */
export function topFunctions(root: FlameNode, top = 15): ProfileEntry[] {
  const by = new Map<string, number>();
  const walk = (n: FlameNode): void => {
    if (n.self > 0 && n !== root) {
      const key = n.at ? `${n.name} (${n.at})` : n.name;
      by.set(key, (by.get(key) ?? 0) + n.self);
    }
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

/** Drops narrow frames, sorts, and rounds to 1/100 (10 µs: a CPU profile samples every ~1 ms; results.json stays small). */
function prune(node: FlameNode, minMs: number): void {
  node.self = Math.round(node.self * 100) / 100;
  node.total = Math.round(node.total * 100) / 100;
  node.children = node.children.filter((c) => c.total >= minMs).sort((a, b) => b.total - a.total);
  for (const c of node.children) prune(c, minMs);
}

/**
 * The main thread's profile in `dir`, summarised; undefined when there is none. Node writes one
 * file per thread (tsx runs its loader in a worker), so the biggest file — the main thread's — wins.
 */
export function summarizeDir(dir: string, top = 15, flameMinShare = FLAME_MIN_SHARE): ProfileSummary | undefined {
  let files: string[];
  try {
    files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  } catch {
    return undefined;
  }
  const biggest = files.map((f) => ({ f, size: statSync(join(dir, f)).size })).sort((a, b) => b.size - a.size)[0];
  return biggest ? summarizeProfile(join(dir, biggest.f), top, flameMinShare) : undefined;
}
