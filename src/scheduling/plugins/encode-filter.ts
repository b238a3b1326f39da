/**
 * `encode-filter` — filter (no parameters), llm-d's filter for multimodal encode workers.
 *
 * Keeps endpoints that can encode: role `encode`, `encode-prefill` and `encode-prefill-decode`.
 * Unlabelled endpoints are dropped, as are other roles. Sluice runs no encode stage of its own
 * (llm-d's E/P/D disaggregation); the filter narrows any profile that names it.
 */
import { roleFilterDefinition } from './role-filter.js';

export const ENCODE_FILTER_TYPE = 'encode-filter';

export const ENCODE_ROLES = ['encode', 'encode-prefill', 'encode-prefill-decode'] as const;

export const encodeFilterDefinition = roleFilterDefinition(ENCODE_FILTER_TYPE, ENCODE_ROLES, false);
