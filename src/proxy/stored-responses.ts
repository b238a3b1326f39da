/**
 * Where each stored Responses API answer lives, so that a request continuing it goes back there.
 *
 * vLLM keeps a response made with `store: true` (when started with VLLM_ENABLE_RESPONSES_API_STORE)
 * in that server's memory alone, and a request naming it in `previous_response_id` is built from it:
 * any other server answers 404 "Response with id '…' not found.". So Sluice remembers, for each
 * stored response it relayed, the server that made it (by origin: an endpoint a reload moved to
 * another address is another server), and sends a request continuing it to that server while it is
 * eligible, whatever the scorers say; its prefix cache holds the conversation too.
 *
 * Bounded: the newest `capacity` responses (`server.storedResponses`); an id it forgot, or never
 * saw (another Sluice replica relayed it), is scheduled as usual.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { SchedulingRequest } from '../scheduling/framework.js';

/** What became of a request's `previous_response_id` (`sluice_previous_response_routing_total{result}`). */
export const PREVIOUS_RESPONSE_RESULTS = ['pinned', 'unknown', 'unavailable'] as const;
export type PreviousResponseResult = (typeof PREVIOUS_RESPONSE_RESULTS)[number];

export class StoredResponses {
  /** Response id → origin of the server holding it, oldest first (a Map keeps insertion order). */
  private readonly origins = new Map<string, string>();

  constructor(private capacity: number) {}

  get size(): number {
    return this.origins.size;
  }

  /** A new capacity (on reload): the oldest entries past it are forgotten now. */
  resize(capacity: number): void {
    this.capacity = capacity;
    this.evict();
  }

  remember(id: string, origin: string): void {
    if (this.capacity === 0) return;
    // Re-inserted: a known id moves to the newest end.
    this.origins.delete(id);
    this.origins.set(id, origin);
    this.evict();
  }

  originOf(id: string): string | undefined {
    return this.origins.get(id);
  }

  private evict(): void {
    const { origins } = this;
    if (origins.size <= this.capacity) return;
    for (const id of origins.keys()) {
      origins.delete(id);
      if (origins.size <= this.capacity) return;
    }
  }
}

/** The `previous_response_id` of a Responses API request; undefined for any other request. */
export function previousResponseId(req: SchedulingRequest): string | undefined {
  if (req.api !== 'responses') return undefined;
  const id = req.body.previous_response_id;
  return typeof id === 'string' && id !== '' ? id : undefined;
}

/**
 * The origin of the server holding the response `req` continues and what that means for it: pinned
 * there when it is one of the `candidates`; `unavailable` when it is not (it left the pool, or is
 * ejected); `unknown` when no stored response of that id was relayed (or it was forgotten).
 * Undefined for a request that continues no response.
 */
export function homeOf(
  req: SchedulingRequest,
  candidates: readonly Endpoint[],
  stored: StoredResponses,
): { result: PreviousResponseResult; origin?: string } | undefined {
  const id = previousResponseId(req);
  if (id === undefined) return undefined;
  const origin = stored.originOf(id);
  if (origin === undefined) return { result: 'unknown' };
  for (const c of candidates) if (c.origin === origin) return { result: 'pinned', origin };
  return { result: 'unavailable' };
}

/** The candidates of a request pinned to `origin`: that server alone, or none when it is not among them. */
export function pinnedTo(candidates: readonly Endpoint[], origin: string | undefined): readonly Endpoint[] {
  if (origin === undefined) return candidates;
  for (const c of candidates) if (c.origin === origin) return [c];
  return [];
}

/**
 * The id of a stored response in a Responses API answer (the response object: the JSON answer, or
 * a stream event's `response`), when the server says it stored it: `store` true, or absent (a server
 * that does not say). Undefined for anything else.
 */
export function storedResponseId(response: unknown): string | undefined {
  if (typeof response !== 'object' || response === null) return undefined;
  const { id, object, store } = response as { id?: unknown; object?: unknown; store?: unknown };
  if (typeof id !== 'string' || id === '' || object !== 'response' || store === false) return undefined;
  return id;
}
