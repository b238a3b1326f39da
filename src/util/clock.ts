/** Time and chance are injected so TTLs, staleness and tie-breaks are testable without sleeping. */
export interface Clock {
  /** Milliseconds on an epoch scale, for ages and deadlines: never steps back (see systemClock). */
  now(): number;
}

/**
 * The process start's wall-clock time plus the monotonic time since: it reads like Date.now() but
 * does not jump when the system clock is stepped, so a queue TTL or a latency cannot be stretched,
 * cut short or made negative by an NTP correction.
 */
export const systemClock: Clock = { now: () => performance.timeOrigin + performance.now() };

/** Longest delay Node's timers honour (2^31 − 1 ms, ~596 h); a longer one fires at once. */
export const MAX_TIMER_DELAY_MS = 2_147_483_647;

/** A source of uniform numbers in [0, 1), like Math.random. */
export type RandomSource = () => number;

/** Deterministic PRNG (mulberry32) for tests and reproducible benchmarks. */
export function seededRandom(seed: number): RandomSource {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A clock tests move by hand. */
export class ManualClock implements Clock {
  constructor(private t = 1_000_000) {}
  now(): number {
    return this.t;
  }
  advance(ms: number): void {
    this.t += ms;
  }
  set(ms: number): void {
    this.t = ms;
  }
}
