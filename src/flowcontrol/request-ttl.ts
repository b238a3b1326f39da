/**
 * `x-llm-d-inference-ttl` (llm-d's admission): a client's own queue TTL, as a Go duration
 * ("1500ms", "2s", "1m30s"). It may only shorten a finite `defaultRequestTTL`; where that is 0
 * (wait for ever) a positive header sets one. It counts while the pool has endpoints:
 * `noEndpointRequestTTL` alone bounds the wait for an empty pool (a scale-from-zero waiting room).
 */
import { parseDuration } from '../config/units.js';

export const REQUEST_TTL_HEADER = 'x-llm-d-inference-ttl';

/** The header in milliseconds; missing, malformed, zero or negative → undefined (the configured TTL applies). */
export function parseRequestTtlHeader(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  let ms: number;
  try {
    ms = parseDuration(value.trim());
  } catch {
    return undefined;
  }
  return ms > 0 ? ms : undefined;
}

/** The queue TTL of a request while the pool has endpoints: the configured one, shortened (or set, where it is 0) by the client's. */
export function effectiveRequestTtl(configuredMs: number, requestMs: number | undefined): number {
  if (requestMs === undefined) return configuredMs;
  return configuredMs > 0 ? Math.min(configuredMs, requestMs) : requestMs;
}
