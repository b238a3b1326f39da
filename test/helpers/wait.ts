import type { ChildProcess } from 'node:child_process';

/** Polls `cond` every 10 ms until it holds; throws after `ms` naming `what`. */
export async function until(cond: () => boolean | Promise<boolean>, ms = 5000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`${what} not met in ${ms} ms`);
}

/** The exit code of `p` once it closed, after sending it `signal` (its stdio drained: 'close', not 'exit'). */
export function exitCodeAfter(p: ChildProcess, signal: NodeJS.Signals): Promise<number | null> {
  const closed = new Promise<number | null>((resolve) => p.once('close', resolve));
  p.kill(signal);
  return closed;
}
