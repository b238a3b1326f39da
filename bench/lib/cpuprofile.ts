/** Summaries of V8 .cpuprofile files (node --cpu-prof): self time per function and per file. */
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
}

interface CpuProfile {
  nodes: Array<{ id: number; callFrame: { functionName: string; url: string; lineNumber: number } }>;
  samples: number[];
  timeDeltas: number[];
}

function shortUrl(url: string): string {
  return url.replace(/^file:\/\//, '').replace(/.*\/node_modules\//, '').replace(/.*\/(src|bench)\//, '$1/');
}

export function summarizeProfile(file: string, top = 15): ProfileSummary {
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
  return { file, samplesMs: total / 1000, topFunctions: topOf(fn), topFiles: topOf(files) };
}

/**
 * The main thread's profile in `dir`, summarised; undefined when there is none. Node writes one
 * file per thread (tsx runs its loader in a worker), so the biggest file — the main thread's — wins.
 */
export function summarizeDir(dir: string, top = 15): ProfileSummary | undefined {
  let files: string[];
  try {
    files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  } catch {
    return undefined;
  }
  const biggest = files.map((f) => ({ f, size: statSync(join(dir, f)).size })).sort((a, b) => b.size - a.size)[0];
  return biggest ? summarizeProfile(join(dir, biggest.f), top) : undefined;
}
