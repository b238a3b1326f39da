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
 * works, keeps the numbers it had when the engine stopped (often an idle server's: it hung on the
 * batch it was about to start). So an endpoint that owes work (its page shows requests running, or
 * Sluice sent it requests whose answer has not begun) while its page has not changed at all for
 * `stallTimeout` (work counters `EndpointMetrics.progress`, running, waiting, KV usage) is set aside
 * too ("stalled"), until a page changes or it owes nothing. A working engine changes its page every
 * step: tokens generated, KV blocks filled by a prefill chunk. A page without work counters
 * (trtllm-serve) is never read as stalled.
 *
 * Its requests in flight would wait for the upstream time-outs (10 minutes for an answer to begin),
 * as would those of a server gone silent (its scrapes got no answer at all for the silence window:
 * its node down, its process frozen, or cut off from the gateway). With `rescueInFlight`, each one
 * the server has said nothing of for that long (`stallTimeout`; the silence window) is given up on
 * (Pool.rescueStuck): sent to another server when nothing of it reached the client yet, else ended
 * with a 504.
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
  rescueInFlight: true,
});

/**
 * A page scraped at `now`: `moved` when any of its numbers (work counters, running, waiting, KV
 * usage) differ from the last page's, `owed` when the endpoint has work it should be doing (the
 * page shows requests running, or Sluice sent it requests whose answer has not begun). Returns for
 * how long (ms) it has owed work with a page that has not moved, and updates `state.progressAt`, the
 * last instant it moved or owed nothing.
 */
export function stalledMs(state: { progressAt: number }, moved: boolean, owed: boolean, now: number): number {
  if (moved || !owed) {
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
 * else 0, and updates `state`. `ejectedNow`: endpoints of its stage (of `stageSize`) set aside at `now`.
 */
export function recordFailure(policy: OutlierPolicy, state: OutlierState, now: number, ejectedNow: number, stageSize: number): number {
  // Detection off: nothing is counted, so turning it on later starts from clean runs.
  if (policy.consecutiveFailures === 0) return 0;
  state.failureStreak++;
  if (state.failureStreak < policy.consecutiveFailures) return 0;
  // Requests already in flight when it was ejected fail too: they do not lengthen the ejection.
  if (state.ejectedUntil > now) return 0;
  if (ejectedNow >= maxEjected(policy, stageSize)) return 0;
  state.ejections++;
  const ms = ejectionTime(policy, state.ejections);
  state.ejectedUntil = now + ms;
  return ms;
}

/** A whole 2xx answer: the endpoint works, whatever it did before (an ejection under way runs out). */
export function recordSuccess(state: OutlierState): void {
  state.failureStreak = 0;
  state.ejections = 0;
}
