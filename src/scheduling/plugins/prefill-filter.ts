/**
 * `prefill-filter` — filter (no parameters).
 *
 * Keeps endpoints that can prefill: role `prefill`, `encode-prefill`, `prefill-decode` (alias
 * `both`) and `encode-prefill-decode`. Unlabelled endpoints are dropped (never chosen as prefill
 * workers), as are unknown role values.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { RoleFilter } from './role-filter.js';

export const PREFILL_FILTER_TYPE = 'prefill-filter';

export const PREFILL_ROLES = ['prefill', 'encode-prefill', 'prefill-decode', 'encode-prefill-decode'] as const;

export const prefillFilterDefinition: PluginDefinition<Record<string, never>> = {
  type: PREFILL_FILTER_TYPE,
  kinds: ['filter'],
  params: z.strictObject({}),
  create: (name) => new RoleFilter(PREFILL_FILTER_TYPE, name, PREFILL_ROLES, false),
};
