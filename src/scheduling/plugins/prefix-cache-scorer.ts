/**
 * `prefix-cache-scorer` — scorer and PreRequest hook (approximate prefix-cache affinity).
 *
 * The prompt text (SchedulingRequest.promptText) is cut into blocks of blockSizeTokens × 4
 * characters and hashed as a chain seeded by the model name and the body's `cache_salt` (see
 * prefix-index.ts). Score = `w × min(1, matched × blockSizeTokens / matchLengthScaleTokens)²
 * + (1 − w) × matched / total`, with w = `matchLengthWeight` (default 0: the plain ratio of leading
 * blocks the endpoint is believed to cache); 0 when the prompt is shorter than one block.
 * After scheduling, preRequest() teaches the index the request's blocks on the primary target and on
 * the P/D prefill pick whatever its profile is called (without a P/D decision: the target of a
 * profile literally named `prefill`, as llm-d), last block first, so that under
 * pressure a prompt's tail is forgotten before its head (as vLLM evicts). Endpoints that left the
 * pool are purged at most every 2 minutes. Before learning, the primary target's expected hit goes
 * to `llm_d_epp_prefix_indexer_hit_ratio` / `_hit_bytes`; the index's entries are
 * `llm_d_epp_prefix_indexer_size` (llm-d's names and labels).
 *
 * Parameters (defaults, llm-d/GIE compatible):
 * - `autoTune` true — per-endpoint LRU capacity from `vllm:cache_config_info` when known:
 *   num_gpu_blocks × block_size tokens, in blocks of blockSizeTokens
 * - `blockSizeTokens` 16 — tokens per block (≈ 4 characters per token)
 * - `maxPrefixTokensToMatch` 131072 — tokens matched at most: max blocks = tokens / blockSizeTokens;
 *   takes precedence over `maxPrefixBlocksToMatch` unless 0 (llm-d)
 * - `maxPrefixBlocksToMatch` 2048 — blocks hashed at most when `maxPrefixTokensToMatch` is 0
 *   (deprecated in llm-d; 0 = unlimited). Set while the token window applies, it is ignored with a warning
 * - `lruCapacityPerServer` 31250 — blocks remembered per endpoint (when not auto-tuned)
 * - `blockSize` — deprecated: read as `blockSizeTokens` when that is left at 16 (llm-d's code; GIE's
 *   documentation called it characters), with a warning
 * - `matchLengthWeight` 0 — in [0, 1]; weight of the absolute match-length term
 * - `matchLengthScaleTokens` 8192 — > 0; matched tokens at which the length term saturates
 * - `prefixMatchInfoProducerName` — llm-d's reference to an `approx-prefix-cache-producer`, whose
 *   parameters the loader merges into this scorer (its own values win)
 */
import { z } from 'zod';
import { didYouMean } from '../../config/schema.js';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginConfigWarning, PluginDefinition, PoolView } from '../../plugins/registry.js';
import type { Clock } from '../../util/clock.js';
import type {
  CycleContext,
  Plugin,
  PreRequest,
  Scorer,
  SchedulingRequest,
  SchedulingResult,
} from '../framework.js';
import { blockHashes, hashString, PrefixIndex, type PrefixHashOptions } from '../prefix-index.js';
import { CHARS_PER_TOKEN, type PrefixIndexer, type PrefixMatch, type PrefixMatcher } from '../prompt-load.js';

export const PREFIX_CACHE_SCORER_TYPE = 'prefix-cache-scorer';

/** Profile whose target also learns the blocks when no P/D decision names one (hard-coded in llm-d). */
const PREFILL_PROFILE_NAME = 'prefill';
const PURGE_INTERVAL_MS = 120_000;

/** llm-d's default window: the first 131 072 tokens of a prompt are matched. */
export const DEFAULT_MAX_PREFIX_TOKENS = 131_072;

/** The prefix index's parameters (also those of llm-d's `approx-prefix-cache-producer`). */
export const prefixIndexParamsShape = {
  autoTune: z.boolean().default(true),
  blockSizeTokens: z.number().int().positive().default(16),
  maxPrefixTokensToMatch: z.number().int().min(0).optional(),
  maxPrefixBlocksToMatch: z.number().int().min(0).optional(),
  lruCapacityPerServer: z.number().int().positive().default(31250),
  blockSize: z.number().int().positive().optional(),
};

/** llm-d's block cap, consulted only when `maxPrefixTokensToMatch` is 0. */
const DEFAULT_MAX_PREFIX_BLOCKS = 2048;
const DEFAULT_BLOCK_SIZE_TOKENS = 16;

/**
 * The match window and block size as llm-d resolves them: the token window (default 131 072) wins
 * unless 0; the block count is kept only where the user wrote it or where it decides (token window
 * 0), so configWarnings can tell an ignored one. A deprecated `blockSize` becomes blockSizeTokens
 * when that is at its default.
 */
export function resolveMatchWindow<P extends { blockSizeTokens: number; blockSize?: number; maxPrefixBlocksToMatch?: number; maxPrefixTokensToMatch?: number }>(
  p: P,
): P & { maxPrefixTokensToMatch: number } {
  const maxPrefixTokensToMatch = p.maxPrefixTokensToMatch ?? DEFAULT_MAX_PREFIX_TOKENS;
  const resolved = { ...p, maxPrefixTokensToMatch };
  if (maxPrefixTokensToMatch === 0) resolved.maxPrefixBlocksToMatch = p.maxPrefixBlocksToMatch ?? DEFAULT_MAX_PREFIX_BLOCKS;
  if (p.blockSize !== undefined && p.blockSizeTokens === DEFAULT_BLOCK_SIZE_TOKENS) resolved.blockSizeTokens = p.blockSize;
  return resolved;
}

/** What the prefix index's parameters resolved to that the user may not expect (deprecated keys). */
export function matchWindowWarnings(p: z.infer<z.ZodObject<typeof prefixIndexParamsShape>> & { maxPrefixTokensToMatch: number }): PluginConfigWarning[] {
  const warnings: PluginConfigWarning[] = [];
  if (p.maxPrefixTokensToMatch > 0 && p.maxPrefixBlocksToMatch !== undefined) {
    warnings.push({
      parameter: 'maxPrefixBlocksToMatch',
      whereWritten: true,
      message: `ignored: maxPrefixTokensToMatch (${p.maxPrefixTokensToMatch} tokens) takes precedence, as in llm-d; set maxPrefixTokensToMatch: 0 to cap the match by blocks`,
    });
  }
  if (p.blockSize !== undefined) {
    warnings.push({
      parameter: 'blockSize',
      whereWritten: true,
      message:
        p.blockSizeTokens === p.blockSize
          ? `deprecated: read as blockSizeTokens: ${p.blockSize} (tokens per block, as llm-d reads it; GIE's documentation called it characters)`
          : 'deprecated and ignored: blockSizeTokens is set',
    });
  }
  return warnings;
}

export const prefixCacheScorerParams = z
  .strictObject({
    ...prefixIndexParamsShape,
    matchLengthWeight: z.number().min(0).max(1).default(0),
    matchLengthScaleTokens: z.number().positive().default(8192),
    /** llm-d: the producer holding the index; here the scorer holds it (its parameters are merged in). */
    prefixMatchInfoProducerName: z.string().min(1).optional(),
  })
  .transform(resolveMatchWindow);

export type PrefixCacheScorerParams = z.infer<typeof prefixCacheScorerParams>;

export class PrefixCacheScorer implements Scorer, PreRequest, PrefixMatcher, PrefixIndexer {
  readonly type = PREFIX_CACHE_SCORER_TYPE;
  index = new PrefixIndex();
  readonly hashOptions: PrefixHashOptions;
  readonly blockSizeTokens: number;
  /** req.state key of this instance's block hashes. */
  readonly stateKey: string;
  private readonly autoTune: boolean;
  private readonly lruCapacity: number;
  private readonly lengthWeight: number;
  private readonly lengthScaleTokens: number;
  private lastPurgeAt: number;
  private readonly single = new Float64Array(1);
  // The matched blocks of the last score() run, per candidate, for the hit metrics in preRequest():
  // the chosen endpoint is among them, so its match need not be walked again.
  private scoredReq: SchedulingRequest | undefined = undefined;
  private scoredEndpoints: readonly Endpoint[] = [];
  private scoredMatched = new Float64Array(0);

  constructor(
    readonly name: string,
    params: PrefixCacheScorerParams,
    private readonly clock: Clock,
    private readonly pool: PoolView,
    /** Records each scheduled request's expected hit (llm-d's hit-ratio and hit-bytes histograms). */
    private readonly recordMatch?: (matchedBytes: number, totalBytes: number) => void,
  ) {
    this.blockSizeTokens = params.blockSizeTokens;
    const blockChars = params.blockSizeTokens * CHARS_PER_TOKEN;
    const maxBlocks =
      params.maxPrefixTokensToMatch > 0
        ? Math.max(1, Math.floor(params.maxPrefixTokensToMatch / this.blockSizeTokens))
        : (params.maxPrefixBlocksToMatch ?? 0);
    this.hashOptions = { blockChars, maxBlocks };
    this.autoTune = params.autoTune;
    this.lruCapacity = params.lruCapacityPerServer;
    this.lengthWeight = params.matchLengthWeight;
    this.lengthScaleTokens = params.matchLengthScaleTokens;
    // How the blocks are cut is part of the key: a request probed before a reload that re-cuts them
    // must not bring its old hashes to the new instance of the same name.
    this.stateKey = `${PREFIX_CACHE_SCORER_TYPE}/${name}/hashes/${blockChars}/${maxBlocks}`;
    this.lastPurgeAt = clock.now();
  }

  /** A reload: the index learned so far stays, unless the blocks are now cut differently (their hashes would never match). */
  carryOver(previous: Plugin, replaced: ReadonlySet<string>): void {
    if (previous instanceof PrefixCacheScorer && previous.hashOptions.blockChars === this.hashOptions.blockChars) {
      this.index = previous.index;
      this.lastPurgeAt = previous.lastPurgeAt;
      if (replaced.size > 0) this.index.purge(new Set(this.index.endpointNames().filter((name) => !replaced.has(name))));
    }
  }

  /** The request's block hashes, computed once per request and kept in req.state. */
  hashesFor(req: SchedulingRequest): readonly number[] {
    const cached = req.state.get(this.stateKey) as readonly number[] | undefined;
    if (cached !== undefined) return cached;
    const salt = req.body['cache_salt'];
    let seed = hashString(req.model);
    if (typeof salt === 'string' && salt !== '') seed = hashString(salt, seed);
    const hashes = blockHashes(req.promptText, seed, this.hashOptions);
    req.state.set(this.stateKey, hashes);
    return hashes;
  }

  score(_ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    const hashes = this.hashesFor(req);
    const total = hashes.length;
    if (total === 0) {
      out.fill(0);
      return;
    }
    this.index.match(hashes, endpoints, out);
    if (this.recordMatch !== undefined) this.keepMatches(req, endpoints, out);
    for (let i = 0; i < endpoints.length; i++) out[i] = this.scoreOf(out[i]!, total);
  }

  private scoreOf(matched: number, total: number): number {
    const ratio = matched / total;
    if (this.lengthWeight === 0) return ratio;
    const length = Math.min(1, (matched * this.blockSizeTokens) / this.lengthScaleTokens);
    return this.lengthWeight * length * length + (1 - this.lengthWeight) * ratio;
  }

  prefixIndexerSize(): number {
    return this.index.entries;
  }

  /** Leading blocks of this request `endpoint` is believed to cache. */
  prefixMatch(req: SchedulingRequest, endpoint: Endpoint): PrefixMatch {
    const hashes = this.hashesFor(req);
    const matched = hashes.length === 0 ? 0 : this.index.match(hashes, [endpoint], this.single)[0]!;
    return { matchedBlocks: matched, totalBlocks: hashes.length, blockSizeTokens: this.blockSizeTokens };
  }

  preRequest(req: SchedulingRequest, result: SchedulingResult): void {
    const hashes = this.hashesFor(req);
    if (hashes.length === 0) return;
    const primary = result.profileResults.get(result.primaryProfile)?.targets[0];
    if (primary !== undefined && this.recordMatch !== undefined) {
      // What the index believed the chosen endpoint to cache, before it learns the prompt there.
      const { blockChars } = this.hashOptions;
      this.recordMatch(this.matchedBefore(req, hashes, primary) * blockChars, hashes.length * blockChars);
    }
    // The P/D handler's prefill pick, whatever its profile is called; else llm-d's `prefill` profile.
    const prefill =
      result.disaggregation !== undefined
        ? result.disaggregation.prefill
        : result.primaryProfile !== PREFILL_PROFILE_NAME
          ? result.profileResults.get(PREFILL_PROFILE_NAME)?.targets[0]
          : undefined;
    const both = prefill !== undefined && prefill !== primary;
    // Two endpoints learn the same blocks (P/D): as blocks at once, not a lazy tail the second learn
    // would turn into blocks anyway.
    if (primary !== undefined) this.learn(primary, hashes, !both);
    if (both) this.learn(prefill, hashes, true);
    this.maybePurge();
  }

  private keepMatches(req: SchedulingRequest, endpoints: readonly Endpoint[], matched: Float64Array): void {
    const n = endpoints.length;
    if (this.scoredMatched.length < n) this.scoredMatched = new Float64Array(Math.max(n, this.scoredMatched.length * 2));
    for (let i = 0; i < n; i++) this.scoredMatched[i] = matched[i]!;
    this.scoredReq = req;
    this.scoredEndpoints = endpoints;
  }

  /** `endpoint`'s matched blocks: from the last score() run when it scored this request there, else walked now. */
  private matchedBefore(req: SchedulingRequest, hashes: readonly number[], endpoint: Endpoint): number {
    const i = this.scoredReq === req ? this.scoredEndpoints.indexOf(endpoint) : -1;
    this.scoredReq = undefined; // holds no request past its decision
    this.scoredEndpoints = [];
    return i >= 0 ? this.scoredMatched[i]! : this.index.match(hashes, [endpoint], this.single)[0]!;
  }

  private learn(endpoint: Endpoint, hashes: readonly number[], lazyTail: boolean): void {
    this.index.learn(endpoint.name, hashes, this.capacityOf(endpoint), lazyTail);
  }

  /** Blocks (of blockSizeTokens) remembered for the endpoint: what its KV cache holds when auto-tuned. */
  capacityOf(endpoint: Endpoint): number {
    const cache = endpoint.metrics?.cacheConfig;
    if (!this.autoTune || cache === undefined || cache.numGpuBlocks <= 0) return this.lruCapacity;
    // The engine's blocks are its own size (vLLM --block-size, 16 by default); ours are blockSizeTokens.
    const engineBlockTokens = cache.blockSize > 0 ? cache.blockSize : this.blockSizeTokens;
    return Math.max(1, Math.floor((cache.numGpuBlocks * engineBlockTokens) / this.blockSizeTokens));
  }

  private maybePurge(): void {
    const now = this.clock.now();
    if (now - this.lastPurgeAt < PURGE_INTERVAL_MS) return;
    this.lastPurgeAt = now;
    const live = new Set<string>();
    for (const endpoint of this.pool.endpoints) if (!endpoint.removed) live.add(endpoint.name);
    this.index.purge(live);
  }
}

export const prefixCacheScorerDefinition: PluginDefinition<PrefixCacheScorerParams> = {
  type: PREFIX_CACHE_SCORER_TYPE,
  kinds: ['scorer'],
  params: prefixCacheScorerParams,
  configWarnings: (params, { declaredNames }) => {
    const warnings = matchWindowWarnings(params);
    const producer = params.prefixMatchInfoProducerName;
    if (producer === undefined || declaredNames === undefined || declaredNames.has(producer)) return warnings;
    warnings.push({
      parameter: 'prefixMatchInfoProducerName',
      message: `no plugin named "${producer}" is declared${didYouMean(producer, [...declaredNames])}: no approx-prefix-cache-producer lends its parameters to this scorer`,
    });
    return warnings;
  },
  create: (name, params, deps) =>
    new PrefixCacheScorer(name, params, deps.clock, deps.pool, deps.prefixIndexerMatch?.(name, PREFIX_CACHE_SCORER_TYPE)),
};
