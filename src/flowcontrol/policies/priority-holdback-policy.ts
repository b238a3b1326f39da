/**
 * `priority-holdback-policy` — usage-limit policy (alpha in llm-d): lower priorities get lower
 * ceilings, so they stop dispatching earlier as saturation rises, holding capacity back for the top.
 *
 * Formula (N = number of provisioned bands, i = 0 is the highest priority):
 * - N = 0: nothing; N = 1: ceiling = maxCeiling.
 * - domain `rank`: `c_i = max − i·(max − min)/(N − 1)` (evenly spaced; priority values ignored).
 * - domain `value`: `r_i = (p_i − p_min)/(p_max − p_min)`, `c_i = min + r_i·(max − min)`
 *   (spaced by priority value); all priorities equal → every band gets `max`.
 *
 * Parameters: `minCeiling` REQUIRED, in [0, 1); `maxCeiling` default 1.0, in (0, 1];
 * minCeiling < maxCeiling strictly; `shape` "linear" (default, the only shape); `domain` "rank"
 * (default) | "value".
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { UsageLimitPolicy } from './types.js';

export const PRIORITY_HOLDBACK_POLICY = 'priority-holdback-policy';

export const priorityHoldbackParams = z
  .strictObject({
    minCeiling: z.number().min(0).lt(1),
    maxCeiling: z.number().gt(0).lte(1).default(1.0),
    shape: z.enum(['linear']).default('linear'),
    domain: z.enum(['rank', 'value']).default('rank'),
  })
  .refine((p) => p.minCeiling < p.maxCeiling, {
    message: 'minCeiling must be less than maxCeiling',
    path: ['minCeiling'],
  });
export type PriorityHoldbackParams = z.output<typeof priorityHoldbackParams>;

export function createPriorityHoldbackPolicy(name: string, params: PriorityHoldbackParams): UsageLimitPolicy {
  const { minCeiling: min, maxCeiling: max, domain } = params;
  const span = max - min;
  return {
    type: PRIORITY_HOLDBACK_POLICY,
    name,
    computeCeilings(_saturation: number, priorities: readonly number[], out: Float64Array): void {
      const n = priorities.length;
      if (n === 0) return;
      if (n === 1) {
        out[0] = max;
        return;
      }
      if (domain === 'rank') {
        for (let i = 0; i < n; i++) out[i] = max - (i * span) / (n - 1);
        return;
      }
      // Min/max by scan rather than trusting the ends of the list.
      let pMin = Infinity;
      let pMax = -Infinity;
      for (const p of priorities) {
        if (p < pMin) pMin = p;
        if (p > pMax) pMax = p;
      }
      const range = pMax - pMin;
      for (let i = 0; i < n; i++) out[i] = range === 0 ? max : min + ((priorities[i]! - pMin) / range) * span;
    },
  };
}

export const priorityHoldbackPolicyDefinition: PluginDefinition<PriorityHoldbackParams> = {
  type: PRIORITY_HOLDBACK_POLICY,
  kinds: ['usageLimitPolicy'],
  params: priorityHoldbackParams,
  create: (name, params) => createPriorityHoldbackPolicy(name, params),
};
