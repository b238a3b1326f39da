/**
 * Every error Sluice itself produces is OpenAI-shaped JSON (SPEC §5):
 * {"error":{"message","type","param","code"}} with `content-type: application/json`.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ApiKind } from '../scheduling/framework.js';

export const DROPPED_REASON_HEADER = 'x-llm-d-request-dropped-reason';

export type DroppedReason =
  | 'rejected-saturated'
  | 'rejected-ttl-expired'
  | 'rejected-no-endpoints'
  | 'rejected-context-cancelled'
  | 'rejected-shutting-down';

const ERROR_TYPES: Record<number, string> = {
  400: 'BadRequestError',
  404: 'NotFoundError',
  405: 'NotFoundError',
  408: 'BadRequestError',
  409: 'ConflictError',
  413: 'RequestTooLargeError',
  431: 'RequestTooLargeError',
  429: 'RateLimitError',
  500: 'InternalServerError',
  502: 'BadGatewayError',
  503: 'ServiceUnavailableError',
  504: 'GatewayTimeoutError',
};

export function errorType(status: number): string {
  return ERROR_TYPES[status] ?? (status >= 500 ? 'InternalServerError' : 'BadRequestError');
}

/** An error the gateway answers with; thrown or returned along the request path. */
export class GatewayError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly droppedReason?: DroppedReason,
  ) {
    super(message);
    this.name = 'GatewayError';
  }
}

export function errorBody(status: number, message: string, param: string | null = null): string {
  return JSON.stringify({ error: { message, type: errorType(status), param, code: status } });
}

/**
 * The last events of an SSE answer the gateway ends with an error (its status line already sent): the
 * §5 body as an event, then `data: [DONE]` for the chat and completions APIs, as vLLM ends a stream
 * it failed (the Responses API's typed events have no `[DONE]`).
 */
export function sseErrorEnd(api: ApiKind, status: number, message: string, sequenceNumber = 0): string {
  if (api === 'responses') {
    // The Responses API's typed `error` event (type, code, message, param, sequence_number: the one
    // after the stream's last), which typed parsers (the Vercel AI SDK) validate, with the §5 `error`
    // object beside it, which the `openai` clients throw as an APIError with its message.
    const error = { message, type: errorType(status), param: null, code: status };
    const data = { type: 'error', code: errorType(status), message, param: null, sequence_number: sequenceNumber, error };
    return `event: error\ndata: ${JSON.stringify(data)}\n\n`;
  }
  return `data: ${errorBody(status, message)}\n\ndata: [DONE]\n\n`;
}

/** A whole §5 error response as raw HTTP, for a socket that has no ServerResponse (malformed HTTP, CONNECT); it closes the connection. */
export function rawErrorResponse(status: number, reason: string, message: string, requestId: string): string {
  const body = errorBody(status, message);
  return `HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nx-request-id: ${requestId}\r\nconnection: close\r\n\r\n${body}`;
}

/** The client's `x-request-id` (a sane one), else a new one. */
export function requestIdOf(req: IncomingMessage): string {
  const id = req.headers['x-request-id'];
  return typeof id === 'string' && id.length > 0 && id.length <= 256 ? id : randomUUID();
}


/**
 * Node's `clientError` (malformed or oversized HTTP, a request not received in time), on either
 * port: a §5 answer, then the connection closes. When an earlier request's answer on this
 * connection is still on its way (pipelining), it goes first, whole — written at once, the 400 would
 * read as that request's answer (or corrupt it) — and the 400 follows. Returns why it answered (for
 * `sluice_request_rejected_total`), or undefined when it only closed.
 */
export function answerClientError(
  err: NodeJS.ErrnoException,
  socket: Duplex & { _httpMessage?: ServerResponse | null },
  requestIdOfAnswer?: (res: ServerResponse) => string | undefined,
): 'headers_too_large' | 'request_timeout' | 'malformed_http' | undefined {
  const current = socket._httpMessage;
  // Whose request broke: a later one, pipelined behind a request received whole (its answer goes
  // first), or the request being received (its own answer, unless that has begun).
  const later = current !== null && current !== undefined && current.req?.complete === true && !current.writableFinished;
  // HPE_INVALID_EOF_STATE: the client closed its side mid-request (it left): nobody to answer, nothing malformed.
  if (!socket.writable || err.code === 'ECONNRESET' || err.code === 'HPE_INVALID_EOF_STATE' || (!later && current?.headersSent === true)) {
    socket.destroy();
    return undefined;
  }
  const [status, reason, message, why] =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? ([431, 'Request Header Fields Too Large', 'request headers too large', 'headers_too_large'] as const)
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? ([408, 'Request Timeout', 'request not received in time', 'request_timeout'] as const)
        : ([400, 'Bad Request', 'malformed HTTP request', 'malformed_http'] as const);
  // The request that broke: its id when it had reached the API (its headers were read), else a new one.
  const ownId = !later && current !== null && current !== undefined ? requestIdOfAnswer?.(current) : undefined;
  // The request being received gets this answer in its stead: its `request done` line must say so.
  if (ownId !== undefined) noteSentError(current!, { message, rawStatus: status });
  const answer = rawErrorResponse(status, reason, message, ownId ?? randomUUID());
  if (later) afterQueuedAnswers(socket, () => socket.end(answer));
  else socket.end(answer);
  return why;
}

/**
 * Runs `then` once every answer queued on the connection went out: Node keeps the answers to
 * pipelined requests in a queue and gives the socket to the next one when one finishes (its own
 * `finish` listener, registered first, does that before ours runs).
 */
function afterQueuedAnswers(socket: Duplex & { _httpMessage?: ServerResponse | null }, then: () => void): void {
  const current = socket._httpMessage;
  if (current === null || current === undefined || current.writableFinished) return then();
  current.once('finish', () => afterQueuedAnswers(socket, then));
  // Not finished but closed: that request was cut (its client left, or the drain ended).
  current.once('close', () => {
    if (!current.writableFinished) socket.destroy();
  });
}

/** The error Sluice ended a response with (for the debug-level `request done` line). */
export interface SentError {
  message: string;
  /** The message without its per-request detail (sendError's `detail`): what the refusal log tells kinds apart by. */
  cause?: string;
  droppedReason?: DroppedReason;
  /** The status written raw on the socket in the request's stead (answerClientError), not through `res`. */
  rawStatus?: number;
}

const kSentError = Symbol('sluice.sentError');

/** The error Sluice answered on this response, if any. */
export function sentError(res: ServerResponse): SentError | undefined {
  return (res as ServerResponse & { [kSentError]?: SentError })[kSentError];
}

/**
 * Records the error Sluice ended `res` with. sendError does; the paths that cannot write an error
 * response any more (the answer had begun: an SSE error event, or a cut connection) or write it raw
 * on the socket call it themselves, so the `request done` line still says why.
 */
export function noteSentError(res: ServerResponse, error: SentError): void {
  (res as ServerResponse & { [kSentError]?: SentError })[kSentError] = error;
}

/** Writes an OpenAI-shaped error unless headers already went out (then the connection is cut); either way, noted for the log. */
export function sendError(
  res: ServerResponse,
  status: number,
  message: string,
  opts: { param?: string | null; droppedReason?: DroppedReason; requestId?: string; close?: boolean; noRetry?: boolean; retryAfterSeconds?: number; detail?: string } = {},
): void {
  const full = opts.detail === undefined || opts.detail === '' ? message : `${message}: ${opts.detail}`;
  noteSentError(res, { message: full, cause: message, droppedReason: opts.droppedReason });
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(status, full, opts.param ?? null);
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  };
  if (opts.droppedReason) headers[DROPPED_REASON_HEADER] = opts.droppedReason;
  if (opts.requestId) headers['x-request-id'] = opts.requestId;
  if (opts.close) headers.connection = 'close';
  // The OpenAI clients' convention (they retry every 429 and 5xx otherwise): a model server took the
  // request and may have run it, and Sluice has made its own retries; or a retry cannot succeed.
  if (opts.noRetry) headers['x-should-retry'] = 'false';
  if (opts.retryAfterSeconds !== undefined) headers['retry-after'] = opts.retryAfterSeconds;
  res.writeHead(status, headers);
  res.end(body);
}

export function sendGatewayError(res: ServerResponse, err: GatewayError, requestId?: string): void {
  sendError(res, err.status, err.message, { param: err.param, droppedReason: err.droppedReason, requestId });
}
