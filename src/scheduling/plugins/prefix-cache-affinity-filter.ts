/**
 * `prefix-cache-affinity-filter` — filter (llm-d): keeps a prompt on the endpoints that cache it,
 * unless they are so busy that starting elsewhere would be faster ("sticky until saturated").
 *
 *   affinity(e) = matchedBlocks(e) / totalBlocks          (the configured prefix-cache-scorer's index)
 *   sticky      = { e : affinity(e) ≥ affinityThreshold }
 *   ttftMs(e)   = e.inFlightTokens / peakPrefillThroughput × 1000   (prompt tokens ahead of it, as llm-d)
 *   keep sticky, unless no endpoint is sticky, or
 *        min ttftMs(sticky) − min ttftMs(others) > maxTTFTPenaltyMs              (when > 0), or
 *        min inFlightTokens(sticky) − min inFlightTokens(others) > maxTokensInFlightPenalty   (when > 0)
 *   (then keep all); else, with maxInFlightRequestsDelta > 0 (llm-d's request gate):
 *     requestMs(e) = ttftMs(e) + (totalBlocks − matchedBlocks(e)) × blockSizeTokens / peakPrefillThroughput × 1000
 *     within = { other e : requestMs(e) − min requestMs(sticky) ≤ maxTTFTPenaltyMs }
 *     keep sticky ∪ within when min inFlight(sticky) − min inFlight(within) > maxInFlightRequestsDelta
 *     (inFlight: requests the gateway has outstanding there, decoding ones included)
 *
 * With probability `explorationProbability` the gate is skipped and all endpoints are kept. With
 * one candidate, or `affinityThreshold` 0, it keeps all. With every gate at 0 it always sticks.
 * Each decision (but a flow-control look-ahead probe's) is counted in
 * `llm_d_epp_prefix_cache_affinity_filter_decisions_total{plugin_name, outcome}` (sticky, no_match,
 * load_override, request_load_override, exploration, not_applicable).
 *
 * Parameters (defaults):
 * - `affinityThreshold` 0.80 — in [0, 1]
 * - `explorationProbability` 0 — in [0, 1]
 * - `maxTTFTPenaltyMs` 18000 — ≥ 0 (0 = no time gate)
 * - `maxTokensInFlightPenalty` 0 — integer ≥ 0, the same gate in tokens (an earlier llm-d form; 0 = off)
 * - `maxInFlightRequestsDelta` 0 — integer ≥ 0, the request gate above (0 = off)
 * - `peakPrefillThroughput` 15928 — ≥ 0, prompt tokens per second one endpoint prefills (must be
 *   > 0 when `maxTTFTPenaltyMs` > 0)
 * - `ttftSource` "prefillThroughput" — the only source here (llm-d's `latencyPredictor` needs its
 *   latency predictor, which Sluice does not have)
 * - `penaltySource` "constant" — the only one here (llm-d's `sessionCost` is not implemented)
 * - `prefixMatchInfoProducerName`, `inFlightLoadProducerName`, `latencyPredictionInfoProducerName`
 *   — llm-d's producer references; accepted, not needed
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition, PluginLogger } from '../../plugins/registry.js';
import type { CycleContext, Filter, Plugin, SchedulingRequest } from '../framework.js';
import { PrefixMatcherRef } from '../prompt-load.js';

export const PREFIX_CACHE_AFFINITY_FILTER_TYPE = 'prefix-cache-affinity-filter';

export const prefixCacheAffinityFilterParams = z
  .strictObject({
    affinityThreshold: z.number().min(0).max(1).default(0.8),
    explorationProbability: z.number().min(0).max(1).default(0),
    maxTTFTPenaltyMs: z.number().min(0).default(18_000),
    maxTokensInFlightPenalty: z.number().int().min(0).default(0),
    maxInFlightRequestsDelta: z.number().int().min(0).default(0),
    peakPrefillThroughput: z.number().min(0).default(15_928),
    ttftSource: z
      .literal('prefillThroughput', {
        error: 'only "prefillThroughput" is supported (llm-d\'s "latencyPredictor" needs a latency predictor, which Sluice does not have)',
      })
      .default('prefillThroughput'),
    penaltySource: z
      .literal('constant', { error: 'only "constant" is supported (llm-d\'s "sessionCost" is not implemented in Sluice)' })
      .default('constant'),
    prefixMatchInfoProducerName: z.string().optional(),
    inFlightLoadProducerName: z.string().optional(),
    latencyPredictionInfoProducerName: z.string().optional(),
  })
  .refine((p) => p.maxTTFTPenaltyMs === 0 || p.peakPrefillThroughput > 0, {
    path: ['peakPrefillThroughput'],
    message: 'peakPrefillThroughput must be > 0 when maxTTFTPenaltyMs is > 0',
  });

export type PrefixCacheAffinityFilterParams = z.infer<typeof prefixCacheAffinityFilterParams>;

export type AffinityOutcome = 'sticky' | 'no_match' | 'load_override' | 'request_load_override' | 'exploration' | 'not_applicable';

/** Counts each decision (the gateway's metrics; a no-op in unit tests). */
export type AffinityDecisionRecorder = (pluginName: string, outcome: AffinityOutcome) => void;

export class PrefixCacheAffinityFilter implements Filter {
  readonly type = PREFIX_CACHE_AFFINITY_FILTER_TYPE;
  private readonly threshold: number;
  private readonly exploration: number;
  private readonly maxPenaltyMs: number;
  private readonly maxPenaltyTokens: number;
  private readonly maxRequestsDelta: number;
  private readonly msPerToken: number;
  private readonly matcher: PrefixMatcherRef;
  /** The outcome of the last decision (for tests and the debug log). */
  lastOutcome: AffinityOutcome | undefined = undefined;

  constructor(
    readonly name: string,
    params: PrefixCacheAffinityFilterParams,
    plugins: ReadonlyMap<string, Plugin>,
    private readonly record: AffinityDecisionRecorder = () => {},
    logger?: PluginLogger,
  ) {
    this.threshold = params.affinityThreshold;
    this.exploration = params.explorationProbability;
    this.maxPenaltyMs = params.maxTTFTPenaltyMs;
    this.maxPenaltyTokens = params.maxTokensInFlightPenalty;
    this.maxRequestsDelta = params.maxInFlightRequestsDelta;
    this.msPerToken = params.peakPrefillThroughput > 0 ? 1000 / params.peakPrefillThroughput : 0;
    this.matcher = new PrefixMatcherRef(plugins, () =>
      logger?.warn({ plugin: name }, 'prefix-cache-affinity-filter: no prefix-cache-scorer is configured, so no endpoint is ever sticky'),
    );
  }

  filter(ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[]): Endpoint[] {
    if (endpoints.length <= 1 || this.threshold <= 0) return this.decide(ctx, 'not_applicable', endpoints);
    // A probe neither explores (it would spend the random source) nor counts.
    if (this.exploration > 0 && !ctx.probe && ctx.random() < this.exploration) return this.decide(ctx, 'exploration', endpoints);
    const matcher = this.matcher.get();
    if (matcher === undefined) return this.decide(ctx, 'no_match', endpoints);

    const requestGate = this.maxRequestsDelta > 0;
    const sticky: Endpoint[] = [];
    // The least prompt work (tokens in flight) ahead of a request among the sticky endpoints and the
    // others; for the request gate, when the request would start on each (its own blocks counted).
    let leastSticky = Infinity;
    let leastOther = Infinity;
    let bestStickyMs = Infinity;
    const others: Endpoint[] = [];
    const othersMs: number[] = [];
    for (const endpoint of endpoints) {
      const match = matcher.prefixMatch(req, endpoint);
      const ahead = endpoint.inFlightTokens;
      const requestMs = (ahead + (match.totalBlocks - match.matchedBlocks) * match.blockSizeTokens) * this.msPerToken;
      if (match.totalBlocks > 0 && match.matchedBlocks / match.totalBlocks >= this.threshold) {
        sticky.push(endpoint);
        if (ahead < leastSticky) leastSticky = ahead;
        if (requestMs < bestStickyMs) bestStickyMs = requestMs;
      } else {
        if (ahead < leastOther) leastOther = ahead;
        if (requestGate) {
          others.push(endpoint);
          othersMs.push(requestMs);
        }
      }
    }
    if (sticky.length === 0) return this.decide(ctx, 'no_match', endpoints);
    if (sticky.length < endpoints.length) {
      const extra = leastSticky - leastOther;
      const tooSlow = this.maxPenaltyMs > 0 && extra * this.msPerToken > this.maxPenaltyMs;
      if (tooSlow || (this.maxPenaltyTokens > 0 && extra > this.maxPenaltyTokens)) return this.decide(ctx, 'load_override', endpoints);
      if (requestGate) {
        // The others where the request would start at most maxTTFTPenaltyMs later than on the best sticky one.
        const within = others.filter((_, i) => othersMs[i]! - bestStickyMs <= this.maxPenaltyMs);
        if (within.length > 0 && leastInFlight(sticky) - leastInFlight(within) > this.maxRequestsDelta) {
          return this.decide(ctx, 'request_load_override', sticky.concat(within));
        }
      }
    }
    return this.decide(ctx, 'sticky', sticky);
  }

  private decide(ctx: CycleContext, outcome: AffinityOutcome, kept: readonly Endpoint[]): Endpoint[] {
    if (!ctx.probe) {
      this.lastOutcome = outcome;
      this.record(this.name, outcome);
    }
    return kept as Endpoint[];
  }
}

function leastInFlight(endpoints: readonly Endpoint[]): number {
  let least = Infinity;
  for (const endpoint of endpoints) if (endpoint.inFlight < least) least = endpoint.inFlight;
  return least;
}

export const prefixCacheAffinityFilterDefinition: PluginDefinition<PrefixCacheAffinityFilterParams> = {
  type: PREFIX_CACHE_AFFINITY_FILTER_TYPE,
  kinds: ['filter'],
  params: prefixCacheAffinityFilterParams,
  create: (name, params, deps) =>
    new PrefixCacheAffinityFilter(
      name,
      params,
      deps.plugins,
      deps.decisionCounter?.(PREFIX_CACHE_AFFINITY_FILTER_TYPE, 'Prefix cache affinity filter decisions, by plugin instance and outcome.'),
      deps.logger,
    ),
};
