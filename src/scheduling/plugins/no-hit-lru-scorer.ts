/**
 * `no-hit-lru-scorer` — scorer and PreRequest hook (llm-d; answers the hot-spotting of cold
 * requests, llm-d-router #346).
 *
 * A request is *cold* when the prefix-cache scorer believes no candidate caches any of its leading
 * blocks (its prompt is also cold when too short to hash, or when no prefix scorer can be found).
 * Cold requests build new KV blocks wherever they land, so they are spread over the endpoints that
 * least recently received a cold request:
 *   - candidates that never received one (since this instance started, or since they fell out of
 *     the LRU) come first, in candidate order: the i-th scores `1 − i/(n−1)`;
 *   - the others follow, least recently used first: rank r (counting the never-used ones before
 *     them) scores `max(0, 1 − r/(n−1))`;
 *   - a single candidate scores 1.
 * A warm request (some candidate has a prefix hit) scores 0.5 everywhere: the prefix scorer decides.
 * Ranks are taken among the candidates (llm-d ranks by position in the whole LRU, which can leave
 * gaps when some endpoints were filtered out).
 * After scheduling, preRequest() moves the primary target, and the target of the profile named by
 * `prefillProfile`, to the most-recent end of the LRU — for cold requests only.
 *
 * The prefix scorer is found by name (`prefixPluginName`) among the configured plugins, else as the
 * first plugin of type `prefixPluginType`; it is resolved on first use, so declaration order does not
 * matter. Its match information for the request (block hashes kept in req.state, its index) is
 * what decides cold or warm, so both scorers agree.
 *
 * Parameters (defaults):
 * - `prefixPluginName` "prefix-cache-scorer" — instance name of the prefix-cache scorer
 * - `prefixPluginType` "prefix-cache-scorer" — its type, used when no plugin has that name
 * - `prefillProfile` "prefill" — profile whose target is also recorded (P/D)
 * - `lruSize` 1024 — integer; endpoints remembered; ≤ 0 is read as 1024 with a warning (as llm-d does)
 * - `prefixMatchInfoProducerName` — llm-d's (the producer of the prefix index); accepted and ignored:
 *   the index is the prefix-cache scorer's, found as above
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition, PluginLogger } from '../../plugins/registry.js';
import type { CycleContext, Plugin, PreRequest, Scorer, SchedulingRequest, SchedulingResult } from '../framework.js';
import { PREFIX_CACHE_SCORER_TYPE } from './prefix-cache-scorer.js';

export const NO_HIT_LRU_SCORER_TYPE = 'no-hit-lru-scorer';
export const NO_HIT_WARM_SCORE = 0.5;

const DEFAULT_LRU_SIZE = 1024;

export const noHitLruScorerParams = z.strictObject({
  prefixPluginName: z.string().min(1).default(PREFIX_CACHE_SCORER_TYPE),
  prefixPluginType: z.string().min(1).default(PREFIX_CACHE_SCORER_TYPE),
  prefillProfile: z.string().min(1).default('prefill'),
  lruSize: z.number().int().default(DEFAULT_LRU_SIZE),
  prefixMatchInfoProducerName: z.string().optional(),
});

export type NoHitLruScorerParams = z.infer<typeof noHitLruScorerParams>;

/** What this scorer needs from a prefix scorer (PrefixCacheScorer has it). */
export interface PrefixMatchSource extends Plugin {
  hashesFor(req: SchedulingRequest): readonly number[];
  readonly index: { match(hashes: readonly number[], candidates: readonly Endpoint[], out?: Float64Array): Float64Array };
}

const isPrefixMatchSource = (p: Plugin): p is PrefixMatchSource => {
  const candidate = p as Partial<PrefixMatchSource>;
  return typeof candidate.hashesFor === 'function' && typeof candidate.index?.match === 'function';
};

export class NoHitLruScorer implements Scorer, PreRequest {
  readonly type = NO_HIT_LRU_SCORER_TYPE;
  /** req.state key: was this request cold (boolean), written by score() for preRequest(). */
  readonly stateKey: string;
  private readonly prefixPluginName: string;
  private readonly prefixPluginType: string;
  private readonly prefillProfile: string;
  private readonly lruSize: number;
  /** Endpoint name → sequence number of its last cold request; Map order = least recent first. */
  private readonly lru = new Map<string, number>();
  private sequence = 0;
  private prefix: PrefixMatchSource | undefined;
  private warnedUnresolved = false;
  private matched = new Float64Array(0);

  constructor(
    readonly name: string,
    params: NoHitLruScorerParams,
    private readonly plugins: ReadonlyMap<string, Plugin>,
    private readonly logger?: PluginLogger,
  ) {
    this.prefixPluginName = params.prefixPluginName;
    this.prefixPluginType = params.prefixPluginType;
    this.prefillProfile = params.prefillProfile;
    this.lruSize = params.lruSize > 0 ? params.lruSize : DEFAULT_LRU_SIZE;
    this.stateKey = `${NO_HIT_LRU_SCORER_TYPE}/${name}/cold`;
  }

  score(_ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    const n = endpoints.length;
    const cold = this.isCold(req, endpoints);
    req.state.set(this.stateKey, cold);
    if (!cold) {
      out.fill(NO_HIT_WARM_SCORE, 0, n);
      return;
    }
    if (n === 1) {
      out[0] = 1;
      return;
    }
    const used: number[] = [];
    let neverUsed = 0;
    for (let i = 0; i < n; i++) {
      if (this.lru.has(endpoints[i]!.name)) used.push(i);
      else out[i] = 1 - neverUsed++ / (n - 1);
    }
    if (used.length === 0) return;
    used.sort((a, b) => this.lru.get(endpoints[a]!.name)! - this.lru.get(endpoints[b]!.name)!);
    for (let j = 0; j < used.length; j++) out[used[j]!] = Math.max(0, 1 - (neverUsed + j) / (n - 1));
  }

  preRequest(req: SchedulingRequest, result: SchedulingResult): void {
    if (req.state.get(this.stateKey) !== true) return;
    const primary = result.profileResults.get(result.primaryProfile)?.targets[0];
    if (primary !== undefined) this.touch(primary.name);
    if (result.primaryProfile !== this.prefillProfile) {
      const prefill = result.profileResults.get(this.prefillProfile)?.targets[0];
      if (prefill !== undefined) this.touch(prefill.name);
    }
  }

  /** A reload: the order in which endpoints last received a cold request stays. */
  carryOver(previous: Plugin, replaced: ReadonlySet<string>): void {
    if (!(previous instanceof NoHitLruScorer)) return;
    for (const name of previous.lru.keys()) if (!replaced.has(name)) this.touch(name);
  }

  /** Endpoint names, least recently used (for a cold request) first (tests, debug). */
  lruOrder(): string[] {
    return [...this.lru.keys()];
  }

  private isCold(req: SchedulingRequest, endpoints: readonly Endpoint[]): boolean {
    const prefix = this.resolvePrefix();
    if (prefix === undefined) return true;
    const hashes = prefix.hashesFor(req);
    if (hashes.length === 0) return true;
    if (this.matched.length < endpoints.length) this.matched = new Float64Array(endpoints.length);
    const matched = prefix.index.match(hashes, endpoints, this.matched);
    for (let i = 0; i < endpoints.length; i++) if (matched[i]! > 0) return false;
    return true;
  }

  private resolvePrefix(): PrefixMatchSource | undefined {
    if (this.prefix !== undefined) return this.prefix;
    const byName = this.plugins.get(this.prefixPluginName);
    if (byName !== undefined && isPrefixMatchSource(byName)) this.prefix = byName;
    else {
      for (const plugin of this.plugins.values()) {
        if (plugin.type === this.prefixPluginType && isPrefixMatchSource(plugin)) {
          this.prefix = plugin;
          break;
        }
      }
    }
    if (this.prefix === undefined && !this.warnedUnresolved) {
      this.warnedUnresolved = true;
      this.logger?.warn(
        { plugin: this.name, prefixPluginName: this.prefixPluginName, prefixPluginType: this.prefixPluginType },
        'no prefix-cache scorer found: every request is treated as cold',
      );
    }
    return this.prefix;
  }

  private touch(endpointName: string): void {
    this.lru.delete(endpointName);
    this.lru.set(endpointName, ++this.sequence);
    while (this.lru.size > this.lruSize) this.lru.delete(this.lru.keys().next().value as string);
  }
}

export const noHitLruScorerDefinition: PluginDefinition<NoHitLruScorerParams> = {
  type: NO_HIT_LRU_SCORER_TYPE,
  kinds: ['scorer'],
  params: noHitLruScorerParams,
  configWarnings: (p) =>
    p.lruSize > 0 ? [] : [{ parameter: 'lruSize', message: `lruSize ${p.lruSize} is not positive: read as ${DEFAULT_LRU_SIZE} (as llm-d does)` }],
  create: (name, params, deps) => new NoHitLruScorer(name, params, deps.plugins, deps.logger),
};
