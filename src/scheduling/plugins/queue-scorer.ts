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

export const QUEUE_SCORER_TYPE = 'queue-scorer';

export class QueueScorer implements Scorer {
  readonly type = QUEUE_SCORER_TYPE;
  constructor(readonly name: string) {}

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    let min = Infinity;
    let max = -Infinity;
    for (const endpoint of endpoints) {
      const m = endpoint.metrics;
      if (m === undefined) continue;
      if (m.waiting < min) min = m.waiting;
      if (m.waiting > max) max = m.waiting;
    }
    const range = max - min;
    for (let i = 0; i < endpoints.length; i++) {
      const m = endpoints[i]!.metrics;
      if (m === undefined) out[i] = 0;
      else out[i] = range > 0 ? (max - m.waiting) / range : 1;
    }
  }
}

export const queueScorerDefinition: PluginDefinition<Record<string, never>> = {
  type: QUEUE_SCORER_TYPE,
  kinds: ['scorer'],
  params: z.strictObject({}),
  create: (name) => new QueueScorer(name),
};
