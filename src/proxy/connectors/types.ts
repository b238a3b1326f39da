/**
 * Connectors carry out a prefill/decode decision (SPEC §7.4). The proxy (forward.ts) owns HTTP,
 * in-flight accounting, aborts and streaming; a connector only decides what the legs look like:
 * it may send one prefill leg through `sendPrefill` and then says what to send to the decode
 * endpoint — or that the client gets the prefill answer instead.
 */
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { ApiKind, ConnectorName } from '../../scheduling/framework.js';

export type ResponseHeaders = Record<string, string | string[] | undefined>;

/** A prefill leg as the proxy ran it (the answer is read completely: prefill answers are small). */
export type PrefillLegResult =
  /** `json`: the body parsed, when it is a JSON object (the proxy reads a 2xx to judge the server; absent: not read or not one). */
  | { kind: 'answer'; status: number; headers: ResponseHeaders; body: Buffer; json?: Record<string, unknown> }
  /** Connection error, time-out or broken answer: nothing usable came back. */
  | { kind: 'failed'; error: string }
  /** The client went away; the leg was aborted. */
  | { kind: 'aborted' };

/** `bytes` parsed, when they are a JSON object; undefined otherwise. */
export function jsonObjectOf(bytes: Buffer): Record<string, unknown> | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString('utf8'));
  } catch {
    return undefined;
  }
  return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : undefined;
}

/** Sends `body` to the chosen prefill endpoint, same path and headers as the client request. */
export type SendPrefill = (body: Buffer) => Promise<PrefillLegResult>;

export interface PdInput {
  /** The request body as received. */
  raw: Buffer;
  /** The same body, parsed (read-only). */
  body: Readonly<Record<string, unknown>>;
  api: ApiKind;
  /** The prefill endpoint the scheduler chose. */
  prefill: Endpoint;
}

/** What the decode endpoint gets. */
export interface DecodeLeg {
  body: Buffer;
  /** Extra request headers (e.g. `x-prefiller-host-port`). */
  headers?: Readonly<Record<string, string>>;
  /** When set, `usage.prompt_tokens_details.cached_tokens` of the answer is replaced by this. */
  cachedTokens?: number;
  /** The decode endpoint computes the prompt itself: P/D fell back (no KV came from a prefill leg). */
  recomputesPrompt?: boolean;
}

export type PdStep =
  /** Go on with the decode leg. `warning`: why P/D was abandoned (decode-only) or degraded, for the log. */
  | { kind: 'decode'; leg: DecodeLeg; warning?: string }
  /** Answer the client with this (a prefill 4xx) and send nothing to decode. */
  | { kind: 'reply'; status: number; headers: ResponseHeaders; body: Buffer }
  /** The client went away during the prefill leg: start nothing else. */
  | { kind: 'aborted' };

export interface Connector {
  readonly name: ConnectorName;
  /**
   * true when the gateway runs a prefill leg itself: the decode leg it prepared stays valid if the
   * decode endpoint has to be retried, so the prefill is not repeated.
   */
  readonly runsPrefill: boolean;
  /** Returns a plain step when no prefill leg is needed (no extra turn of the event loop). */
  carryOut(input: PdInput, sendPrefill: SendPrefill): PdStep | Promise<PdStep>;
}

/** A decode leg that is the client's request unchanged: P/D fell back, the decoder computes the prompt. */
export function decodeOnly(raw: Buffer, warning?: string): PdStep {
  const leg: DecodeLeg = { body: raw, recomputesPrompt: true };
  return warning === undefined ? { kind: 'decode', leg } : { kind: 'decode', leg, warning };
}

/**
 * Prefill answers the client sees as they are (llm-d: 400–451; Sluice: any 4xx but 404). A 404 says
 * the prefill server lacks the model (one being replaced by another model's server, a prefill tier
 * without it), not that the request is wrong: the decode server, chosen for the model, computes the
 * prompt itself (and answers its own 404 if it lacks the model too).
 */
export function isClientError(status: number): boolean {
  return status >= 400 && status <= 499 && status !== 404;
}

/** The body of a prefill leg limited to one output token (chat and completions field names). */
export function oneTokenBody(body: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...body, max_tokens: 1, max_completion_tokens: 1 };
  // A min_tokens above the one-token limit would make vLLM refuse the prefill leg (400); the decode
  // leg keeps the client's value (as vLLM's own P/D proxy does).
  delete out.min_tokens;
  delete out.min_completion_tokens;
  return out;
}

/** A body that parsed but cannot be serialised again (nested deeper than JSON.stringify's stack). */
export class BodyNotRewritableError extends Error {
  constructor(cause: Error) {
    super(`the request body cannot be rewritten for the prefill leg (${cause.message})`);
    this.name = 'BodyNotRewritableError';
  }
}

export function jsonBuffer(value: unknown): Buffer {
  try {
    return Buffer.from(JSON.stringify(value), 'utf8');
  } catch (err) {
    if (err instanceof RangeError) throw new BodyNotRewritableError(err);
    throw err;
  }
}
