/**
 * Summaries of V8 .cpuprofile files (node --cpu-prof): self time per function and per file, and the
 * call tree pruned for a flame graph (svg.ts flameGraph).
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
  /** Time sampled in this frame itself / with everything it called, ms. */
  selfMs: number;
  totalMs: number;
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

function shortUrl(url: string): string {
  return url.replace(/^file:\/\//, '').replace(/.*\/node_modules\//, '').replace(/.*\/(src|bench)\//, '$1/');
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

/**
 * The profile's busy time as a call tree rooted at `all`: V8's `(idle)` is left out, frames with
 * the same function and location under one parent are merged, children sorted widest first, and
 * frames narrower than `minShare` of the busy time dropped (their time stays in their parent's total).
 */
export function flameTree(prof: CpuProfile, minShare = FLAME_MIN_SHARE): FlameNode {
  const selfUs = new Map<number, number>();
  for (let i = 0; i < prof.samples.length; i++) selfUs.set(prof.samples[i]!, (selfUs.get(prof.samples[i]!) ?? 0) + (prof.timeDeltas[i] ?? 0));
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const build = (id: number): FlameNode | undefined => {
    const n = byId.get(id);
    if (n === undefined || n.callFrame.functionName === '(idle)') return undefined;
    const url = shortUrl(n.callFrame.url);
    const node: FlameNode = {
      name: n.callFrame.functionName || '(anonymous)',
      at: url ? `${url}:${n.callFrame.lineNumber + 1}` : '',
      selfMs: (selfUs.get(id) ?? 0) / 1000,
      totalMs: 0,
      children: [],
    };
    node.totalMs = node.selfMs;
    const merged = new Map<string, FlameNode>();
    for (const c of n.children ?? []) {
      const child = build(c);
      if (child === undefined) continue;
      node.totalMs += child.totalMs;
      const key = `${child.name}\u0000${child.at}`;
      const same = merged.get(key);
      if (same === undefined) merged.set(key, child);
      else mergeInto(same, child);
    }
    node.children = [...merged.values()];
    return node;
  };
  const root = prof.nodes[0] ? build(prof.nodes[0].id) : undefined;
  const all: FlameNode = { name: 'all', at: '', selfMs: 0, totalMs: root?.totalMs ?? 0, children: root ? root.children : [] };
  // The (root) frame's own samples (V8 rarely has any) stay in `all`.
  all.selfMs = root?.selfMs ?? 0;
  prune(all, all.totalMs * minShare);
  return all;
}

function mergeInto(into: FlameNode, from: FlameNode): void {
  into.selfMs += from.selfMs;
  into.totalMs += from.totalMs;
  for (const c of from.children) {
    const same = into.children.find((x) => x.name === c.name && x.at === c.at);
    if (same === undefined) into.children.push(c);
    else mergeInto(same, c);
  }
}

/** Drops narrow frames, sorts, and rounds to 10 µs (a profile samples every ~1 ms; results.json stays small). */
function prune(node: FlameNode, minMs: number): void {
  node.selfMs = Math.round(node.selfMs * 100) / 100;
  node.totalMs = Math.round(node.totalMs * 100) / 100;
  node.children = node.children.filter((c) => c.totalMs >= minMs).sort((a, b) => b.totalMs - a.totalMs);
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
