/**
 * On-demand profiles of the running gateway, for the metrics port's `/debug/profile/cpu` and
 * `/debug/profile/heap` (what the EPP's `/debug/pprof` is to Go, in V8's own formats): no restart,
 * no flag, and no cost until asked. V8's profilers run in-process through `node:inspector` for the
 * requested seconds, while the gateway keeps serving.
 *
 * - cpu: V8's sampling CPU profiler (a sample every ms) → a `.cpuprofile` (Chrome DevTools,
 *   speedscope, `bench/flame.ts`).
 * - heap: V8's sampling heap profiler (one allocation every 32 KiB on average) → a `.heapprofile` of
 *   what was allocated during the window and is still alive at its end (Chrome DevTools, Memory):
 *   where memory that does not go away comes from.
 *
 * One profile at a time (a second is refused, not queued). A client that hangs up ends its
 * profile; a shutdown ends a running one when the metrics port closes: the answer carries what was
 * sampled so far.
 */
import { Session } from 'node:inspector/promises';

export type ProfileKind = 'cpu' | 'heap';

/** Another profile is being taken. */
export class ProfileBusyError extends Error {
  constructor(readonly running: ProfileKind) {
    super(`a ${running} profile is being taken already; ask again when it is done`);
  }
}

/** A profile of `seconds` may ask for this many at most (a longer window only grows the answer). */
export const MAX_PROFILE_SECONDS = 300;
const HEAP_SAMPLING_BYTES = 32 * 1024;

export class Profiler {
  private running: ProfileKind | undefined = undefined;
  /** Ends the running profile's window (set for the whole profile, set-up included). */
  private stop: AbortController | undefined = undefined;

  /**
   * Samples for `seconds`, or until `signal` aborts (the client hung up) or `stopAll` (a shutdown),
   * and returns the profile as V8 gives it.
   */
  async take(kind: ProfileKind, seconds: number, signal?: AbortSignal): Promise<object> {
    if (this.running !== undefined) throw new ProfileBusyError(this.running);
    this.running = kind;
    const stop = (this.stop = new AbortController());
    const ended = signal === undefined ? stop.signal : AbortSignal.any([stop.signal, signal]);
    let session: Session | undefined;
    try {
      session = new Session();
      session.connect();
      if (kind === 'cpu') {
        await session.post('Profiler.enable');
        await session.post('Profiler.start');
        await windowOf(seconds, ended);
        return (await session.post('Profiler.stop')).profile;
      }
      await session.post('HeapProfiler.enable');
      await session.post('HeapProfiler.startSampling', { samplingInterval: HEAP_SAMPLING_BYTES });
      await windowOf(seconds, ended);
      return (await session.post('HeapProfiler.stopSampling')).profile;
    } finally {
      this.running = undefined;
      this.stop = undefined;
      session?.disconnect();
    }
  }

  /** Ends a running profile now, even one still starting (its answer has what was sampled so far). */
  stopAll(): void {
    this.stop?.abort();
  }
}

/** Resolves after `seconds`, or at once when `ended` aborts (or has). */
function windowOf(seconds: number, ended: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    if (ended.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      ended.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, seconds * 1000);
    ended.addEventListener('abort', done);
  });
}
