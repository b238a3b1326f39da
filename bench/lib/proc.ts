/**
 * Process handling shared by the benchmarks: every child runs in its own process group (so a
 * multi-process child such as nginx master + workers is stopped as a whole), is registered here,
 * and `stopAll()` ends them all (SIGTERM, then SIGKILL to the group). `installCleanup()` makes
 * SIGINT/SIGTERM and fatal errors go through it; the pids are also written to a file so the next
 * run can stop leftovers of a run that was killed with SIGKILL (only processes we recorded, and
 * only if their command line still matches).
 *
 * Node children get `--import bench/lib/orphan-guard.ts`: they exit by themselves when their parent
 * (this bench) is gone.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { closeSync, mkdirSync, openSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createNetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const HOST = '127.0.0.1';
export const BENCH_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_ROOT = resolve(BENCH_DIR, '..');
export const ORPHAN_GUARD = join(BENCH_DIR, 'lib', 'orphan-guard.ts');
/** One file per bench process (several benches may run at once): the children it started. */
const PID_DIR = join(tmpdir(), 'sluice-bench-pids');
const PID_FILE = join(PID_DIR, `${process.pid}.pids`);

export interface Managed {
  name: string;
  child: ChildProcess;
  logFile: string;
}

const managed: Managed[] = [];

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}

function recordPids(): void {
  const lines = managed
    .filter((m) => m.child.pid !== undefined && !exited(m.child))
    .map((m) => `${m.child.pid}\t${cmdline(m.child.pid!)}`);
  try {
    if (lines.length === 0) rmSync(PID_FILE, { force: true });
    else {
      mkdirSync(PID_DIR, { recursive: true });
      writeFileSync(PID_FILE, lines.join('\n') + '\n');
    }
  } catch {
    // best effort
  }
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
  } catch {
    return '';
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Stops the process groups that benches which died without cleaning up (SIGKILL) left behind:
 * only pid files whose owning bench process is gone, and only children whose command line still
 * matches what was recorded. Benches running right now are left alone.
 */
export function reapLeftovers(): number {
  let names: string[];
  try {
    names = readdirSync(PID_DIR).filter((f) => f.endsWith('.pids'));
  } catch {
    return 0;
  }
  let n = 0;
  for (const name of names) {
    const owner = Number(name.slice(0, -'.pids'.length));
    if (!Number.isInteger(owner) || owner === process.pid || alive(owner)) continue;
    const file = join(PID_DIR, name);
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      const [pidText, cmd] = line.split('\t');
      const pid = Number(pidText);
      if (!Number.isInteger(pid) || pid <= 1 || !cmd) continue;
      if (cmdline(pid) !== cmd) continue;
      try {
        process.kill(-pid, 'SIGKILL');
        n++;
      } catch {
        // gone
      }
    }
    rmSync(file, { force: true });
  }
  return n;
}

/** Starts `command` in its own process group with stdout/stderr to `logFile` (or piped when logFile is ''). */
export function startProcess(name: string, command: string, args: string[], logFile: string, opts: SpawnOptions = {}): Managed {
  let child: ChildProcess;
  if (logFile === '') {
    child = spawn(command, args, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'], detached: true, ...opts });
  } else {
    const fd = openSync(logFile, 'a');
    child = spawn(command, args, { cwd: REPO_ROOT, stdio: ['ignore', fd, fd], detached: true, ...opts });
    closeSync(fd);
  }
  const entry = { name, child, logFile };
  managed.push(entry);
  child.on('exit', () => recordPids());
  recordPids();
  return entry;
}

/** Node + tsx + the orphan guard (+ `preloads`, TypeScript allowed), running a TypeScript file. */
export function startNode(name: string, script: string, args: string[], logFile: string, nodeFlags: string[] = [], preloads: string[] = [], env?: NodeJS.ProcessEnv): Managed {
  const imports = [ORPHAN_GUARD, ...preloads].flatMap((p) => ['--import', p]);
  return startProcess(name, process.execPath, [...nodeFlags, '--import', 'tsx', ...imports, script, ...args], logFile, env ? { env: { ...process.env, ...env } } : {});
}

export const MEM_PROBE = join(BENCH_DIR, 'lib', 'mem-probe.ts');

export interface MemSnapshot {
  rss: number;
  heapUsed: number;
  heapTotal: number;
  external: number;
  arrayBuffers: number;
  gc: boolean;
}

/** Asks a process started with MEM_PROBE (and BENCH_MEM_FILE=file) for a post-GC memory snapshot. */
export async function memSnapshot(m: Managed, file: string, timeoutMs = 10_000): Promise<MemSnapshot | undefined> {
  if (m.child.pid === undefined || exited(m.child)) return undefined;
  const before = Date.now();
  try {
    process.kill(m.child.pid, 'SIGUSR2');
  } catch {
    return undefined;
  }
  const deadline = before + timeoutMs;
  while (Date.now() < deadline) {
    await sleep(50);
    try {
      const j = JSON.parse(readFileSync(file, 'utf8')) as MemSnapshot & { at: number };
      if (j.at >= before) return j;
    } catch {
      // not written yet
    }
  }
  return undefined;
}

/** Stops one managed process (group): SIGTERM, up to `graceMs`, then SIGKILL. */
export async function stopProcess(m: Managed, graceMs = 3000): Promise<void> {
  if (!exited(m.child)) {
    signalGroup(m.child, 'SIGTERM');
    const deadline = Date.now() + graceMs;
    while (!exited(m.child) && Date.now() < deadline) await sleep(25);
  }
  signalGroup(m.child, 'SIGKILL'); // also reaches workers whose master is gone
  const i = managed.indexOf(m);
  if (i >= 0) managed.splice(i, 1);
  recordPids();
}

export async function stopAll(): Promise<void> {
  const all = [...managed];
  await Promise.all(all.map((m) => stopProcess(m)));
  managed.length = 0;
  recordPids();
}

let cleanupInstalled = false;
const cleanupHooks: Array<() => void> = [];

/** Extra synchronous cleanup (temp dirs) to run on exit. */
export function onCleanup(fn: () => void): void {
  cleanupHooks.push(fn);
}

function runHooks(): void {
  for (const fn of cleanupHooks.splice(0)) {
    try {
      fn();
    } catch {
      // best effort
    }
  }
}

/** SIGINT/SIGTERM → stop everything and exit 130; a last synchronous SIGKILL on process exit. */
export function installCleanup(): void {
  if (cleanupInstalled) return;
  cleanupInstalled = true;
  const onSignal = (signal: NodeJS.Signals): void => {
    console.error(`\n${signal}: stopping every process this bench started`);
    void stopAll().finally(() => {
      runHooks();
      process.exit(130);
    });
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  process.on('exit', () => {
    for (const m of managed) signalGroup(m.child, 'SIGKILL');
    recordPids();
    runHooks();
  });
}

export function logTail(file: string, lines = 20): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createNetServer();
    server.once('error', reject);
    server.listen(0, HOST, () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

/** Polls `url` until it answers 200, the process exits, or the time runs out. */
export async function waitForOk(url: string, timeoutMs: number, proc?: Managed): Promise<{ ok: true } | { ok: false; reason: string }> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer yet';
  while (Date.now() < deadline) {
    if (proc !== undefined && exited(proc.child)) {
      return { ok: false, reason: `${proc.name} exited (code ${proc.child.exitCode ?? proc.child.signalCode}) before it was ready` };
    }
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
      await res.arrayBuffer();
      if (res.status === 200) return { ok: true };
      last = `HTTP ${res.status}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(100);
  }
  return { ok: false, reason: `not ready after ${timeoutMs / 1000} s (last: ${last})` };
}

/** Resident set size of a process in bytes (Linux /proc), or NaN. */
export function rssBytes(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : NaN;
  } catch {
    return NaN;
  }
}

/** User and system CPU time of a process in seconds (Linux /proc), or NaN for each. */
export function cpuTimes(pid: number | undefined): { user: number; sys: number } {
  if (pid === undefined) return { user: NaN, sys: NaN };
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime, stime in clock ticks (USER_HZ 100)
    return { user: Number(fields[11]) / 100, sys: Number(fields[12]) / 100 };
  } catch {
    return { user: NaN, sys: NaN };
  }
}

/** CPU time (user + system) of a process in seconds (Linux /proc), or NaN. */
export function cpuSeconds(pid: number | undefined): number {
  const t = cpuTimes(pid);
  return t.user + t.sys;
}

/**
 * Scheduler statistics of a process's main thread (Linux /proc/PID/schedstat): time on a CPU and
 * time runnable but waiting for one, in ms; undefined when unavailable. For Node the main thread
 * is the event loop, so the waiting time is latency the machine, not the process, added.
 */
export function schedStat(pid: number | undefined): { cpuMs: number; waitMs: number } | undefined {
  if (pid === undefined) return undefined;
  try {
    const [cpuNs, waitNs] = readFileSync(`/proc/${pid}/schedstat`, 'utf8').trim().split(' ').map(Number);
    return cpuNs !== undefined && waitNs !== undefined && Number.isFinite(cpuNs) && Number.isFinite(waitNs)
      ? { cpuMs: cpuNs / 1e6, waitMs: waitNs / 1e6 }
      : undefined;
  } catch {
    return undefined;
  }
}
