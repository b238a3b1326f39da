/**
 * `approx-prefix-cache-producer` — llm-d's data producer of the approximate prefix index, accepted
 * so llm-d configurations load unchanged. In Sluice `prefix-cache-scorer` keeps the index itself,
 * so this plugin does nothing at run time: the loader copies its parameters into every
 * `prefix-cache-scorer` whose `prefixMatchInfoProducerName` names it or is unset (the scorer's own
 * values win), and says so in a warning. When no `prefix-cache-scorer` is declared, the loader runs
 * it as one, under its own name: it keeps the index that `prefix-cache-affinity-filter`,
 * `token-load-scorer` and `prefix-based-pd-decider` read, and scores only where a profile names it.
 *
 * Parameters: those of the prefix index, with `prefix-cache-scorer`'s defaults — `autoTune` true,
 * `blockSizeTokens` 16, `maxPrefixTokensToMatch` 131072, `maxPrefixBlocksToMatch` 2048 (only when
 * the token window is 0), `lruCapacityPerServer` 31250, `blockSize` (deprecated: tokens).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { matchWindowWarnings, PREFIX_CACHE_SCORER_TYPE, prefixIndexParamsShape, resolveMatchWindow } from './prefix-cache-scorer.js';

export const APPROX_PREFIX_CACHE_PRODUCER_TYPE = 'approx-prefix-cache-producer';

const params = z.strictObject(prefixIndexParamsShape).transform(resolveMatchWindow);

export const approxPrefixCacheProducerDefinition: PluginDefinition<z.infer<typeof params>> = {
  type: APPROX_PREFIX_CACHE_PRODUCER_TYPE,
  kinds: [],
  params,
  lendsParameters: { to: PREFIX_CACHE_SCORER_TYPE, referencedBy: 'prefixMatchInfoProducerName' },
  configWarnings: matchWindowWarnings,
  create: (name) => ({ type: APPROX_PREFIX_CACHE_PRODUCER_TYPE, name }),
};
