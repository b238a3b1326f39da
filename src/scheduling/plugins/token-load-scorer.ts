/**
 * `token-load-scorer` — scorer (llm-d): prefers the endpoint with the least prompt work ahead of
 * this request.
 *
 *   load  = endpoint.inFlightTokens + uncachedTokens(request, endpoint)
 *   score = 1 − min(load, queueThresholdTokens) / queueThresholdTokens      (1 when load is 0)
 *
 * `inFlightTokens` are the uncached prompt tokens Sluice has sent the endpoint whose answer has not
 * begun; `uncachedTokens` is what this request's prompt would add there, given what the
 * configured prefix-cache-scorer believes the endpoint caches (scheduling/prompt-load.ts).
 *
 * Parameters (defaults):
 * - `queueThresholdTokens` 4194304 — integer; the load that scores 0 (128 requests × 32K); ≤ 0 means
 *   the default, as in llm-d (with a warning)
 * - `inFlightLoadProducerName`, `nonTextTokenWeight` — llm-d's; accepted and unused here (Sluice
 *   counts the tokens itself, and estimates them from the prompt's characters)
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Plugin, Scorer, SchedulingRequest } from '../framework.js';
import { PrefixMatcherRef, uncachedTokens } from '../prompt-load.js';

export const TOKEN_LOAD_SCORER_TYPE = 'token-load-scorer';

const DEFAULT_QUEUE_THRESHOLD_TOKENS = 4_194_304;

export const tokenLoadScorerParams = z.strictObject({
  queueThresholdTokens: z.number().int().default(DEFAULT_QUEUE_THRESHOLD_TOKENS),
  inFlightLoadProducerName: z.string().optional(),
  nonTextTokenWeight: z.number().optional(),
});

export type TokenLoadScorerParams = z.infer<typeof tokenLoadScorerParams>;

/** The score of an endpoint with `load` tokens ahead of the request (exported for tests and docs). */
export function tokenLoadScore(load: number, threshold: number): number {
  if (load <= 0) return 1;
  return 1 - Math.min(load, threshold) / threshold;
}

export class TokenLoadScorer implements Scorer {
  readonly type = TOKEN_LOAD_SCORER_TYPE;
  private readonly threshold: number;
  private readonly matcher: PrefixMatcherRef;

  constructor(
    readonly name: string,
    params: TokenLoadScorerParams,
    plugins: ReadonlyMap<string, Plugin>,
  ) {
    this.threshold = params.queueThresholdTokens > 0 ? params.queueThresholdTokens : DEFAULT_QUEUE_THRESHOLD_TOKENS;
    this.matcher = new PrefixMatcherRef(plugins);
  }

  score(_ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    const matcher = this.matcher.get();
    for (let i = 0; i < endpoints.length; i++) {
      const endpoint = endpoints[i]!;
      out[i] = tokenLoadScore(endpoint.inFlightTokens + uncachedTokens(req, endpoint, matcher), this.threshold);
    }
  }
}

export const tokenLoadScorerDefinition: PluginDefinition<TokenLoadScorerParams> = {
  type: TOKEN_LOAD_SCORER_TYPE,
  kinds: ['scorer'],
  params: tokenLoadScorerParams,
  configWarnings: (params) =>
    params.queueThresholdTokens > 0
      ? []
      : [{ parameter: 'queueThresholdTokens', message: `queueThresholdTokens ${params.queueThresholdTokens} means the default, ${DEFAULT_QUEUE_THRESHOLD_TOKENS} (as in llm-d)` }],
  create: (name, params, deps) => new TokenLoadScorer(name, params, deps.plugins),
};
