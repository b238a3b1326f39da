/**
 * `queue-scorer` — scorer.
 *
 * Score = `(maxQ − q) / (maxQ − minQ)` over the candidates; when all candidates have the same q
 * every one scores 1. An endpoint with no metrics yet scores 0 (treated as worst: its queue is
 * unknown) and does not take part in min/max.
 *
 * q (Sluice, `slotAware: true`) = the queue a request sent now would join (`Endpoint.queueAhead`):
 * the scraped waiting queue (`vllm:num_requests_waiting`), plus one when no running slot is free,
 * counting what Sluice sent and saw finish since the scrape. Why: llm-d's q, the waiting queue
 * alone, is 0 for a server with a free slot and for a full one alike, so among the servers that
 * cache a prompt it cannot see which would start it at once, and requests queue inside a full
 * server while its neighbour has room. The waiting part stays the scraped one: reckoning it too
 * (as `utilization-detector` does) made the affinity look-ahead's probe see a prompt's own server
 * as worse under overload, and more requests went where the prompt was not cached.
 * `false` → q = the waiting queue, as llm-d.
 *
 * Parameters (defaults):
 * - `slotAware` true — Sluice addition, above
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';
import { scoreLowerIsBetter, type LoadOf } from './min-max.js';

export const QUEUE_SCORER_TYPE = 'queue-scorer';

const queueAhead: LoadOf = (endpoint) => endpoint.queueAhead();
const scrapedWaiting: LoadOf = (_endpoint, m) => m.waiting;

export class QueueScorer implements Scorer {
  readonly type = QUEUE_SCORER_TYPE;
  private readonly load: LoadOf;
  constructor(
    readonly name: string,
    slotAware = true,
  ) {
    this.load = slotAware ? queueAhead : scrapedWaiting;
  }

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    scoreLowerIsBetter(endpoints, out, this.load);
  }
}

const params = z.strictObject({ slotAware: z.boolean().default(true) });

export const queueScorerDefinition: PluginDefinition<z.infer<typeof params>> = {
  type: QUEUE_SCORER_TYPE,
  kinds: ['scorer'],
  params,
  create: (name, p) => new QueueScorer(name, p.slotAware),
};
