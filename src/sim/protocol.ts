/**
 * What the simulator's OpenAI routes (chat completions, completions, responses) share: vLLM's error
 * body, the request fields read alike on each route (model, lax booleans, token limits, the context
 * window, cache_salt), and the base of their SSE answers.
 */
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { laxBoolean } from '../util/lax-boolean.js';
import { promptTokensOf, type GenerationInput } from './engine.js';

export type JsonObject = Record<string, unknown>;

export function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// OpenAI SDK error class names per status, as the llm-d simulator maps them.
const ERROR_TYPES: Readonly<Record<number, string>> = {
  400: 'BadRequestError',
  401: 'AuthenticationError',
  403: 'PermissionDeniedError',
  404: 'NotFoundError',
  413: 'BadRequestError',
  422: 'UnprocessableEntityError',
  429: 'RateLimitError',
};

export function errorTypeFor(status: number): string {
  return ERROR_TYPES[status] ?? (status >= 500 ? 'InternalServerError' : 'APIConnectionError');
}

/**
 * vLLM ≥ 0.10.1 error body: nested, `code` is the HTTP status as a number. `type` is the SDK class
 * name of the status unless vLLM names another (its Responses API: `invalid_request_error`).
 */
export function errorBody(status: number, message: string, param: string | null = null, type: string = errorTypeFor(status)): string {
  return JSON.stringify({ error: { message, type, param, code: status } });
}

/** A request problem answered with `status` and the OpenAI error body. */
export class SimHttpError extends Error {
  constructor(readonly status: number, message: string, readonly param: string | null = null, readonly type?: string) {
    super(message);
  }
}

/** vLLM's answer when its waiting queue would overflow (the sim's 429). */
export const QUEUE_FULL_MESSAGE = 'Failed to enqueue request, waiting requests queue is full';

/** vLLM serves a request without a model with its served model; another name is a 404. */
export function checkModel(body: JsonObject, servedModel: string): void {
  const requested = body.model;
  if (requested !== undefined && requested !== null && typeof requested !== 'string') {
    throw new SimHttpError(400, "'model' must be a string", 'model');
  }
  if (typeof requested === 'string' && requested !== '' && requested !== servedModel) {
    throw new SimHttpError(404, `The model \`${requested}\` does not exist.`, 'model');
  }
}

/**
 * A `bool | None` field as vLLM's pydantic reads it (lax: "true", 1, "yes" …): `absent` when
 * missing, false when null (None is falsy there), else 400 naming it.
 */
export function optionalFlag(body: JsonObject, key: string, absent: boolean): boolean {
  const v = body[key];
  if (v === undefined) return absent;
  if (v === null) return false;
  const flag = laxBoolean(v);
  if (flag === undefined) throw new SimHttpError(400, `'${key}' must be a boolean`, key);
  return flag;
}

export function optionalPositiveInt(body: JsonObject, key: string | undefined): number | undefined {
  if (key === undefined) return undefined;
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) {
    throw new SimHttpError(400, `${key} must be an integer ≥ 1`, key);
  }
  return v;
}

/** vLLM's two context-window checks, with its messages: the prompt must leave room for one token, and for max_tokens if set. */
function assertFitsContext(promptTokens: number, maxTokens: number | undefined, maxModelLen: number, promptParam: string): void {
  if (promptTokens >= maxModelLen) {
    throw new SimHttpError(
      400,
      `This model's maximum context length is ${maxModelLen} tokens. However, your request has ${promptTokens} input tokens. ` +
        'Please reduce the length of the input messages.',
      promptParam,
    );
  }
  if (maxTokens !== undefined && promptTokens + maxTokens > maxModelLen) {
    throw new SimHttpError(
      400,
      `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ${maxModelLen} tokens ` +
        `and your request has ${promptTokens} input tokens (${maxTokens} > ${maxModelLen} - ${promptTokens}).`,
      'max_tokens',
    );
  }
}

/**
 * Bounds one prompt's output as vLLM does, against the context window `maxModelLen` (0 = none): a
 * prompt that leaves no room is a 400; without `maxTokens` the output may run to the window's end.
 * A `maxTokens` past it is a 400 (chat, completions) or, with `clamp` (the Responses API's
 * `min(max_output_tokens, room)`), cut to the room.
 */
export function boundOutput(input: GenerationInput, maxTokens: number | undefined, maxModelLen: number, promptParam: string, clamp = false): void {
  if (maxModelLen <= 0) {
    if (maxTokens !== undefined) input.maxTokens = maxTokens;
    return;
  }
  const promptTokens = promptTokensOf(input);
  assertFitsContext(promptTokens, clamp ? undefined : maxTokens, maxModelLen, promptParam);
  const room = maxModelLen - promptTokens;
  if (maxTokens === undefined) input.contextRoom = room;
  else input.maxTokens = Math.min(maxTokens, room);
}

/** vLLM's `cache_salt`: a string that seeds the prompt's block hashes ('' and null: none). */
export function cacheSaltOf(body: JsonObject): string | undefined {
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && typeof salt !== 'string') throw new SimHttpError(400, "'cache_salt' must be a string", 'cache_salt');
  return typeof salt === 'string' && salt !== '' ? salt : undefined;
}

/**
 * An SSE answer: the status line and headers once the request is accepted (as vLLM's Starlette
 * StreamingResponse, before the queue wait and prefill), and the events written in one turn of the
 * event loop corked into one socket write.
 */
export class EventStream {
  constructor(protected readonly res: ServerResponse, private readonly headers: OutgoingHttpHeaders) {}

  /** The status line and headers, at once. */
  begin(): void {
    if (this.res.headersSent) return;
    this.headers['content-type'] = 'text/event-stream; charset=utf-8';
    this.headers['cache-control'] = 'no-cache';
    this.res.writeHead(200, this.headers);
    this.res.flushHeaders();
  }

  private corked = false;
  private readonly uncork = (): void => {
    this.corked = false;
    // end() already uncorked the socket fully; the socket may even serve the next request by now.
    if (!this.res.writableEnded) this.res.uncork();
  };

  /** Events written in the same turn (zero ITL, or the last token and the closing events) share one socket write. */
  protected corkUntilNextTick(): void {
    if (this.corked) return;
    this.corked = true;
    this.res.cork();
    process.nextTick(this.uncork);
  }
}
