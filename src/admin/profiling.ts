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
 * One profile at a time (a second is refused, not queued). A shutdown ends a running profile at
 * once: the answer carries what was sampled so far.
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
  private stopEarly: (() => void) | undefined = undefined;

  /** Samples for `seconds` (or until `stopAll`) and returns the profile as V8 gives it. */
  async take(kind: ProfileKind, seconds: number): Promise<object> {
    if (this.running !== undefined) throw new ProfileBusyError(this.running);
    this.running = kind;
    const session = new Session();
    try {
      session.connect();
      if (kind === 'cpu') {
        await session.post('Profiler.enable');
        await session.post('Profiler.start');
        await this.wait(seconds);
        return (await session.post('Profiler.stop')).profile;
      }
      await session.post('HeapProfiler.enable');
      await session.post('HeapProfiler.startSampling', { samplingInterval: HEAP_SAMPLING_BYTES });
      await this.wait(seconds);
      return (await session.post('HeapProfiler.stopSampling')).profile;
    } finally {
      this.running = undefined;
      this.stopEarly = undefined;
      session.disconnect();
    }
  }

  /** Ends a running profile now (its answer has what was sampled so far). */
  stopAll(): void {
    this.stopEarly?.();
  }

  private wait(seconds: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, seconds * 1000);
      this.stopEarly = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }
}
