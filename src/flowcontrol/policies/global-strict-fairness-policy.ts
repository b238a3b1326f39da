/**
 * `global-strict-fairness-policy`: the band behaves as one global FCFS queue — the flow whose head
 * request has waited longest goes next. Ties go to the first flow listed. Stateless.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { FairnessPolicy, FlowView } from './types.js';

export const GLOBAL_STRICT_FAIRNESS_POLICY = 'global-strict-fairness-policy';

const globalStrictParams = z.strictObject({});

export function selectOldestHead(flows: readonly FlowView[]): number {
  let best = -1;
  for (let i = 0; i < flows.length; i++) {
    const flow = flows[i]!;
    if (flow.length <= 0) continue;
    if (best === -1 || flow.headEnqueuedAt < flows[best]!.headEnqueuedAt) best = i;
  }
  return best;
}

export function createGlobalStrictFairnessPolicy(name: string): FairnessPolicy {
  return { type: GLOBAL_STRICT_FAIRNESS_POLICY, name, selectFlow: selectOldestHead };
}

export const globalStrictFairnessPolicyDefinition: PluginDefinition<z.output<typeof globalStrictParams>> = {
  type: GLOBAL_STRICT_FAIRNESS_POLICY,
  kinds: ['fairnessPolicy'],
  params: globalStrictParams,
  create: (name) => createGlobalStrictFairnessPolicy(name),
};
