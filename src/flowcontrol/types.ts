/**
 * The flow controller's contract with the request path. A request enters with `enqueue`, and its
 * `onOutcome` is called exactly once: `Dispatched` (synchronously inside a dispatch cycle, so the
 * caller can schedule and count the request in flight before the next saturation sample), or one
 * of the rejection/eviction outcomes.
 */

export const FLOW_OUTCOMES = [
  'Dispatched',
  'RejectedCapacity',
  'RejectedNoEndpoints',
  'RejectedOther',
  'EvictedTTL',
  'EvictedNoEndpoints',
  'EvictedContextCancelled',
  'EvictedOther',
] as const;

export type FlowOutcome = (typeof FLOW_OUTCOMES)[number];

/**
 * Why a Rejected/EvictedOther happened (drives the HTTP mapping of reference §2.11); for a
 * RejectedCapacity or RejectedNoEndpoints, `larger-than-capacity`: the body alone exceeds a
 * `maxBytes` it must fit in, so no retry can ever queue it.
 */
export type OutcomeCause = 'shutting-down' | 'internal' | 'larger-than-capacity';

export interface FlowRequest {
  readonly fairnessId: string;
  /** Priority from the objective (may have no band: then band 0 serves it, metrics keep this value). */
  readonly priority: number;
  /** Request body bytes (capacity accounting). */
  readonly byteSize: number;
  /** Clock ms when the gateway received it. */
  readonly receivedAt: number;
  /** `x-llm-d-slo-ttft-ms` in ms, when given and valid. */
  readonly sloTtftMs?: number;
  /** `x-llm-d-inference-ttl` in ms, when given, valid and positive (request-ttl.ts). */
  readonly requestTtlMs?: number;
  /**
   * Called exactly once. For `Dispatched` it runs synchronously inside the dispatch cycle;
   * `queuedMs` is the time spent in flow control.
   */
  onOutcome(outcome: FlowOutcome, queuedMs: number, cause?: OutcomeCause): void;
  /**
   * Sluice (`flowControl.affinityLookahead`): true when the request would rather stay queued than be
   * sent now, because the endpoint it suits best is saturated and the one it would go to suits it
   * clearly worse. Asked only when a later request might overtake it; must not change anything.
   */
  prefersToWait?(): boolean;
}

/** A queued request, as the caller holds it to cancel (client disconnect). */
export interface FlowTicket {
  /** Removes the request at once if still queued (→ EvictedContextCancelled). No-op after the outcome. */
  cancel(): void;
}
