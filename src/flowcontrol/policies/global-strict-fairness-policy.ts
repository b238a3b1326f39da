/**
 * `global-strict-fairness-policy` — fairness policy (the llm-d default). No parameters. Stateless.
 *
 * The band behaves as one global queue: among the band's non-empty flows, pick the flow whose head
 * is best by the band's ordering policy (`ordering.compare(headA, headB) < 0`). Ties go to the first
 * flow listed (flows arrive sorted by id, so ties are deterministic).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { FairnessPolicy, FlowSelector, FlowView, OrderingPolicy, QueuedItemView } from './types.js';

export const GLOBAL_STRICT_FAIRNESS_POLICY = 'global-strict-fairness-policy';

const globalStrictParams = z.strictObject({});

/** Index of the flow with the best head by `ordering`, or -1 when every flow is empty. */
export function selectBestHead(flows: readonly FlowView[], ordering: OrderingPolicy): number {
  let best = -1;
  let bestHead: QueuedItemView | undefined;
  for (let i = 0; i < flows.length; i++) {
    const flow = flows[i]!;
    if (flow.length <= 0) continue;
    const head = flow.head();
    if (head === undefined) continue;
    // Strict < keeps the earlier flow on ties.
    if (bestHead === undefined || ordering.compare(head, bestHead) < 0) {
      best = i;
      bestHead = head;
    }
  }
  return best;
}

// No per-band state, so every band can share one selector.
const globalStrictSelector: FlowSelector = { select: selectBestHead };

export function createGlobalStrictFairnessPolicy(name: string): FairnessPolicy {
  return { type: GLOBAL_STRICT_FAIRNESS_POLICY, name, newBandSelector: () => globalStrictSelector };
}

export const globalStrictFairnessPolicyDefinition: PluginDefinition<z.output<typeof globalStrictParams>> = {
  type: GLOBAL_STRICT_FAIRNESS_POLICY,
  kinds: ['fairnessPolicy'],
  params: globalStrictParams,
  create: (name) => createGlobalStrictFairnessPolicy(name),
};
