/**
 * Where each stored Responses API answer lives, so that a request continuing it goes back there.
 *
 * vLLM keeps a response made with `store: true` (when started with VLLM_ENABLE_RESPONSES_API_STORE)
 * in that server's memory alone, and a request naming it in `previous_response_id` is built from it:
 * any other server answers 404 "Response with id '…' not found.". vLLM's answer does not say
 * whether it stored the response, so Sluice remembers, for each Responses API answer it relayed
 * whole (2xx) to a request that did not say `store: false`, the server that made it (by origin: an
 * endpoint a reload moved to another address is another server), and sends a request continuing it
 * to that server while it is in the pool, whatever the scorers say; its prefix cache holds the
 * conversation too.
 *
 * Bounded: the newest `capacity` responses (`server.storedResponses`), ids of at most
 * MAX_RESPONSE_ID_LENGTH characters. An id it forgot, or never saw (another Sluice replica relayed
 * it, or the gateway restarted since), is scheduled as usual; when the server it reaches answers that
 * it does not hold that response (saysNotHeld), forward.ts asks the next server, each once (those
 * set aside last), and remembers the one that answers 2xx.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { SchedulingRequest } from '../scheduling/framework.js';

/** What became of a request's `previous_response_id` (`sluice_previous_response_routing_total{result}`). */
export const PREVIOUS_RESPONSE_RESULTS = ['pinned', 'unknown', 'unavailable'] as const;
export type PreviousResponseResult = (typeof PREVIOUS_RESPONSE_RESULTS)[number];

/**
 * How the search for a response the gateway did not know ended, once its first server answered it
 * does not hold it (`sluice_previous_response_search_total{result}`): `found` on another server, or
 * `not_found` on any (that 404 relayed).
 */
export const PREVIOUS_RESPONSE_SEARCH_RESULTS = ['found', 'not_found'] as const;
export type PreviousResponseSearchResult = (typeof PREVIOUS_RESPONSE_SEARCH_RESULTS)[number];

export class StoredResponses {
  /** Response id → origin of the server holding it, oldest first (a Map keeps insertion order). */
  private readonly origins = new Map<string, string>();

  constructor(private capacity: number) {}

  /** Whether it remembers anything (a capacity of 0 turns it off). */
  get enabled(): boolean {
    return this.capacity > 0;
  }

  get size(): number {
    return this.origins.size;
  }

  /** A new capacity (on reload): the oldest entries past it are forgotten now. */
  resize(capacity: number): void {
    this.capacity = capacity;
    this.evict();
  }

  /** Remembers `id`'s server; an id longer than MAX_RESPONSE_ID_LENGTH is not remembered (bounded memory). */
  remember(id: string, origin: string): void {
    if (this.capacity === 0 || id.length > MAX_RESPONSE_ID_LENGTH) return;
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

/** Where a request continuing a stored response goes (forward.ts): what was known of its server, and that server. */
export interface Home {
  result: PreviousResponseResult;
  /** Set when `pinned`: the server holding the response. */
  endpoint?: Endpoint;
}

/**
 * The server holding the response `req` continues: `pinned` there while it is in the pool — even
 * when outlier detection set it aside, since any other server would answer 404 for sure; `unavailable`
 * when it left the pool (or moved to another address); `unknown` when no response of that id was
 * relayed (or it was forgotten). Undefined for a request that continues no response.
 */
export function homeOf(req: SchedulingRequest, pool: readonly Endpoint[], stored: StoredResponses): Home | undefined {
  const id = previousResponseId(req);
  if (id === undefined) return undefined;
  const origin = stored.originOf(id);
  if (origin === undefined) return UNKNOWN;
  const endpoint = serverAt(pool, origin);
  return endpoint === undefined ? UNAVAILABLE : { result: 'pinned', endpoint };
}

const UNKNOWN: Home = Object.freeze({ result: 'unknown' });
const UNAVAILABLE: Home = Object.freeze({ result: 'unavailable' });

/** The candidates of a request: its home alone when pinned, else `eligible`. */
export const candidatesFor = (home: Home | undefined, eligible: readonly Endpoint[]): readonly Endpoint[] =>
  home?.endpoint !== undefined ? [home.endpoint] : eligible;

/** The endpoint of `pool` at `origin` (an endpoint's address and port are unique). */
export function serverAt(pool: readonly Endpoint[], origin: string): Endpoint | undefined {
  for (const e of pool) if (e.origin === origin) return e;
  return undefined;
}

/** Longest response id remembered: vLLM's are 37 characters, but its `request_id` lets a client choose one. */
export const MAX_RESPONSE_ID_LENGTH = 256;

/** The id of a Responses API response object (a JSON answer, or a stream event's `response`). */
export function responseIdOf(response: unknown): string | undefined {
  if (typeof response !== 'object' || response === null) return undefined;
  const { id, object } = response as { id?: unknown; object?: unknown };
  return typeof id === 'string' && id !== '' && object === 'response' ? id : undefined;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * The id of a JSON Responses API answer from its first bytes: vLLM and OpenAI write `id` as the
 * response object's first member, so a large answer (logprobs) need not be kept or parsed whole.
 * Undefined when the answer does not begin `{"id":"…"`.
 */
export function responseIdAtHead(head: Buffer): string | undefined {
  let i = head[0] === 0xef && head[1] === 0xbb && head[2] === 0xbf ? 3 : 0; // a byte-order mark
  const skip = (): void => {
    while (i < head.length && (head[i] === 0x20 || head[i] === 0x0a || head[i] === 0x0d || head[i] === 0x09)) i++;
  };
  skip();
  if (head[i++] !== 0x7b /* { */) return undefined;
  skip();
  if (head.toString('latin1', i, i + 4) !== '"id"') return undefined;
  i += 4;
  skip();
  if (head[i++] !== 0x3a /* : */) return undefined;
  skip();
  if (head[i] !== QUOTE) return undefined;
  const start = i;
  for (i++; i < head.length && i - start <= MAX_RESPONSE_ID_LENGTH * 6; i++) {
    if (head[i] === BACKSLASH) i++;
    else if (head[i] === QUOTE) {
      try {
        const id: unknown = JSON.parse(head.toString('utf8', start, i + 1));
        return typeof id === 'string' && id !== '' ? id : undefined;
      } catch {
        return undefined;
      }
    }
  }
  return undefined;
}

/** A not-found answer is a short JSON error: a 404 longer than this is relayed as it comes, unread. */
export const MAX_NOT_HELD_ANSWER = 64 << 10;

/**
 * Whether a 404 answer `body` says the server does not hold response `id`: vLLM's
 * `Response with id '<id>' not found.` (in `error.message`, or `message` in vLLM's older error body),
 * or OpenAI's `Previous response with id '<id>' not found.`. Any other 404 (another model, a path)
 * is about the request, not the server, and is relayed as it came.
 */
export function saysNotHeld(body: Buffer, id: string): boolean {
  let answer: unknown;
  try {
    answer = JSON.parse(body.toString('utf8'));
  } catch {
    return false;
  }
  if (typeof answer !== 'object' || answer === null) return false;
  const { error, message } = answer as { error?: { message?: unknown }; message?: unknown };
  const text = typeof error === 'object' && error !== null ? error.message : message;
  return text === `Response with id '${id}' not found.` || text === `Previous response with id '${id}' not found.`;
}
