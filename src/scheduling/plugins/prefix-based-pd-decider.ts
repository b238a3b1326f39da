/**
 * `prefix-based-pd-decider` — decider (P/D: should this prompt be prefilled on another endpoint?).
 *
 * Estimates, without a tokenizer, how much of the prompt the already chosen decode endpoint would
 * have to compute itself, and disaggregates when that is at least `nonCachedTokens` (llm-d):
 *
 *   inputTokens  = floor(len(promptText) / 4)        (chat: the messages JSON as sent; completions: the prompt)
 *   cachedTokens = matchedBlocks(decode) × blockSizeTokens     (from the prefix-cache-scorer's index)
 *   disaggregate ⇔ nonCachedTokens > 0 ∧ inputTokens ≥ max(nonCachedTokens, promptTokens)
 *                  ∧ inputTokens − cachedTokens ≥ nonCachedTokens
 *
 * The prefix match comes from the first `prefix-cache-scorer` instance in the configuration (the
 * one whose index the decode profile scored with). Without one the decider answers decode-only and
 * warns once (llm-d logs an error for every request in that case).
 *
 * Parameters:
 * - `nonCachedTokens` 0 — int ≥ 0; 0 = never disaggregate
 * - `promptTokens` 0 — int ≥ 0; prompts shorter than this are never disaggregated (0 = no minimum)
 * - `prefixMatchInfoProducerName` — llm-d's reference to its prefix producer; accepted, not needed
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition, PluginLogger } from '../../plugins/registry.js';
import type { CycleContext, Decider, Plugin, SchedulingRequest } from '../framework.js';
import type { PrefixMatch } from './prefix-cache-scorer.js';

export const PREFIX_BASED_PD_DECIDER_TYPE = 'prefix-based-pd-decider';

const CHARS_PER_TOKEN = 4;

export const prefixBasedPdDeciderParams = z.strictObject({
  nonCachedTokens: z.number().int().min(0).default(0),
  promptTokens: z.number().int().min(0).default(0),
  /** llm-d: the producer of the prefix match; here the first prefix-cache-scorer's index (above). */
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});

export type PrefixBasedPdDeciderParams = z.infer<typeof prefixBasedPdDeciderParams>;

/** What the decider needs from a prefix-cache plugin. */
export interface PrefixMatcher {
  prefixMatch(req: SchedulingRequest, endpoint: Endpoint): PrefixMatch;
}

const isPrefixMatcher = (p: object): p is PrefixMatcher & Plugin =>
  typeof (p as PrefixMatcher).prefixMatch === 'function';

/** Whether the prompt is long enough to be disaggregated at all (checked before asking the prefix index). */
function longEnough(promptChars: number, nonCachedTokens: number, promptTokens: number): boolean {
  const inputTokens = Math.floor(promptChars / CHARS_PER_TOKEN);
  return nonCachedTokens > 0 && inputTokens >= nonCachedTokens && inputTokens >= promptTokens;
}

/** The decision rule alone (exported for tests and the docs' formula). */
export function shouldDisaggregate(promptChars: number, match: PrefixMatch | undefined, nonCachedTokens: number, promptTokens = 0): boolean {
  if (match === undefined || !longEnough(promptChars, nonCachedTokens, promptTokens)) return false;
  const cachedTokens = match.matchedBlocks * match.blockSizeTokens;
  return Math.floor(promptChars / CHARS_PER_TOKEN) - cachedTokens >= nonCachedTokens;
}

export class PrefixBasedPdDecider implements Decider {
  readonly type = PREFIX_BASED_PD_DECIDER_TYPE;
  readonly nonCachedTokens: number;
  readonly promptTokens: number;
  private matcher: PrefixMatcher | undefined;
  private warned = false;

  /**
   * `plugins` is the live map of instantiated plugins: the prefix scorer may be declared after this
   * decider, so it is looked up at the first decision.
   */
  constructor(
    readonly name: string,
    params: PrefixBasedPdDeciderParams,
    private readonly plugins: ReadonlyMap<string, Plugin>,
    private readonly logger?: PluginLogger,
  ) {
    this.nonCachedTokens = params.nonCachedTokens;
    this.promptTokens = params.promptTokens;
  }

  disaggregate(_ctx: CycleContext, req: SchedulingRequest, decode: Endpoint): boolean {
    if (!longEnough(req.promptText.length, this.nonCachedTokens, this.promptTokens)) return false;
    const matcher = this.resolveMatcher();
    if (matcher === undefined) return false;
    return shouldDisaggregate(req.promptText.length, matcher.prefixMatch(req, decode), this.nonCachedTokens, this.promptTokens);
  }

  private resolveMatcher(): PrefixMatcher | undefined {
    if (this.matcher !== undefined) return this.matcher;
    for (const plugin of this.plugins.values()) {
      if (isPrefixMatcher(plugin)) {
        this.matcher = plugin;
        return plugin;
      }
    }
    if (!this.warned) {
      this.warned = true;
      this.logger?.warn(
        { decider: this.name },
        'prefix-based-pd-decider: no prefix-cache-scorer is configured, so every request is decode-only',
      );
    }
    return undefined;
  }
}

export const prefixBasedPdDeciderDefinition: PluginDefinition<PrefixBasedPdDeciderParams> = {
  type: PREFIX_BASED_PD_DECIDER_TYPE,
  kinds: ['decider'],
  params: prefixBasedPdDeciderParams,
  create: (name, params, deps) => new PrefixBasedPdDecider(name, params, deps.plugins, deps.logger),
};
