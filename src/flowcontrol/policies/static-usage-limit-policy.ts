/**
 * `static-usage-limit-policy`: every band gets the same ceiling, `threshold` (default 1.0), so
 * bands dispatch while saturation < threshold. llm-d documents (0, 1] but does not enforce the upper
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
  return { type: STATIC_USAGE_LIMIT_POLICY, name, ceiling: () => threshold };
}

export const staticUsageLimitPolicyDefinition: PluginDefinition<StaticUsageLimitParams> = {
  type: STATIC_USAGE_LIMIT_POLICY,
  kinds: ['usageLimitPolicy'],
  params: staticUsageLimitParams,
  create: (name, params) => createStaticUsageLimitPolicy(name, params),
};
