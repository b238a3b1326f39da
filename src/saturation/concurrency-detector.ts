/**
 * `concurrency-detector` — saturation detector and filter (kinds: filter, saturationDetector),
 * reference §3.3. Reads the load Sluice itself has outstanding per endpoint, so it reacts at once
 * (no scrape lag) and is never stale.
 *
 * Load per endpoint: requests = `endpoint.inFlight`; tokens = `endpoint.inFlightTokens`, the
 * uncached prompt tokens sent to it whose answer has not begun (llm-d's in-flight tokens, counted
 * by the proxy; scheduling/prompt-load.ts).
 *
 * Saturation (N endpoints; empty list → 1.0, fail closed; never clamped; `stale` always 0):
 * - `requests`: `Σ requests / (N × maxConcurrency)`
 * - `tokens`:   `Σ tokens / (N × maxTokenConcurrency)`
 * - `hybrid`:   mean over endpoints of `max(requests / maxConcurrency, tokens / maxTokenConcurrency)`
 *
 * Filter (SPEC §7.2): `reqLimit = floor(maxConcurrency × (1 + headroom))`, `tokLimit =
 * floor(maxTokenConcurrency × (1 + headroom))`; keep an endpoint iff its load is below the limit of
 * the active mode (hybrid: below both). If none survives, all are returned (fail open, as llm-d
 * #2883 and the utilization detector; llm-d at the snapshot returned an empty list).
 *
 * Parameters (defaults):
 * - `concurrencyMode` "requests" — `requests` | `tokens` | `hybrid`
 * - `maxConcurrency` 100 — integer > 0, requests per endpoint
 * - `maxTokenConcurrency` 1000000 — integer > 0, tokens per endpoint
 * - `headroom` 0 — ≥ 0, a fraction of burst allowance for the filter (> 1 logs a warning)
 * - `tokensPerRequest` — deprecated and ignored (a Sluice addition from before it counted tokens)
 * - `inFlightLoadProducerName` — optional string, accepted for llm-d config compatibility and
 *   ignored (Sluice keeps the in-flight counters itself)
 */
import { z } from 'zod';
import type { Endpoint } from '../datalayer/endpoint.js';
import type { PluginDefinition } from '../plugins/registry.js';
import type { CycleContext, SchedulingRequest } from '../scheduling/framework.js';
import { headroomWarnings, type SaturationDetector, type SaturationReading } from './detector.js';

export const CONCURRENCY_DETECTOR_TYPE = 'concurrency-detector';

export const concurrencyDetectorParams = z.strictObject({
  concurrencyMode: z.enum(['requests', 'tokens', 'hybrid']).default('requests'),
  maxConcurrency: z.number().int().positive().default(100),
  maxTokenConcurrency: z.number().int().positive().default(1_000_000),
  headroom: z.number().min(0).default(0),
  tokensPerRequest: z.number().positive().optional(),
  inFlightLoadProducerName: z.string().optional(),
});

export type ConcurrencyDetectorParams = z.infer<typeof concurrencyDetectorParams>;
export type ConcurrencyMode = ConcurrencyDetectorParams['concurrencyMode'];

export class ConcurrencyDetector implements SaturationDetector {
  readonly type = CONCURRENCY_DETECTOR_TYPE;
  readonly mode: ConcurrencyMode;
  readonly maxConcurrency: number;
  readonly maxTokenConcurrency: number;
  readonly requestLimit: number;
  readonly tokenLimit: number;

  constructor(
    readonly name: string,
    params: ConcurrencyDetectorParams,
  ) {
    this.mode = params.concurrencyMode;
    this.maxConcurrency = params.maxConcurrency;
    this.maxTokenConcurrency = params.maxTokenConcurrency;
    // Truncated like llm-d's int64 conversion, so a limit is a whole count.
    this.requestLimit = Math.floor(params.maxConcurrency * (1 + params.headroom));
    this.tokenLimit = Math.floor(params.maxTokenConcurrency * (1 + params.headroom));
  }

  saturation(_now: number, endpoints: readonly Endpoint[]): SaturationReading {
    const n = endpoints.length;
    if (n === 0) return { value: 1, stale: 0 };
    let sum = 0;
    switch (this.mode) {
      case 'requests':
        for (const endpoint of endpoints) sum += endpoint.inFlight;
        return { value: sum / (n * this.maxConcurrency), stale: 0 };
      case 'tokens':
        for (const endpoint of endpoints) sum += endpoint.inFlightTokens;
        return { value: sum / (n * this.maxTokenConcurrency), stale: 0 };
      case 'hybrid':
        // Per endpoint first, so an endpoint saturated on either dimension counts as such.
        for (const endpoint of endpoints) {
          sum += Math.max(endpoint.inFlight / this.maxConcurrency, endpoint.inFlightTokens / this.maxTokenConcurrency);
        }
        return { value: sum / n, stale: 0 };
    }
  }

  private belowLimit(endpoint: Endpoint): boolean {
    switch (this.mode) {
      case 'requests':
        return endpoint.inFlight < this.requestLimit;
      case 'tokens':
        return endpoint.inFlightTokens < this.tokenLimit;
      case 'hybrid':
        return endpoint.inFlight < this.requestLimit && endpoint.inFlightTokens < this.tokenLimit;
    }
  }

  filter(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[]): Endpoint[] {
    const kept = endpoints.filter((endpoint) => this.belowLimit(endpoint));
    // Fail open (SPEC §7.2): flow control does the gating; refusing here would turn load into 429s.
    return kept.length === 0 ? endpoints.slice() : kept;
  }
}

export const concurrencyDetectorDefinition: PluginDefinition<ConcurrencyDetectorParams> = {
  type: CONCURRENCY_DETECTOR_TYPE,
  kinds: ['filter', 'saturationDetector'],
  params: concurrencyDetectorParams,
  configWarnings: (params) => [
    ...headroomWarnings(params),
    ...(params.tokensPerRequest === undefined
      ? []
      : [{ parameter: 'tokensPerRequest', message: 'tokensPerRequest is ignored: Sluice counts the prompt tokens in flight on each endpoint' }]),
  ],
  create: (name, params) => new ConcurrencyDetector(name, params),
};
