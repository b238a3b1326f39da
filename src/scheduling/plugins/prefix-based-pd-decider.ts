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
 * `nonCachedTokens` 0 (the default) turns P/D off, as llm-d's decider does ("Prefix-based PD
 * disabled"; one intermediate llm-d version, and Sluice for a while, read it as always). The prefix
 * match comes from the first `prefix-cache-scorer` instance in the configuration (the one whose index
 * the decode profile scored with). Without one the decider answers decode-only and warns once (llm-d
 * logs an error for every request in that case).
 *
 * Parameters:
 * - `nonCachedTokens` 0 — int ≥ 0; 0 = never disaggregate (P/D off)
 * - `promptTokens` 0 — int ≥ 0; prompts shorter than this are never disaggregated (0 = no minimum), as llm-d
 * - `prefixMatchInfoProducerName` — llm-d's reference to its prefix producer; accepted, not needed
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition, PluginLogger } from '../../plugins/registry.js';
import type { CycleContext, Decider, Plugin, SchedulingRequest } from '../framework.js';
import { PrefixMatcherRef, promptTokensOf, uncachedTokensOf, type PrefixMatch } from '../prompt-load.js';

export const PREFIX_BASED_PD_DECIDER_TYPE = 'prefix-based-pd-decider';

export const prefixBasedPdDeciderParams = z.strictObject({
  nonCachedTokens: z.number().int().min(0).default(0),
  promptTokens: z.number().int().min(0).default(0),
  /** llm-d: the producer of the prefix match; here the first prefix-cache-scorer's index (above). */
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});

export type PrefixBasedPdDeciderParams = z.infer<typeof prefixBasedPdDeciderParams>;

/** Whether the prompt is long enough to be disaggregated at all (checked before asking the prefix index). */
function longEnough(promptChars: number, nonCachedTokens: number, promptTokens: number): boolean {
  const inputTokens = promptTokensOf(promptChars);
  return inputTokens >= nonCachedTokens && inputTokens >= promptTokens;
}

/** The decision rule alone (exported for tests and the docs' formula). */
export function shouldDisaggregate(promptChars: number, match: PrefixMatch | undefined, nonCachedTokens: number, promptTokens = 0): boolean {
  if (nonCachedTokens === 0 || !longEnough(promptChars, nonCachedTokens, promptTokens)) return false;
  return match !== undefined && uncachedTokensOf(promptChars, match) >= nonCachedTokens;
}

export class PrefixBasedPdDecider implements Decider {
  readonly type = PREFIX_BASED_PD_DECIDER_TYPE;
  readonly nonCachedTokens: number;
  readonly promptTokens: number;
  private readonly matcher: PrefixMatcherRef;

  /**
   * `plugins` is the live map of instantiated plugins: the prefix scorer may be declared after this
   * decider, so it is looked up at the first decision.
   */
  constructor(
    readonly name: string,
    params: PrefixBasedPdDeciderParams,
    plugins: ReadonlyMap<string, Plugin>,
    logger?: PluginLogger,
  ) {
    this.nonCachedTokens = params.nonCachedTokens;
    this.promptTokens = params.promptTokens;
    this.matcher = new PrefixMatcherRef(plugins, () =>
      logger?.warn({ decider: name }, 'prefix-based-pd-decider: no prefix-cache-scorer is configured, so every request is decode-only'),
    );
  }

  disaggregate(_ctx: CycleContext, req: SchedulingRequest, decode: Endpoint): boolean {
    const chars = req.promptText.length;
    // The rule is shouldDisaggregate's; the prefix index is asked only when it needs the match.
    const needsMatch = this.nonCachedTokens > 0 && longEnough(chars, this.nonCachedTokens, this.promptTokens);
    return shouldDisaggregate(chars, needsMatch ? this.matcher.get()?.prefixMatch(req, decode) : undefined, this.nonCachedTokens, this.promptTokens);
  }
}

export const prefixBasedPdDeciderDefinition: PluginDefinition<PrefixBasedPdDeciderParams> = {
  type: PREFIX_BASED_PD_DECIDER_TYPE,
  kinds: ['decider'],
  params: prefixBasedPdDeciderParams,
  // A decider declared and left at 0 is most likely meant to do something: say that it does not.
  configWarnings: (params) =>
    params.nonCachedTokens > 0
      ? []
      : [{ parameter: 'nonCachedTokens', message: 'nonCachedTokens 0 (the default) turns P/D off, as in llm-d: every request is served decode-only; set the uncached prompt tokens worth a prefill leg (e.g. 256)' }],
  create: (name, params, deps) => new PrefixBasedPdDecider(name, params, deps.plugins, deps.logger),
};
