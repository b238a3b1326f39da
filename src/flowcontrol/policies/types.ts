/**
 * Flow-control policy contracts (reference §2.7–2.9). The controller hands policies plain views of
 * its queues, so policies stay pure and testable without a running controller.
 */
import type { Plugin } from '../../scheduling/framework.js';

/** What an ordering policy may see of a queued request. Times are clock milliseconds. */
export interface QueuedItemView {
  enqueuedAt: number;
  /** Absolute deadline (ms) when the request has one (TTL or SLO header). */
  deadline?: number;
  byteSize: number;
}

/** Orders requests within one flow: negative when `a` should be dispatched before `b`. */
export interface OrderingPolicy extends Plugin {
  compare(a: QueuedItemView, b: QueuedItemView): number;
}

/** What a fairness policy may see of one flow (fairness id) in a band. */
export interface FlowView {
  id: string;
  /** Enqueue time of the flow's head request (meaningless when `length` is 0). */
  headEnqueuedAt: number;
  length: number;
}

/** Picks the flow of a band that dispatches next. */
export interface FairnessPolicy extends Plugin {
  /** Index into `flows` of the chosen flow, or -1 when every flow is empty. */
  selectFlow(flows: readonly FlowView[]): number;
}

/** Priority ceilings: a band dispatches only while saturation < its ceiling. */
export interface UsageLimitPolicy extends Plugin {
  /**
   * Ceiling for the band of `priority`, given every provisioned priority (highest first).
   * Ceilings must not increase towards lower priorities.
   */
  ceiling(priority: number, priorities: readonly number[]): number;
}
