/**
 * `pd-profile-handler` — llm-d's deprecated name of `disagg-profile-handler`, accepted so older
 * llm-d P/D configurations load unchanged; it runs as `disagg-profile-handler` (with a warning).
 *
 * Parameters: those of `disagg-profile-handler`, in llm-d's older flat form or the nested one —
 * - `decodeProfile` "decode", `prefillProfile` "prefill" — profile names
 * - `deciderPluginName` "prefix-based-pd-decider" — the prefill decider (unlike
 *   `disagg-profile-handler`, P/D is on by default: that plugin name must be declared)
 * - `prefixPluginType`, `prefixPluginName` — accepted and ignored (the decider finds the prefix scorer)
 * - `connector` "sidecar" — as `disagg-profile-handler`
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { PREFIX_BASED_PD_DECIDER_TYPE } from './prefix-based-pd-decider.js';
import {
  createDisaggHandler,
  disaggProfileHandlerParams,
  disaggReferences,
  DISAGG_PROFILE_HANDLER_TYPE,
  type DisaggProfileHandlerParams,
} from './disagg-profile-handler.js';

export const PD_PROFILE_HANDLER_TYPE = 'pd-profile-handler';

const IGNORED_KEYS = ['prefixPluginType', 'prefixPluginName'];

function pdDefaults(raw: unknown): unknown {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return raw;
  const rest: Record<string, unknown> = { ...raw };
  for (const key of IGNORED_KEYS) delete rest[key];
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
  configWarnings: () => [{ message: `${PD_PROFILE_HANDLER_TYPE} is deprecated in llm-d; it runs as ${DISAGG_PROFILE_HANDLER_TYPE}` }],
  create: (name, p, deps) => createDisaggHandler(name, p, deps),
};
