/**
 * Shared form of the load scorers (`queue-scorer`, `running-requests-size-scorer`):
 * score = `(max − v) / (max − min)` over the candidates that have metrics; all equal → 1; an
 * endpoint without metrics scores 0 (its load is unknown: treated as worst) and takes no part in
 * min/max.
 */
import type { Endpoint, EndpointMetrics } from '../../datalayer/endpoint.js';

/** The load of an endpoint that has metrics. */
export type LoadOf = (endpoint: Endpoint, metrics: EndpointMetrics) => number;

export function scoreLowerIsBetter(endpoints: readonly Endpoint[], out: Float64Array, load: LoadOf): void {
  let min = Infinity;
  let max = -Infinity;
  // First pass writes each load into `out` (NaN = no metrics), so it is computed once.
  for (let i = 0; i < endpoints.length; i++) {
    const endpoint = endpoints[i]!;
    const m = endpoint.metrics;
    if (m === undefined) {
      out[i] = NaN;
      continue;
    }
    const v = load(endpoint, m);
    out[i] = v;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const range = max - min;
  for (let i = 0; i < endpoints.length; i++) {
    const v = out[i]!;
    out[i] = Number.isNaN(v) ? 0 : range > 0 ? (max - v) / range : 1;
  }
}
