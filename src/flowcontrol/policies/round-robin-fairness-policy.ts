/**
 * `round-robin-fairness-policy` — fairness policy. No parameters. Unit of fairness = dispatch turns
 * (one request per turn, whatever its size).
 *
 * Per band, a cursor holds the id of the last selected flow. The next pick is the flow with the least
 * id greater than the cursor (so "just after it", also when that flow has since left the band),
 * wrapping around to the least id; the cursor moves to it. No cursor → the least id. When the band
 * is empty the cursor is reset (as llm-d does). Each pick is O(log F) (`BandView.flowAfter`).
 *
 * Ids are compared by UTF-16 code unit (`<`), the order of `Array.prototype.sort()`. Within one band
 * all flows share a priority, so this is llm-d's FlowKey order. Divergence: llm-d restarts at the
 * first flow when the cursor's flow is gone; we continue after its position, which keeps the
 * rotation fair across flow GC.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { BandView, FairnessPolicy, FlowSelector, FlowView } from './types.js';

export const ROUND_ROBIN_FAIRNESS_POLICY = 'round-robin-fairness-policy';

const roundRobinParams = z.strictObject({});

export class RoundRobinSelector implements FlowSelector {
  /** Id of the last selected flow; undefined before the first pick or after an empty band. */
  cursor: string | undefined = undefined;

  select(band: BandView): FlowView | undefined {
    const cursor = this.cursor;
    const next = band.flowAfter(cursor) ?? (cursor === undefined ? undefined : band.flowAfter(undefined));
    this.cursor = next?.id;
    return next;
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
