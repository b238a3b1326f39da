/**
 * Flow-control outcome → HTTP answer (SPEC §5, reference §2.11, llm-d-router column — not GIE v1.x,
 * which answers 503 for TTL and 500 for shutdown).
 *
 * Our controller has no pre-admission buffer, so Rejected/EvictedOther never wrap a TTL expiry or a
 * client cancel (those arrive as EvictedTTL / EvictedContextCancelled); the only "other" causes are
 * shutdown and internal errors. A refusal on arrival may say the body can never fit (Sluice: its own
 * 429, with `x-should-retry: false`, whether the pool has endpoints or not).
 */
import type { FlowOutcome, OutcomeCause } from './types.js';

export type FlowDroppedReason =
  | 'rejected-saturated'
  | 'rejected-ttl-expired'
  | 'rejected-no-endpoints'
  | 'rejected-context-cancelled'
  | 'rejected-shutting-down';

/** Shared and frozen: do not mutate. */
export interface FlowHttpAnswer {
  readonly status: number;
  /** Value of `x-llm-d-request-dropped-reason`; undefined for internal errors. */
  readonly droppedReason: FlowDroppedReason | undefined;
  readonly message: string;
  /** The same request would get the same answer again (`x-should-retry: false`). */
  readonly final?: true;
  /** `retry-after`, seconds: a refusal a retry soon may pass. */
  readonly retryAfterSeconds?: number;
}

// Messages follow llm-d's prefixes (reference §2.11); frozen and shared, no per-request building.
// A full queue is a burst's: `retry-after` makes the clients that retry no 429 without it
// (LangChain) try again, and the others wait a second rather than their own back-off. Not on a
// time-out in the queue: that request waited its TTL already, a retry is the client's call.
const CAPACITY: FlowHttpAnswer = Object.freeze({
  status: 429,
  droppedReason: 'rejected-saturated',
  message: 'flow control queue is at capacity',
  retryAfterSeconds: 1,
});
const LARGER_THAN_CAPACITY: FlowHttpAnswer = Object.freeze({
  status: 429,
  droppedReason: 'rejected-saturated',
  message: "request body is larger than its priority band's maxBytes (or flowControl.maxBytes): it can never be queued, a retry cannot help",
  final: true,
});
const NO_ENDPOINTS_FULL: FlowHttpAnswer = Object.freeze({
  status: 503,
  droppedReason: 'rejected-no-endpoints',
  message: 'no endpoints available: flow control queue is at capacity',
});
const NO_ENDPOINTS_TIMED_OUT: FlowHttpAnswer = Object.freeze({
  status: 503,
  droppedReason: 'rejected-no-endpoints',
  message: 'request timed out in queue and no endpoints are available',
});
const TTL_EXPIRED: FlowHttpAnswer = Object.freeze({
  status: 429,
  droppedReason: 'rejected-ttl-expired',
  message: 'request timed out in queue',
});
const CANCELLED: FlowHttpAnswer = Object.freeze({
  status: 503,
  droppedReason: 'rejected-context-cancelled',
  message: 'client disconnected',
});
const SHUTTING_DOWN: FlowHttpAnswer = Object.freeze({
  status: 503,
  droppedReason: 'rejected-shutting-down',
  message: 'flow controller shutting down',
});
const INTERNAL: FlowHttpAnswer = Object.freeze({
  status: 500,
  droppedReason: undefined,
  message: 'internal flow control error',
});

/**
 * The HTTP answer for a terminal outcome; undefined for `Dispatched` (the request proceeds).
 * `poolEmptyNow` is probed by the caller at translation time: a TTL eviction while the pool has no
 * endpoints reads as "no endpoints" (503), as in llm-d.
 */
export function outcomeToHttp(
  outcome: FlowOutcome,
  cause: OutcomeCause | undefined,
  poolEmptyNow: boolean,
): FlowHttpAnswer | undefined {
  switch (outcome) {
    case 'Dispatched':
      return undefined;
    case 'RejectedCapacity':
      return cause === 'larger-than-capacity' ? LARGER_THAN_CAPACITY : CAPACITY;
    case 'RejectedNoEndpoints':
      // Endpoints coming back would not make room for it.
      return cause === 'larger-than-capacity' ? LARGER_THAN_CAPACITY : NO_ENDPOINTS_FULL;
    case 'EvictedNoEndpoints':
      return NO_ENDPOINTS_TIMED_OUT;
    case 'EvictedTTL':
      return poolEmptyNow ? NO_ENDPOINTS_TIMED_OUT : TTL_EXPIRED;
    case 'EvictedContextCancelled':
      return CANCELLED;
    case 'RejectedOther':
    case 'EvictedOther':
      return cause === 'shutting-down' ? SHUTTING_DOWN : INTERNAL;
    default:
      return {
        status: 500,
        droppedReason: undefined,
        message: `unhandled flow control outcome: ${String(outcome satisfies never)}`,
      };
  }
}
