/**
 * `round-robin-fairness-policy` — fairness policy. No parameters. Unit of fairness = dispatch turns
 * (one request per turn, whatever its size).
 *
 * Per band, a cursor holds the id of the last selected flow. Selection starts at the first flow
 * whose id is greater than the cursor (so "just after it", also when that flow has since been
 * removed), wraps around, and returns the first non-empty flow; the cursor moves to it. No cursor
 * → start at the first flow. When every flow is empty the cursor is reset (as llm-d does).
 *
 * Flows arrive sorted by id ascending; ids are compared by UTF-16 code unit (`<`), the order of
 * `Array.prototype.sort()`. Within one band all flows share a priority, so this is llm-d's FlowKey
 * order. Divergence: llm-d restarts at the first flow when the cursor's flow is gone; we continue
 * after its position, which keeps the rotation fair across flow GC.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { FairnessPolicy, FlowSelector, FlowView } from './types.js';

export const ROUND_ROBIN_FAIRNESS_POLICY = 'round-robin-fairness-policy';

const roundRobinParams = z.strictObject({});

export class RoundRobinSelector implements FlowSelector {
  /** Id of the last selected flow; undefined before the first pick or after an all-empty pass. */
  cursor: string | undefined = undefined;

  select(flows: readonly FlowView[]): number {
    const n = flows.length;
    let start = 0;
    if (this.cursor !== undefined) {
      const cursor = this.cursor;
      start = flows.findIndex((f) => f.id > cursor);
      if (start === -1) start = 0; // cursor was the last id: wrap
    }
    for (let k = 0; k < n; k++) {
      const i = (start + k) % n;
      const flow = flows[i]!;
      if (flow.length > 0) {
        this.cursor = flow.id;
        return i;
      }
    }
    this.cursor = undefined;
    return -1;
  }
}

export function createRoundRobinFairnessPolicy(name: string): FairnessPolicy {
  return { type: ROUND_ROBIN_FAIRNESS_POLICY, name, newBandSelector: () => new RoundRobinSelector() };
}

export const roundRobinFairnessPolicyDefinition: PluginDefinition<z.output<typeof roundRobinParams>> = {
  type: ROUND_ROBIN_FAIRNESS_POLICY,
  kinds: ['fairnessPolicy'],
  params: roundRobinParams,
  create: (name) => createRoundRobinFairnessPolicy(name),
};
