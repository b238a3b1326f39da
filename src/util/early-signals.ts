/**
 * Signal handlers for the start-up, installed by the entry module before anything else is loaded.
 *
 * Why: loading the code takes a few hundred milliseconds, and a process that is PID 1 in its
 * container (node as the image's ENTRYPOINT, no init) has no default action for a signal: a
 * SIGTERM in that window would be dropped, and the pod would wait out its whole termination grace
 * period. Until a command installs its own handlers (and calls `releaseEarlySignals`), SIGTERM and
 * SIGINT end the process as their default action would (exit 128 + the signal's number: 143, 130;
 * nothing has been served yet), and SIGHUP is ignored: the configuration about to be read is the
 * newest one anyway.
 */
const EXIT_CODES: Partial<Record<NodeJS.Signals, number>> = { SIGTERM: 143, SIGINT: 130 };

const exitOn = (signal: NodeJS.Signals): void => process.exit(EXIT_CODES[signal]);
const ignore = (): void => undefined;
let installed = false;

export function installEarlySignals(): void {
  if (installed) return;
  installed = true;
  process.on('SIGTERM', exitOn);
  process.on('SIGINT', exitOn);
  process.on('SIGHUP', ignore);
}

/** A command's own handlers are in place: the start-up ones go (a no-op when none were installed). */
export function releaseEarlySignals(): void {
  if (!installed) return;
  installed = false;
  process.off('SIGTERM', exitOn);
  process.off('SIGINT', exitOn);
  process.off('SIGHUP', ignore);
}
