/**
 * `active-request-scorer` — scorer.
 *
 * Reads Sluice's own in-flight count per endpoint (`endpoint.inFlight`, incremented at dispatch and
 * released on completion/abort), so it reacts at once, unlike scraped metrics. With `max` the
 * largest count among the candidates:
 *   score = 1.0                                  if count ≤ idleThreshold
 *         = (max − count) / max × maxBusyScore   otherwise
 * so idle endpoints are preferred and the busiest scores 0.
 *
 * Parameters (defaults):
 * - `idleThreshold` 0 — integer ≥ 0; at or below it an endpoint counts as idle
 * - `maxBusyScore` 1.0 — in [0, 1]; the best score a busy endpoint can get
 * - `requestTimeout` — deprecated in llm-d and ignored; accepted so llm-d configs load unchanged
 * - `inFlightLoadProducerName` — llm-d's; accepted and ignored (Sluice keeps the in-flight counts itself)
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';

export const ACTIVE_REQUEST_SCORER_TYPE = 'active-request-scorer';

export const activeRequestScorerParams = z.strictObject({
  idleThreshold: z.number().int().min(0).default(0),
  maxBusyScore: z.number().min(0).max(1).default(1),
  requestTimeout: z.union([z.string(), z.number()]).optional(),
  inFlightLoadProducerName: z.string().optional(),
});

const ignoredTimeout = (p: ActiveRequestScorerParams) =>
  p.requestTimeout === undefined
    ? []
    : [{ parameter: 'requestTimeout', message: 'requestTimeout is ignored (deprecated in llm-d): a request counts until its answer ends or fails' }];

export type ActiveRequestScorerParams = z.infer<typeof activeRequestScorerParams>;

export class ActiveRequestScorer implements Scorer {
  readonly type = ACTIVE_REQUEST_SCORER_TYPE;
  private readonly idleThreshold: number;
  private readonly maxBusyScore: number;

  constructor(
    readonly name: string,
    params: ActiveRequestScorerParams,
  ) {
    this.idleThreshold = params.idleThreshold;
    this.maxBusyScore = params.maxBusyScore;
  }

  score(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    let max = 0;
    for (const endpoint of endpoints) if (endpoint.inFlight > max) max = endpoint.inFlight;
    for (let i = 0; i < endpoints.length; i++) {
      const count = endpoints[i]!.inFlight;
      // count > idleThreshold ≥ 0 implies max ≥ count > 0, so no division by zero.
      out[i] = count <= this.idleThreshold ? 1 : ((max - count) / max) * this.maxBusyScore;
    }
  }
}

export const activeRequestScorerDefinition: PluginDefinition<ActiveRequestScorerParams> = {
  type: ACTIVE_REQUEST_SCORER_TYPE,
  kinds: ['scorer'],
  params: activeRequestScorerParams,
  configWarnings: ignoredTimeout,
  create: (name, params) => new ActiveRequestScorer(name, params),
};
