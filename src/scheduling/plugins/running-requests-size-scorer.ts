/**
 * `running-requests-size-scorer` — scorer (no parameters).
 *
 * Score = `(maxR − r) / (maxR − minR)` where r is the endpoint's running batch
 * (`vllm:num_requests_running`) and min/max are taken over the candidates; when all candidates
 * run the same number every one scores 1. An endpoint with no metrics yet scores 0 (treated as
 * worst: its load is unknown) and does not take part in min/max. Same form as `queue-scorer`.
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';
import { scoreLowerIsBetter, type LoadOf } from './min-max.js';

export const RUNNING_REQUESTS_SIZE_SCORER_TYPE = 'running-requests-size-scorer';

const running: LoadOf = (_endpoint, m) => m.running;

export class RunningRequestsSizeScorer implements Scorer {
  readonly type = RUNNING_REQUESTS_SIZE_SCORER_TYPE;
  constructor(readonly name: string) {}

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    scoreLowerIsBetter(endpoints, out, running);
  }
}

export const runningRequestsSizeScorerDefinition: PluginDefinition<Record<string, never>> = {
  type: RUNNING_REQUESTS_SIZE_SCORER_TYPE,
  kinds: ['scorer'],
  params: z.strictObject({}),
  create: (name) => new RunningRequestsSizeScorer(name),
};
