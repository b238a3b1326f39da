/**
 * Flow-control policy contracts (reference §2.7–2.9). The controller hands policies plain views of
 * its queues, so policies stay pure and testable without a running controller.
 */
import type { Plugin } from '../../scheduling/framework.js';

/** What an ordering policy may see of a queued request. Times are clock milliseconds. */
export interface QueuedItemView {
  /** When flow control accepted the request (FCFS key). */
  readonly enqueuedAt: number;
  /** When the gateway received the request (SLO deadlines count from here). */
  readonly receivedAt: number;
  /** enqueuedAt + effective TTL; Infinity when the request has no TTL. */
  readonly ttlDeadline: number;
  /** receivedAt + `x-llm-d-slo-ttft-ms`; Infinity when absent or invalid. */
  readonly sloDeadline: number;
  readonly byteSize: number;
}

/** Orders requests within one flow: negative when `a` should be dispatched before `b`. Must be a total order. */
export interface OrderingPolicy extends Plugin {
  compare(a: QueuedItemView, b: QueuedItemView): number;
}

/** What a fairness policy may see of one flow (fairness id) of a band. */
export interface FlowView {
  readonly id: string;
  readonly priority: number;
  /** Queued requests in this flow. */
  readonly length: number;
  /** The flow's best request by the band's ordering policy; undefined when empty. */
  head(): QueuedItemView | undefined;
}

/**
 * The non-empty flows of one band, as a fairness policy asks about them. Clients choose fairness
 * ids, so a band may hold 100 000 flows: the controller answers each question in O(log F), where a
 * scan of the flows would cost O(F) per dispatch. Ids are ordered by UTF-16 code unit (`<`), the
 * order of `Array.prototype.sort()`.
 */
export interface BandView {
  /** The flow with the least id greater than `id` (`undefined`: the least id of all); undefined when there is none. */
  flowAfter(id: string | undefined): FlowView | undefined;
  /** The flow whose head is best by the band's ordering policy, ties to the least id; undefined when the band is empty. */
  bestHead(): FlowView | undefined;
}

/** Chooses which flow of ONE band dispatches next; may keep per-band state (e.g. a round-robin cursor). */
export interface FlowSelector {
  /** The flow that dispatches next (one of `band`'s), or undefined when the band holds no request. */
  select(band: BandView, ordering: OrderingPolicy): FlowView | undefined;
}

export interface FairnessPolicy extends Plugin {
  /** A selector for one band; called once per band so per-band state stays separate. */
  newBandSelector(): FlowSelector;
}

/** Priority ceilings: a band dispatches only while saturation < its ceiling. */
export interface UsageLimitPolicy extends Plugin {
  /**
   * Called exactly once per dispatch cycle. `priorities` are all provisioned bands, highest first;
   * `out` (same length) is pre-filled with 1.0 and receives each band's ceiling. Ceilings must not
   * increase towards lower priorities. May keep small state between calls (soft-reflective tick).
   */
  computeCeilings(saturation: number, priorities: readonly number[], out: Float64Array): void;
  /**
   * Optional: true when the ceilings of the last call would change at the next call by themselves
   * (soft-reflective's alternation). While requests wait, the controller then runs another cycle
   * 1 ms later, as llm-d's dispatch loop runs every 1 ms; its cycles otherwise follow events only.
   */
  changesNextCycle?(): boolean;
}
