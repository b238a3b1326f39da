/**
 * `prefill-filter` — filter (no parameters).
 *
 * Keeps endpoints that can prefill: role `prefill`, `encode-prefill`, `prefill-decode` (alias
 * `both`) and `encode-prefill-decode`. Unlabelled endpoints are dropped (never chosen as prefill
 * workers), as are unknown role values.
 */
import { roleFilterDefinition } from './role-filter.js';

export const PREFILL_FILTER_TYPE = 'prefill-filter';

export const PREFILL_ROLES = ['prefill', 'encode-prefill', 'prefill-decode', 'encode-prefill-decode'] as const;

export const prefillFilterDefinition = roleFilterDefinition(PREFILL_FILTER_TYPE, PREFILL_ROLES, false);
