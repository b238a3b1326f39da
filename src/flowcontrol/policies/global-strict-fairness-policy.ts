/**
 * `global-strict-fairness-policy` — fairness policy (the llm-d default). No parameters. Stateless.
 *
 * The band behaves as one global queue: among the band's non-empty flows, pick the flow whose head
 * is best by the band's ordering policy (`ordering.compare(headA, headB) < 0`); ties go to the flow
 * with the least id, so they are deterministic. The controller keeps the flows in a heap by head
 * (`BandView.bestHead`), so a pick costs O(log F) where llm-d scans every flow.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { FairnessPolicy, FlowSelector } from './types.js';

export const GLOBAL_STRICT_FAIRNESS_POLICY = 'global-strict-fairness-policy';

const globalStrictParams = z.strictObject({});

// No per-band state, so every band can share one selector.
const globalStrictSelector: FlowSelector = { select: (band) => band.bestHead() };

export function createGlobalStrictFairnessPolicy(name: string): FairnessPolicy {
  return { type: GLOBAL_STRICT_FAIRNESS_POLICY, name, newBandSelector: () => globalStrictSelector };
}

export const globalStrictFairnessPolicyDefinition: PluginDefinition<z.output<typeof globalStrictParams>> = {
  type: GLOBAL_STRICT_FAIRNESS_POLICY,
  kinds: ['fairnessPolicy'],
  params: globalStrictParams,
  create: (name) => createGlobalStrictFairnessPolicy(name),
};
