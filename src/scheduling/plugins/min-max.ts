/**
 * Shared form of the load scorers (`queue-scorer`, `running-requests-size-scorer`):
 * score = `(max − v) / (max − min)` over the candidates that have metrics; all equal → 1; an
 * endpoint without metrics scores 0 (its load is unknown: treated as worst) and takes no part in
 * min/max.
 */
import type { Endpoint, EndpointMetrics } from '../../datalayer/endpoint.js';

export function scoreLowerIsBetter(
  endpoints: readonly Endpoint[],
  out: Float64Array,
  key: 'waiting' | 'running',
): void {
  let min = Infinity;
  let max = -Infinity;
  for (const endpoint of endpoints) {
    const m: EndpointMetrics | undefined = endpoint.metrics;
    if (m === undefined) continue;
    const v = m[key];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const range = max - min;
  for (let i = 0; i < endpoints.length; i++) {
    const m = endpoints[i]!.metrics;
    if (m === undefined) out[i] = 0;
    else out[i] = range > 0 ? (max - m[key]) / range : 1;
  }
}
