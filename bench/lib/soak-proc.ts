/**
 * Child processes of the soak, kept apart from lib/proc.ts's shared registry: proc.ts records the
 * pids of every bench in one file (/tmp/sluice-bench.pids) that `npm run bench` reaps (SIGKILL) at
 * start-up — a suite started while a soak runs would kill the soak's gateway mid-run. The soak's
 * children are registered here only; each runs in its own process group with
 * lib/orphan-guard.ts preloaded (it exits by itself once the soak is gone, even after a SIGKILL).
 *
 * `installSoakCleanup()` stops every child on SIGINT/SIGTERM and (SIGKILL to the groups) on exit.
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { ORPHAN_GUARD, REPO_ROOT, exited, sleep, type Managed } from './proc.js';

const children: Managed[] = [];
const hooks: Array<() => void> = [];

function signalGroup(m: Managed, signal: NodeJS.Signals): void {
  if (m.child.pid === undefined) return;
  try {
    process.kill(-m.child.pid, signal);
  } catch {
    // already gone
  }
}

/** `node [nodeFlags] --import tsx --import orphan-guard [--import preloads] script args`, output to logFile. */
export function startSoakNode(
  name: string,
  script: string,
  args: string[],
  logFile: string,
  nodeFlags: string[] = [],
  preloads: string[] = [],
  env?: NodeJS.ProcessEnv,
): Managed {
  const imports = [ORPHAN_GUARD, ...preloads].flatMap((p) => ['--import', p]);
  const fd = openSync(logFile, 'a');
  try {
    const child = spawn(process.execPath, [...nodeFlags, '--import', 'tsx', ...imports, script, ...args], {
      cwd: REPO_ROOT,
      stdio: ['ignore', fd, fd],
      detached: true,
      env: env ? { ...process.env, ...env } : process.env,
    });
    const m: Managed = { name, child, logFile };
    children.push(m);
    return m;
  } finally {
    closeSync(fd);
  }
}

/** SIGTERM to the group, up to `graceMs`, then SIGKILL; `crash` skips straight to SIGKILL. */
export async function stopSoakProcess(m: Managed, graceMs = 3000, crash = false): Promise<void> {
  if (!crash && !exited(m.child)) {
    signalGroup(m, 'SIGTERM');
    const deadline = Date.now() + graceMs;
    while (!exited(m.child) && Date.now() < deadline) await sleep(25);
  }
  signalGroup(m, 'SIGKILL');
  const deadline = Date.now() + 2000;
  while (!exited(m.child) && Date.now() < deadline) await sleep(25);
  const i = children.indexOf(m);
  if (i >= 0) children.splice(i, 1);
}

export async function stopAllSoak(): Promise<void> {
  await Promise.all([...children].map((m) => stopSoakProcess(m)));
}

/** Synchronous cleanup (temp dirs) run at exit, after the children are gone. */
export function onSoakExit(fn: () => void): void {
  hooks.push(fn);
}

function runHooks(): void {
  for (const fn of hooks.splice(0)) {
    try {
      fn();
    } catch {
      // best effort
    }
  }
}

let installed = false;

export function installSoakCleanup(): void {
  if (installed) return;
  installed = true;
  const onSignal = (signal: NodeJS.Signals): void => {
    console.error(`\n${signal}: stopping every process the soak started`);
    void stopAllSoak().finally(() => {
      runHooks();
      process.exit(130);
    });
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  process.on('exit', () => {
    for (const m of children) signalGroup(m, 'SIGKILL');
    runHooks();
  });
}
