/**
 * `load-aware-scorer` — scorer (llm-d).
 *
 * Score from the scraped waiting queue q (`vllm:num_requests_waiting`), against a threshold t:
 *   score = 0.5                         when q = 0
 *         = 0.5 × (1 − min(q, t) / t)   otherwise
 * so an endpoint with an empty queue scores 0.5 and one with t or more waiting scores 0 (llm-d keeps
 * the upper half for endpoints with spare capacity, which its metrics cannot show). An endpoint
 * with no metrics yet scores 0 (unknown is treated as worst, as `queue-scorer` does).
 *
 * Parameters (defaults):
 * - `threshold` 128 — integer; ≤ 0 is read as 128 with a warning (as llm-d does)
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';

export const LOAD_AWARE_SCORER_TYPE = 'load-aware-scorer';
const DEFAULT_THRESHOLD = 128;

export class LoadAwareScorer implements Scorer {
  readonly type = LOAD_AWARE_SCORER_TYPE;
  private readonly threshold: number;
  constructor(
    readonly name: string,
    threshold: number,
  ) {
    this.threshold = threshold > 0 ? threshold : DEFAULT_THRESHOLD;
  }

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    for (let i = 0; i < endpoints.length; i++) {
      const m = endpoints[i]!.metrics;
      if (m === undefined) out[i] = 0;
      else out[i] = m.waiting === 0 ? 0.5 : 0.5 * (1 - Math.min(m.waiting, this.threshold) / this.threshold);
    }
  }
}

const params = z.strictObject({ threshold: z.number().int().default(DEFAULT_THRESHOLD) });

export const loadAwareScorerDefinition: PluginDefinition<z.infer<typeof params>> = {
  type: LOAD_AWARE_SCORER_TYPE,
  kinds: ['scorer'],
  params,
  configWarnings: (p) =>
    p.threshold > 0 ? [] : [{ parameter: 'threshold', message: `threshold ${p.threshold} is not positive: read as ${DEFAULT_THRESHOLD} (as llm-d does)` }],
  create: (name, p) => new LoadAwareScorer(name, p.threshold),
};
