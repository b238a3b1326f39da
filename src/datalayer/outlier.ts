/**
 * Outlier detection (passive health checking, as Envoy's `consecutive_5xx` and Linkerd's failure
 * accrual): an endpoint whose requests fail one after another is set aside ("ejected") for a while,
 * so that a server that answers every request at once with an error — its engine dead, its
 * `/metrics` still healthy — does not draw the traffic its empty queue invites.
 *
 * A failure is any upstream error Sluice counts in `sluice_endpoint_upstream_errors_total`: a 5xx
 * answer, a time-out, a connection refused, lost or cut. A whole 2xx answer ends the run of failures
 * and the run of ejections; a 4xx answer (the request's fault) and a client that leaves count
 * neither way.
 *
 * After `consecutiveFailures` failures in a row, the endpoint is ejected for `baseEjectionTime`,
 * doubled for each ejection in a row, at most `maxEjectionTime`. When that time is up it is on
 * probation: one request at a time (Pool.eligible), and its run of failures is not reset, so that
 * probe's failure ejects it again at once ("half-open"), and its success clears both runs. At most
 * `maxEjectionPercent` of a stage's endpoints (rounded down) are out at once: past that, failing
 * endpoints keep serving, as a tier that fails everywhere is better answered with the servers' own
 * errors than with none.
 *
 * A hung engine fails nothing: its requests never end, and its page, served by a process that still
 * works, keeps showing the requests it ran when it stopped. So an endpoint whose page shows requests
 * running while its work counters (`EndpointMetrics.progress`) have not moved for `stallTimeout` is
 * set aside too ("stalled"), until a page shows them move or nothing running. No vLLM engine step
 * takes that long; a page without such counters is never read as stalled.
 *
 * Pure: plain data in, plain data out; the Pool applies it.
 */
import type { OutlierDetectionConfig } from '../config/types.js';

export type OutlierPolicy = OutlierDetectionConfig;

export const DEFAULT_OUTLIER_POLICY: OutlierPolicy = Object.freeze({
  consecutiveFailures: 5,
  baseEjectionTime: 5_000,
  maxEjectionTime: 300_000,
  maxEjectionPercent: 50,
  stallTimeout: 30_000,
});

/** What a page says about an endpoint's progress, as Pool.recordScrape keeps it. */
export interface ProgressState {
  lastProgress: number | undefined;
  progressAt: number;
}

/**
 * A page scraped at `now` with `running` requests running and work counters at `progress`: updates
 * `state` and returns for how long (ms) the endpoint has run requests without progress (0 when it
 * progressed, ran nothing, or its page has no work counters).
 */
export function stalledMs(state: ProgressState, running: number, progress: number | undefined, now: number): number {
  if (progress === undefined || running === 0 || progress !== state.lastProgress) {
    state.lastProgress = progress;
    state.progressAt = now;
    return 0;
  }
  return now - state.progressAt;
}

/** What the pool tracks per endpoint for outlier detection. */
export interface OutlierState {
  /** Failed requests since the last 2xx answer. */
  failureStreak: number;
  /** Ejections since the last 2xx answer (the backoff's exponent). */
  ejections: number;
  /** Clock time (ms) until which the endpoint is set aside; 0 = not ejected. */
  ejectedUntil: number;
}

/** How long the `times`-th ejection in a row lasts (times ≥ 1). */
export function ejectionTime(policy: OutlierPolicy, times: number): number {
  // 2^(times−1) without overflow to Infinity for a long run of ejections.
  const doublings = Math.min(times - 1, 30);
  return Math.min(policy.maxEjectionTime, policy.baseEjectionTime * 2 ** doublings);
}

/** Endpoints that may be ejected at once in a stage of `size` endpoints. */
export function maxEjected(policy: OutlierPolicy, size: number): number {
  return Math.floor((size * policy.maxEjectionPercent) / 100);
}

/**
 * A failed request on an endpoint: returns the ejection's length (ms) when this failure ejects it,
 * else 0, and updates `state`. `ejectedNow`: endpoints of its stage set aside at `now`, of `poolSize`.
 */
export function recordFailure(policy: OutlierPolicy, state: OutlierState, now: number, ejectedNow: number, poolSize: number): number {
  // Detection off: nothing is counted, so turning it on later starts from clean runs.
  if (policy.consecutiveFailures === 0) return 0;
  state.failureStreak++;
  if (state.failureStreak < policy.consecutiveFailures) return 0;
  // Requests already in flight when it was ejected fail too: they do not lengthen the ejection.
  if (state.ejectedUntil > now) return 0;
  if (ejectedNow >= maxEjected(policy, poolSize)) return 0;
  state.ejections++;
  const ms = ejectionTime(policy, state.ejections);
  state.ejectedUntil = now + ms;
  return ms;
}

/** A 2xx answer: the endpoint works, whatever it did before (an ejection under way runs out). */
export function recordSuccess(state: OutlierState): void {
  state.failureStreak = 0;
  state.ejections = 0;
}
