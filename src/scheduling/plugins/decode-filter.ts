/**
 * `decode-filter` — filter (no parameters).
 *
 * Keeps endpoints that can decode: role `decode`, `prefill-decode` (alias `both`),
 * `encode-prefill-decode`, and endpoints without an `llm-d.ai/role` label (an unlabelled fleet is
 * decode-capable, so a plain vLLM fleet works with this filter). Other roles, and a role label with
 * an unknown value, are dropped.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { RoleFilter } from './role-filter.js';

export const DECODE_FILTER_TYPE = 'decode-filter';

export const DECODE_ROLES = ['decode', 'prefill-decode', 'encode-prefill-decode'] as const;

export const decodeFilterDefinition: PluginDefinition<Record<string, never>> = {
  type: DECODE_FILTER_TYPE,
  kinds: ['filter'],
  params: z.strictObject({}),
  create: (name) => new RoleFilter(DECODE_FILTER_TYPE, name, DECODE_ROLES, true),
};
