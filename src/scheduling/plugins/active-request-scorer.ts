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
 *   (out of range, either is read as its default with a warning, as llm-d does)
 * - `requestTimeout` — deprecated in llm-d and ignored; accepted so llm-d configs load unchanged
 * - `inFlightLoadProducerName` — llm-d's; accepted and ignored (Sluice keeps the in-flight counts itself)
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginConfigWarning, PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';

export const ACTIVE_REQUEST_SCORER_TYPE = 'active-request-scorer';

const DEFAULT_IDLE_THRESHOLD = 0;
const DEFAULT_MAX_BUSY_SCORE = 1;
const idleThresholdOf = (p: ActiveRequestScorerParams): number => (p.idleThreshold >= 0 ? p.idleThreshold : DEFAULT_IDLE_THRESHOLD);
const maxBusyScoreOf = (p: ActiveRequestScorerParams): number => (p.maxBusyScore >= 0 && p.maxBusyScore <= 1 ? p.maxBusyScore : DEFAULT_MAX_BUSY_SCORE);

export const activeRequestScorerParams = z.strictObject({
  idleThreshold: z.number().int().default(DEFAULT_IDLE_THRESHOLD),
  maxBusyScore: z.number().default(DEFAULT_MAX_BUSY_SCORE),
  requestTimeout: z.union([z.string(), z.number()]).optional(),
  inFlightLoadProducerName: z.string().optional(),
});

const warnings = (p: ActiveRequestScorerParams): PluginConfigWarning[] => [
  ...(p.requestTimeout === undefined
    ? []
    : [{ parameter: 'requestTimeout', message: 'requestTimeout is ignored (deprecated in llm-d): a request counts until its answer ends or fails' }]),
  ...(idleThresholdOf(p) === p.idleThreshold
    ? []
    : [{ parameter: 'idleThreshold', message: `idleThreshold ${p.idleThreshold} is negative: read as ${DEFAULT_IDLE_THRESHOLD} (as llm-d does)` }]),
  ...(maxBusyScoreOf(p) === p.maxBusyScore
    ? []
    : [{ parameter: 'maxBusyScore', message: `maxBusyScore ${p.maxBusyScore} is outside [0, 1]: read as ${DEFAULT_MAX_BUSY_SCORE} (as llm-d does)` }]),
];

export type ActiveRequestScorerParams = z.infer<typeof activeRequestScorerParams>;

export class ActiveRequestScorer implements Scorer {
  readonly type = ACTIVE_REQUEST_SCORER_TYPE;
  private readonly idleThreshold: number;
  private readonly maxBusyScore: number;

  constructor(
    readonly name: string,
    params: ActiveRequestScorerParams,
  ) {
    this.idleThreshold = idleThresholdOf(params);
    this.maxBusyScore = maxBusyScoreOf(params);
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
  configWarnings: warnings,
  create: (name, params) => new ActiveRequestScorer(name, params),
};
