/** The flow-control policies the config loader injects by default (SPEC §3.5). */
import type { PluginDefinition } from '../../plugins/registry.js';
import { fcfsOrderingPolicyDefinition } from './fcfs-ordering-policy.js';
import { globalStrictFairnessPolicyDefinition } from './global-strict-fairness-policy.js';
import { staticUsageLimitPolicyDefinition } from './static-usage-limit-policy.js';

export * from './types.js';
export { FCFS_ORDERING_POLICY, fcfsOrderingPolicyDefinition } from './fcfs-ordering-policy.js';
export { GLOBAL_STRICT_FAIRNESS_POLICY, globalStrictFairnessPolicyDefinition } from './global-strict-fairness-policy.js';
export { STATIC_USAGE_LIMIT_POLICY, staticUsageLimitPolicyDefinition } from './static-usage-limit-policy.js';

export const flowControlPolicyDefinitions: PluginDefinition[] = [
  fcfsOrderingPolicyDefinition,
  globalStrictFairnessPolicyDefinition,
  staticUsageLimitPolicyDefinition,
];
