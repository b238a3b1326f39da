/**
 * How much prompt work a request brings to an endpoint, without a tokenizer (llm-d's estimate):
 *
 *   promptTokens   = floor(len(promptText) / 4)
 *   uncachedTokens = max(0, promptTokens − matchedBlocks(endpoint) × blockSizeTokens)
 *
 * `matchedBlocks` comes from a prefix matcher: a plugin that can say how many leading blocks of a
 * request an endpoint caches (the prefix-cache-scorer). Without one, nothing counts as cached. The
 * framework, the proxy and the plugins that weigh prefill work (decider, token-load scorer,
 * affinity filter) all reckon with these two functions, so they agree.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Plugin, SchedulingRequest } from './framework.js';

/** Characters per token of the estimate (llm-d's, and the prefix index's block size unit). */
export const CHARS_PER_TOKEN = 4;

/** What one endpoint is believed to cache of one request's prompt. */
export interface PrefixMatch {
  matchedBlocks: number;
  totalBlocks: number;
  /** Tokens per block (estimated at CHARS_PER_TOKEN characters per token). */
  blockSizeTokens: number;
}

/** A plugin that knows which prompt prefixes each endpoint caches. */
export interface PrefixMatcher {
  prefixMatch(req: SchedulingRequest, endpoint: Endpoint): PrefixMatch;
}

export const isPrefixMatcher = (p: object): p is PrefixMatcher & Plugin =>
  typeof (p as PrefixMatcher).prefixMatch === 'function';

/** A plugin keeping an approximate prefix index (its size is `llm_d_epp_prefix_indexer_size`). */
export interface PrefixIndexer {
  /** (endpoint, block) entries remembered. */
  prefixIndexerSize(): number;
}

export const isPrefixIndexer = (p: object): p is PrefixIndexer & Plugin =>
  typeof (p as PrefixIndexer).prefixIndexerSize === 'function';

/** The first prefix matcher among the plugins (configuration order), if any. */
export function findPrefixMatcher(plugins: Iterable<Plugin>): (PrefixMatcher & Plugin) | undefined {
  for (const plugin of plugins) if (isPrefixMatcher(plugin)) return plugin;
  return undefined;
}

/** Estimated prompt tokens of a prompt of `promptChars` characters. */
export function promptTokensOf(promptChars: number): number {
  return Math.floor(promptChars / CHARS_PER_TOKEN);
}

/** Prompt tokens `match`'s endpoint would have to compute (all of them without a match). */
export function uncachedTokensOf(promptChars: number, match: PrefixMatch | undefined): number {
  const prompt = promptTokensOf(promptChars);
  if (match === undefined) return prompt;
  return Math.max(0, prompt - match.matchedBlocks * match.blockSizeTokens);
}

/** Prompt tokens `endpoint` would have to compute for `req`, asking `matcher` what it caches. */
export function uncachedTokens(req: SchedulingRequest, endpoint: Endpoint, matcher: PrefixMatcher | undefined): number {
  return uncachedTokensOf(req.promptText.length, matcher?.prefixMatch(req, endpoint));
}

/**
 * A plugin's lazy lookup of the configured prefix matcher: the matcher may be declared after the
 * plugin, so it is found at first use; `onMissing` runs once when there is none (e.g. a warning).
 */
export class PrefixMatcherRef {
  private matcher: PrefixMatcher | undefined;
  private looked = false;

  constructor(
    private readonly plugins: ReadonlyMap<string, Plugin>,
    private readonly onMissing?: () => void,
  ) {}

  get(): PrefixMatcher | undefined {
    if (!this.looked) {
      this.looked = true;
      this.matcher = findPrefixMatcher(this.plugins.values());
      if (this.matcher === undefined) this.onMissing?.();
    }
    return this.matcher;
  }
}
