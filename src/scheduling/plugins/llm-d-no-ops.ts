/**
 * llm-d plugins whose work Sluice does elsewhere, accepted so llm-d configurations load unchanged.
 * Each does nothing at run time, and the loader says so in a warning where it is declared.
 *
 * - `disagg-headers-handler`, `prefill-header-handler` — set `x-prefiller-host-port` for the routing
 *   sidecar; deprecated in llm-d since `disagg-profile-handler` sets it (here: the `sidecar` connector)
 * - `models-responder` — answers `/v1/models`; Sluice answers it itself (from the endpoints)
 * - `inflight-load-producer` — counts requests in flight per endpoint; Sluice always counts them
 *
 * Parameters: none.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';

const params = z.strictObject({});

function noOp(type: string, why: string): PluginDefinition<z.infer<typeof params>> {
  return {
    type,
    kinds: [],
    params,
    configWarnings: () => [{ message: `${type} does nothing here: ${why}` }],
    create: (name) => ({ type, name }),
  };
}

export const llmdNoOpDefinitions: readonly PluginDefinition<z.infer<typeof params>>[] = [
  noOp('disagg-headers-handler', 'deprecated in llm-d; the sidecar connector sets x-prefiller-host-port itself'),
  noOp('prefill-header-handler', 'deprecated in llm-d; the sidecar connector sets x-prefiller-host-port itself'),
  noOp('models-responder', 'Sluice answers /v1/models itself'),
  noOp('inflight-load-producer', 'Sluice counts the requests in flight on each endpoint itself'),
];
