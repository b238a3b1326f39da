/**
 * llm-d plugins whose work Sluice does elsewhere, accepted so llm-d configurations load unchanged.
 * Each does nothing at run time, and the loader says so in a warning where it is declared.
 *
 * - `disagg-headers-handler`, `prefill-header-handler` — set `x-prefiller-host-port` for the routing
 *   sidecar; deprecated in llm-d since `disagg-profile-handler` sets it (here: the `sidecar` connector)
 * - `models-responder` — answers `/v1/models`; Sluice answers it itself (from the endpoints)
 * - `openai-parser` — parses OpenAI request bodies (llm-d's default parser); Sluice parses them itself
 * - `inflight-load-producer` — counts requests and uncached prompt tokens in flight per endpoint;
 *   Sluice always counts both (`endpoint.inFlight`, `endpoint.inFlightTokens`)
 *
 * Parameters: none, but `inflight-load-producer` accepts llm-d's: `addEstimatedOutputTokens` (older
 * name `includeOutputTokens`), `outputRatio` and `maxEstimatedOutputTokens` (Sluice counts prompt
 * tokens only: `true` is warned about, the others mean nothing), `prefixMatchInfoProducerName` (the
 * prefix index is the prefix-cache-scorer's), `syncCrossReplicaState` (`true` is warned about: each
 * Sluice replica counts its own requests).
 */
import { z } from 'zod';
import type { PluginConfigWarning, PluginDefinition } from '../../plugins/registry.js';

const noParams = z.strictObject({});

/** A plugin that does nothing here, with the warning saying why (and any its parameters add). */
function noOp<P>(
  type: string,
  why: string,
  params: z.ZodType<P>,
  ignored: (p: P) => PluginConfigWarning[] = () => [],
): PluginDefinition<P> {
  return {
    type,
    kinds: [],
    params,
    configWarnings: (p) => [{ message: `${type} does nothing here: ${why}` }, ...ignored(p)],
    create: (name) => ({ type, name }),
  };
}

const inflightParams = z.strictObject({
  addEstimatedOutputTokens: z.boolean().optional(),
  includeOutputTokens: z.boolean().optional(),
  outputRatio: z.number().optional(),
  maxEstimatedOutputTokens: z.number().optional(),
  prefixMatchInfoProducerName: z.string().optional(),
  syncCrossReplicaState: z.boolean().optional(),
});

/** What `inflight-load-producer`'s parameters would change in llm-d, and Sluice does not do. */
function inflightIgnored(p: z.infer<typeof inflightParams>): PluginConfigWarning[] {
  const warnings: PluginConfigWarning[] = [];
  for (const key of ['addEstimatedOutputTokens', 'includeOutputTokens'] as const) {
    if (p[key] === true) warnings.push({ parameter: key, message: `${key} is ignored: Sluice counts uncached prompt tokens only` });
  }
  if (p.syncCrossReplicaState === true) {
    warnings.push({ parameter: 'syncCrossReplicaState', message: 'syncCrossReplicaState is ignored: each Sluice replica counts its own requests' });
  }
  return warnings;
}

export const llmdNoOpDefinitions: readonly PluginDefinition<unknown>[] = [
  noOp('disagg-headers-handler', 'deprecated in llm-d; the sidecar connector sets x-prefiller-host-port itself', noParams),
  noOp('prefill-header-handler', 'deprecated in llm-d; the sidecar connector sets x-prefiller-host-port itself', noParams),
  noOp('models-responder', 'Sluice answers /v1/models itself', noParams),
  noOp('openai-parser', 'Sluice parses OpenAI requests itself', noParams),
  noOp('inflight-load-producer', 'Sluice counts the requests and prompt tokens in flight on each endpoint itself', inflightParams, inflightIgnored),
];
