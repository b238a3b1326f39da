/**
 * `static-usage-limit-policy` — usage-limit policy (the llm-d default, auto-injected).
 *
 * Formula: every band's ceiling = `threshold`, so every band dispatches while saturation < threshold.
 *
 * Parameters: `threshold` (default 1.0, > 0). llm-d documents (0, 1] but does not enforce the upper
 * bound; we require > 0 (a zero ceiling would never dispatch) and allow > 1 (deliberate overcommit).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { UsageLimitPolicy } from './types.js';

export const STATIC_USAGE_LIMIT_POLICY = 'static-usage-limit-policy';

export const staticUsageLimitParams = z.strictObject({
  threshold: z.number().positive().default(1.0),
});
export type StaticUsageLimitParams = z.output<typeof staticUsageLimitParams>;

export function createStaticUsageLimitPolicy(name: string, params: StaticUsageLimitParams): UsageLimitPolicy {
  const { threshold } = params;
  return {
    type: STATIC_USAGE_LIMIT_POLICY,
    name,
    computeCeilings(_saturation: number, priorities: readonly number[], out: Float64Array): void {
      out.fill(threshold, 0, priorities.length);
    },
  };
}

export const staticUsageLimitPolicyDefinition: PluginDefinition<StaticUsageLimitParams> = {
  type: STATIC_USAGE_LIMIT_POLICY,
  kinds: ['usageLimitPolicy'],
  params: staticUsageLimitParams,
  create: (name, params) => createStaticUsageLimitPolicy(name, params),
};
