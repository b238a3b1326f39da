/**
 * `queue-scorer` — scorer (no parameters).
 *
 * Score = `(maxQ − q) / (maxQ − minQ)` where q is the endpoint's waiting queue
 * (`vllm:num_requests_waiting`) and min/max are taken over the candidates; when all candidates
 * have the same queue every one scores 1. An endpoint with no metrics yet scores 0 (treated as
 * worst: its queue is unknown) and does not take part in min/max.
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';
import { scoreLowerIsBetter } from './min-max.js';

export const QUEUE_SCORER_TYPE = 'queue-scorer';

export class QueueScorer implements Scorer {
  readonly type = QUEUE_SCORER_TYPE;
  constructor(readonly name: string) {}

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    scoreLowerIsBetter(endpoints, out, 'waiting');
  }
}

export const queueScorerDefinition: PluginDefinition<Record<string, never>> = {
  type: QUEUE_SCORER_TYPE,
  kinds: ['scorer'],
  params: z.strictObject({}),
  create: (name) => new QueueScorer(name),
};
