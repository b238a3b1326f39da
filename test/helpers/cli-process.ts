import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { join } from 'node:path';

/** The `sluice` entry point, run through tsx as `npm start` does. */
export const CLI = join(import.meta.dirname, '../../src/cli.ts');

/**
 * Node's start-up through tsx takes 1–3 s on an idle box and far longer while the suite's other
 * files load both cores; a generous bound, since a process that dies instead ends the wait at once.
 */
const START_MS = 60_000;

export interface CliProcess {
  p: ChildProcessWithoutNullStreams;
  /** What it printed so far. */
  stdout(): string;
  /** The first JSON log line whose message includes `listening`, parsed. */
  listening<T = Record<string, unknown>>(): Promise<T>;
}

/**
 * Spawns `sluice ARGS` (`preload` modules imported first). `listening()` fails at once, with what
 * the process printed, when it exits before saying it listens: a failed start says why rather than
 * waiting out the bound.
 */
export function spawnCli(args: string[], preload: string[] = []): CliProcess {
  const p = spawn(process.execPath, ['--import', 'tsx', ...preload.flatMap((m) => ['--import', m]), CLI, ...args]);
  let out = '';
  let err = '';
  p.stdout.on('data', (c) => (out += c));
  p.stderr.on('data', (c) => (err += c));
  const listening = new Promise<Record<string, unknown>>((resolve, reject) => {
    const line = () => out.split('\n').find((l) => l.includes('listening'));
    const onData = () => {
      const found = line();
      if (found) done(() => resolve(JSON.parse(found) as Record<string, unknown>));
    };
    const onExit = (code: number | null) => done(() => reject(new Error(`sluice ${args[0]} exited ${code} before listening\nstdout: ${out}\nstderr: ${err}`)));
    const timer = setTimeout(() => done(() => reject(new Error(`sluice ${args[0]} not listening after ${START_MS} ms\nstdout: ${out}\nstderr: ${err}`))), START_MS);
    const done = (settle: () => void) => {
      clearTimeout(timer);
      p.stdout.off('data', onData);
      p.off('exit', onExit);
      settle();
    };
    p.stdout.on('data', onData);
    p.once('exit', onExit);
  });
  listening.catch(() => undefined); // read by the caller; a test that never asks must not see an unhandled rejection
  return { p, stdout: () => out, listening: <T>() => listening as Promise<T> };
}
