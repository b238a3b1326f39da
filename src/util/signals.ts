/**
 * Process signals (SPEC §1, §3.7): SIGINT/SIGTERM drain and exit 0 (2 if the drain fails), a second
 * one exits 2 at once (the drain did not finish: SPEC §1's runtime failure; 1 means bad config or arguments); SIGHUP reloads the configuration when the process has one to reload.
 *
 * The handlers are installed *before* the gateway starts listening: a signal's default action
 * kills the process, and a SIGHUP sent as soon as the gateway says it is listening must not. A
 * signal that arrives before the gateway is up is held and acted on once it is (`ready`).
 */
import { releaseEarlySignals } from './early-signals.js';

export interface SignalActions {
  /** Graceful drain; the process exits when it settles. */
  stop(): Promise<void>;
  /** Reload the configuration (SIGHUP). */
  reload?(): void;
}

/** The part of `process` this uses, so the logic is tested without sending real signals. */
export interface SignalTarget {
  on(signal: NodeJS.Signals, listener: () => void): unknown;
  exit(code: number): void;
}

type Log = { info(o: object, m?: string): void; warn(o: object, m?: string): void };

export interface SignalOptions {
  /** Catch SIGHUP (to reload); otherwise it keeps its default action (the demo ends with its terminal). */
  hangup?: boolean;
  target?: SignalTarget;
}

export function handleSignals(logger: Log, opts: SignalOptions = {}): { ready(actions: SignalActions): void } {
  const proc = opts.target ?? process;
  let actions: SignalActions | undefined;
  let stopSignal: string | undefined;
  let reloadHeld = false;

  const stop = (a: SignalActions, signal: string) => {
    logger.info({ signal }, 'draining');
    a.stop().then(
      () => proc.exit(0),
      () => proc.exit(2),
    );
  };
  const onStop = (signal: string) => {
    if (stopSignal !== undefined) {
      logger.warn({ signal }, 'second signal: exiting now, without finishing the drain');
      proc.exit(2);
      return;
    }
    stopSignal = signal;
    if (actions) stop(actions, signal);
  };
  proc.on('SIGINT', () => onStop('SIGINT'));
  proc.on('SIGTERM', () => onStop('SIGTERM'));
  if (proc === process) releaseEarlySignals();
  if (opts.hangup) {
    proc.on('SIGHUP', () => {
      if (stopSignal !== undefined) return; // draining: nothing to reload into
      if (actions) actions.reload?.();
      else reloadHeld = true;
    });
  }

  return {
    ready(a) {
      actions = a;
      if (stopSignal !== undefined) stop(a, stopSignal);
      else if (reloadHeld) a.reload?.();
    },
  };
}
