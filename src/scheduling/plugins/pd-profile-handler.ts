/**
 * `pd-profile-handler` — llm-d's deprecated name of `disagg-profile-handler`, accepted so older
 * llm-d P/D configurations load unchanged; it runs as `disagg-profile-handler` (with a warning).
 *
 * Parameters: those of `disagg-profile-handler`, in llm-d's older flat form or the nested one —
 * - `decodeProfile` "decode", `prefillProfile` "prefill" — profile names
 * - `deciderPluginName` "prefix-based-pd-decider" — the prefill decider (unlike
 *   `disagg-profile-handler`, one is wired in by default: that plugin name must be declared; it
 *   disaggregates only once its `nonCachedTokens` is set)
 * - `prefixPluginType`, `prefixPluginName`, `prefixMatchInfoProducerName` — accepted and ignored
 *   (the decider finds the prefix scorer)
 * - `primaryPort` 0 — llm-d's data-parallel rewrite of the target port; only 0 (off) is accepted
 * - `connector` "sidecar" — as `disagg-profile-handler`
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { PREFIX_BASED_PD_DECIDER_TYPE } from './prefix-based-pd-decider.js';
import {
  createDisaggHandler,
  disaggProfileHandlerParams,
  disaggReferences,
  flatKeyPath,
  DISAGG_PROFILE_HANDLER_TYPE,
  type DisaggProfileHandlerParams,
} from './disagg-profile-handler.js';

export const PD_PROFILE_HANDLER_TYPE = 'pd-profile-handler';

const IGNORED_KEYS = ['prefixPluginType', 'prefixPluginName', 'prefixMatchInfoProducerName'];

function pdDefaults(raw: unknown, ctx: z.RefinementCtx): unknown {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return raw;
  const rest: Record<string, unknown> = { ...raw };
  for (const key of IGNORED_KEYS) delete rest[key];
  // llm-d's default 0 leaves the port alone; any other value asks for data-parallel routing.
  if (rest.primaryPort === 0) delete rest.primaryPort;
  else if (rest.primaryPort !== undefined) {
    ctx.addIssue({
      code: 'custom',
      path: ['primaryPort'],
      message: Number.isInteger(rest.primaryPort)
        ? 'data-parallel routing (primaryPort other than 0) is not supported: remove primaryPort or set it to 0'
        : 'primaryPort must be an integer (0 = off, the only value supported)',
    });
    delete rest.primaryPort;
  }
  const deciders = rest.deciders as { prefill?: unknown } | undefined;
  if (rest.deciderPluginName === undefined && rest.prefillDeciderPluginName === undefined && deciders?.prefill === undefined) {
    if (rest.profiles !== undefined || rest.deciders !== undefined) rest.deciders = { ...deciders, prefill: PREFIX_BASED_PD_DECIDER_TYPE };
    else rest.deciderPluginName = PREFIX_BASED_PD_DECIDER_TYPE;
  }
  return rest;
}

const params = z.preprocess(pdDefaults, disaggProfileHandlerParams);

export const pdProfileHandlerDefinition: PluginDefinition<DisaggProfileHandlerParams> = {
  type: PD_PROFILE_HANDLER_TYPE,
  kinds: ['profileHandler'],
  params,
  references: disaggReferences,
  writtenPath: flatKeyPath,
  configWarnings: () => [{ message: `${PD_PROFILE_HANDLER_TYPE} is deprecated in llm-d; it runs as ${DISAGG_PROFILE_HANDLER_TYPE}` }],
  create: (name, p, deps) => createDisaggHandler(name, p, deps),
};
