/**
 * Every built-in flow-control policy (reference §2.7–2.9): fairness (which flow of a band next),
 * ordering (which request of a flow next) and usage limits (per-band priority ceilings). The config
 * loader injects fcfs / global-strict / static by default (SPEC §3.5); builtin.ts registers them all.
 */
import type { PluginDefinition } from '../../plugins/registry.js';
import { edfOrderingPolicyDefinition } from './edf-ordering-policy.js';
import { fcfsOrderingPolicyDefinition } from './fcfs-ordering-policy.js';
import { globalStrictFairnessPolicyDefinition } from './global-strict-fairness-policy.js';
import { priorityHoldbackPolicyDefinition } from './priority-holdback-policy.js';
import { roundRobinFairnessPolicyDefinition } from './round-robin-fairness-policy.js';
import { sloDeadlineOrderingPolicyDefinition } from './slo-deadline-ordering-policy.js';
import { softReflectiveCeilingPolicyDefinition } from './soft-reflective-ceiling-policy.js';
import { staticUsageLimitPolicyDefinition } from './static-usage-limit-policy.js';

export * from './types.js';
export { FCFS_ORDERING_POLICY, compareFcfs, compareNumbers, fcfsOrderingPolicyDefinition } from './fcfs-ordering-policy.js';
export { EDF_ORDERING_POLICY, compareEdf, edfOrderingPolicyDefinition } from './edf-ordering-policy.js';
export {
  SLO_DEADLINE_ORDERING_POLICY,
  SLO_TTFT_HEADER,
  SLO_TTFT_HEADER_DEPRECATED,
  compareSloDeadline,
  parseSloTtftHeader,
  sloDeadlineOrderingPolicyDefinition,
} from './slo-deadline-ordering-policy.js';
export {
  GLOBAL_STRICT_FAIRNESS_POLICY,
  globalStrictFairnessPolicyDefinition,
} from './global-strict-fairness-policy.js';
export {
  ROUND_ROBIN_FAIRNESS_POLICY,
  RoundRobinSelector,
  roundRobinFairnessPolicyDefinition,
} from './round-robin-fairness-policy.js';
export { STATIC_USAGE_LIMIT_POLICY, staticUsageLimitPolicyDefinition } from './static-usage-limit-policy.js';
export { PRIORITY_HOLDBACK_POLICY, priorityHoldbackPolicyDefinition } from './priority-holdback-policy.js';
export {
  SOFT_REFLECTIVE_CEILING_POLICY,
  SoftReflectiveCeilingPolicy,
  softReflectiveCeilingPolicyDefinition,
} from './soft-reflective-ceiling-policy.js';

export const flowControlPolicyDefinitions: PluginDefinition[] = [
  // ordering
  fcfsOrderingPolicyDefinition,
  edfOrderingPolicyDefinition,
  sloDeadlineOrderingPolicyDefinition,
  // fairness
  globalStrictFairnessPolicyDefinition,
  roundRobinFairnessPolicyDefinition,
  // usage limits
  staticUsageLimitPolicyDefinition,
  priorityHoldbackPolicyDefinition,
  softReflectiveCeilingPolicyDefinition,
];
