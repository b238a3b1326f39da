/**
 * `decode-filter` — filter (no parameters).
 *
 * Keeps endpoints that can decode: role `decode`, `prefill-decode` (alias `both`),
 * `encode-prefill-decode`, and endpoints without an `llm-d.ai/role` label (an unlabelled fleet is
 * decode-capable, so a plain vLLM fleet works with this filter). Other roles, and a role label with
 * an unknown value, are dropped.
 */
import { roleFilterDefinition } from './role-filter.js';

export const DECODE_FILTER_TYPE = 'decode-filter';

export const DECODE_ROLES = ['decode', 'prefill-decode', 'encode-prefill-decode'] as const;

export const decodeFilterDefinition = roleFilterDefinition(DECODE_FILTER_TYPE, DECODE_ROLES, true);
