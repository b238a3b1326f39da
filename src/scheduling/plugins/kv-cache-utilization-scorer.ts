/**
 * `kv-cache-utilization-scorer` — scorer (no parameters).
 *
 * Score = `1 − kvUsage` (`vllm:kv_cache_usage_perc`, a fraction). An endpoint with no metrics yet
 * scores 0 (unknown is treated as full).
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';

export const KV_CACHE_UTILIZATION_SCORER_TYPE = 'kv-cache-utilization-scorer';

export class KvCacheUtilizationScorer implements Scorer {
  readonly type = KV_CACHE_UTILIZATION_SCORER_TYPE;
  constructor(readonly name: string) {}

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    for (let i = 0; i < endpoints.length; i++) {
      const m = endpoints[i]!.metrics;
      out[i] = m === undefined ? 0 : 1 - m.kvUsage;
    }
  }
}

export const kvCacheUtilizationScorerDefinition: PluginDefinition<Record<string, never>> = {
  type: KV_CACHE_UTILIZATION_SCORER_TYPE,
  kinds: ['scorer'],
  params: z.strictObject({}),
  create: (name) => new KvCacheUtilizationScorer(name),
};

/** `kv-cache-scorer`: the GIE's older name of this scorer (its example configurations still use it); runs as it, with a warning. */
export const kvCacheScorerDefinition: PluginDefinition<Record<string, never>> = {
  ...kvCacheUtilizationScorerDefinition,
  type: 'kv-cache-scorer',
  configWarnings: () => [{ message: `kv-cache-scorer is the GIE's older name of ${KV_CACHE_UTILIZATION_SCORER_TYPE}, and runs as it; rename the type` }],
};
