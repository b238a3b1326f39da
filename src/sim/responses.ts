/**
 * The simulator's `POST /v1/responses`, as vLLM's OpenAI Responses API serves a model without
 * harmony (its SimpleContext path: one assistant message of text, no tools, no reasoning items).
 *
 * A turn's conversation is a list of chat messages, as vLLM builds it: a system message with this
 * request's `instructions`, then the stored conversation of `previous_response_id` (its messages and
 * its assistant output), then this request's `input`. The engine's prompt text is that list as JSON
 * lines (`{"role":…,"content":…}\n` each), so a turn's prompt followed by its output's line is a prefix
 * of a follow-up's prompt: the follow-up's tokens count the whole conversation, and its prefix-cache
 * hits are the earlier turns' blocks on the server that ran them. (A follow-up with `instructions`
 * starts with its own system message, as at vLLM, and so shares no prefix with its predecessor.)
 *
 * vLLM's store (`VLLM_ENABLE_RESPONSES_API_STORE`) is off by default: `store: true` is then read as
 * false and no response can be continued. On, it keeps every response made with `store` not false,
 * forever; this store keeps the newest 10 000 of them (and at most 2^28 characters of their
 * conversations, RESPONSE_STORE_LIMITS) and drops the oldest.
 */
import { randomUUID } from 'node:crypto';
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { GenerationInput, GenerationListener, GenerationResult } from './engine.js';
import {
  EventStream,
  SimHttpError,
  boundOutput,
  cacheSaltOf,
  checkModel,
  isObject,
  optionalFlag,
  optionalPositiveInt,
  type JsonObject,
} from './protocol.js';

/** What the store keeps at most: the newest responses, and the characters of their conversations in all. */
export const RESPONSE_STORE_LIMITS = { responses: 10_000, chars: 2 ** 28 } as const;

/** Finished responses' conversations by response id, oldest first; past either limit the oldest go. */
export class ResponseStore {
  private readonly conversations = new Map<string, string>();
  private chars = 0;

  constructor(private readonly limits: { responses: number; chars: number } = RESPONSE_STORE_LIMITS) {}

  get size(): number {
    return this.conversations.size;
  }

  get(id: string): string | undefined {
    return this.conversations.get(id);
  }

  set(id: string, conversation: string): void {
    this.delete(id);
    this.conversations.set(id, conversation);
    this.chars += conversation.length;
    while (this.conversations.size > this.limits.responses || this.chars > this.limits.chars) {
      this.delete(this.conversations.keys().next().value!);
    }
  }

  private delete(id: string): void {
    const old = this.conversations.get(id);
    if (old === undefined) return;
    this.conversations.delete(id);
    this.chars -= old.length;
  }
}

const ROLES = new Set(['user', 'assistant', 'system', 'developer']);
const TEXT_PARTS = new Set(['input_text', 'output_text']);
const INPUT_SHAPE =
  "'input' must be a string or a non-empty array of messages {role, content}, content a string or an array of " +
  "{type: 'input_text' | 'output_text', text} parts";

/** One message of the conversation as a line of the prompt text (keys in a fixed order, parts reduced to type and text). */
function messageLine(role: string, content: unknown): string {
  return JSON.stringify({ role, content }) + '\n';
}

/** `input` as message lines: a string is one user message; an array lists messages (`type: 'message'` optional). */
function inputLines(input: unknown): string {
  if (typeof input === 'string') return messageLine('user', input);
  if (!Array.isArray(input) || input.length === 0) throw new SimHttpError(400, INPUT_SHAPE, 'input');
  let lines = '';
  for (let i = 0; i < input.length; i++) {
    const item: unknown = input[i];
    const bad = (): SimHttpError => new SimHttpError(400, `${INPUT_SHAPE}; input[${i}] is not`, 'input');
    if (!isObject(item) || typeof item.role !== 'string' || !ROLES.has(item.role)) throw bad();
    if (item.type !== undefined && item.type !== 'message') throw bad();
    const content = item.content;
    if (typeof content === 'string') lines += messageLine(item.role, content);
    else if (Array.isArray(content)) {
      const parts = content.map((part: unknown) => {
        if (!isObject(part) || typeof part.type !== 'string' || !TEXT_PARTS.has(part.type) || typeof part.text !== 'string') throw bad();
        return { type: part.type, text: part.text };
      });
      lines += messageLine(item.role, parts);
    } else throw bad();
  }
  return lines;
}

/** A request field echoed in the answer: its value when of the expected kind, else vLLM's default. */
function echo<T>(body: JsonObject, key: string, is: (v: unknown) => v is T, fallback: T | null): T | null {
  const v = body[key];
  return is(v) ? v : fallback;
}
const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isString = (v: unknown): v is string => typeof v === 'string';
const isBoolean = (v: unknown): v is boolean => typeof v === 'boolean';
const isAny = (v: unknown): v is unknown => v !== undefined && v !== null;

const newId = (prefix: string): string => `${prefix}${randomUUID().replaceAll('-', '')}`;

/**
 * One validated Responses request: the engine input for its conversation, and the answer built
 * around the generation's result (stored, when the store is on and `store` is not false, once it
 * completes).
 */
export class ResponsesTurn {
  /** The output message's id. */
  readonly messageId = newId('msg_');

  constructor(
    readonly input: GenerationInput,
    readonly stream: boolean,
    private readonly store: ResponseStore | undefined,
    private readonly fields: JsonObject,
    private readonly createdAt: number,
    /** The client's `request_id` (a vLLM extension: its response's id), else `resp_` + 32 hex digits (a random UUID's, as vLLM's). */
    readonly id = newId('resp_'),
  ) {}

  /**
   * vLLM's ResponsesResponse (field order as its model's): no `store` member (whether it was stored
   * is not said) and no `error`, as vLLM's.
   */
  response(status: 'in_progress' | 'completed', output: JsonObject[], usage: JsonObject | null): JsonObject {
    const f = this.fields;
    return {
      id: this.id,
      created_at: this.createdAt,
      incomplete_details: null,
      instructions: f.instructions,
      metadata: f.metadata,
      model: f.model,
      object: 'response',
      output,
      parallel_tool_calls: f.parallel_tool_calls,
      temperature: f.temperature,
      tool_choice: f.tool_choice,
      tools: [],
      top_p: f.top_p,
      background: false,
      max_output_tokens: this.input.maxTokens ?? this.input.contextRoom ?? null,
      max_tool_calls: null,
      previous_response_id: f.previous_response_id,
      prompt: null,
      reasoning: f.reasoning,
      service_tier: f.service_tier,
      status,
      text: f.text,
      top_logprobs: null,
      truncation: f.truncation,
      usage,
      user: f.user,
    };
  }

  /** The output message, empty while in progress. */
  message(text: string | undefined): JsonObject {
    return {
      type: 'message',
      id: this.messageId,
      role: 'assistant',
      status: text === undefined ? 'in_progress' : 'completed',
      content: text === undefined ? [] : [textPart(text)],
    };
  }

  /** The completed response; stores its conversation (prompt + this output) first, so a follow-up may name it at once. */
  complete(result: GenerationResult, text: string): JsonObject {
    this.store?.set(this.id, this.input.promptText + messageLine('assistant', text));
    const usage = {
      input_tokens: result.promptTokens,
      input_tokens_details: { cached_tokens: result.cachedTokens },
      output_tokens: result.completionTokens,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: result.promptTokens + result.completionTokens,
    };
    return this.response('completed', [this.message(text)], usage);
  }
}

function textPart(text: string): JsonObject {
  return { type: 'output_text', text, annotations: [] };
}

/**
 * Validates a Responses request as vLLM does and builds its turn; `store` is the server's store
 * (undefined: off). Throws SimHttpError: 400, 404 for another model or an unknown
 * `previous_response_id` (vLLM's message and type).
 */
export function toResponsesTurn(body: JsonObject, servedModel: string, maxModelLen: number, store: ResponseStore | undefined, createdAt: number): ResponsesTurn {
  const stream = optionalFlag(body, 'stream', false);
  const keep = optionalFlag(body, 'store', true);
  const background = optionalFlag(body, 'background', false);
  if (background && !keep) throw new SimHttpError(400, 'background can only be used when `store` is true');
  const instructions = body.instructions;
  if (instructions !== undefined && instructions !== null && typeof instructions !== 'string') {
    throw new SimHttpError(400, "'instructions' must be a string", 'instructions');
  }
  const previousId = body.previous_response_id;
  if (previousId !== undefined && previousId !== null && typeof previousId !== 'string') {
    throw new SimHttpError(400, "'previous_response_id' must be a string", 'previous_response_id');
  }
  if (Array.isArray(body.tools) && body.tools.length > 0) {
    throw new SimHttpError(400, 'Tool use is not supported in Responses API without Harmony', 'tools');
  }
  const input = inputLines(body.input);
  const maxTokens = optionalPositiveInt(body, 'max_output_tokens');
  checkModel(body, servedModel);
  if (background) {
    // With the store off, vLLM's message; with it on, vLLM would run the request in the background.
    if (store === undefined) {
      throw new SimHttpError(
        400,
        'This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these ' +
          'features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.',
        null,
        'invalid_request_error',
      );
    }
    throw new SimHttpError(400, 'sluice sim does not implement background mode (background: true)', 'background');
  }
  let previous = '';
  if (typeof previousId === 'string') {
    const found = store?.get(previousId);
    if (found === undefined) throw new SimHttpError(404, `Response with id '${previousId}' not found.`, 'response_id', 'invalid_request_error');
    previous = found;
  }
  const system = typeof instructions === 'string' && instructions !== '' ? messageLine('system', instructions) : '';
  const generation: GenerationInput = { promptText: system + previous + input };
  const salt = cacheSaltOf(body);
  if (salt !== undefined) generation.cacheSalt = salt;
  // vLLM's max_tokens here is min(max_output_tokens, the context's room): clamped, not refused.
  boundOutput(generation, maxTokens, maxModelLen, 'input', true);
  const fields: JsonObject = {
    instructions: typeof instructions === 'string' ? instructions : null,
    metadata: echo(body, 'metadata', isObject, null),
    model: servedModel,
    parallel_tool_calls: echo(body, 'parallel_tool_calls', isBoolean, true),
    temperature: echo(body, 'temperature', isNumber, 1),
    tool_choice: echo(body, 'tool_choice', isAny, 'auto'),
    top_p: echo(body, 'top_p', isNumber, 1),
    previous_response_id: typeof previousId === 'string' ? previousId : null,
    reasoning: echo(body, 'reasoning', isObject, null),
    service_tier: echo(body, 'service_tier', isString, 'auto'),
    text: echo(body, 'text', isObject, null),
    truncation: echo(body, 'truncation', isString, 'disabled'),
    user: echo(body, 'user', isString, null),
  };
  // vLLM silently stores nothing when its store is off (and its answer does not say).
  const requestId = body.request_id;
  return new ResponsesTurn(generation, stream, keep ? store : undefined, fields, createdAt, typeof requestId === 'string' && requestId !== '' ? requestId : undefined);
}

/** The engine listener of a non-streamed response: the whole answer once generated. */
export class ResponsesJsonAnswer implements GenerationListener {
  constructor(private readonly turn: ResponsesTurn, private readonly send: (body: string) => void) {}

  onFinish(result: GenerationResult): void {
    this.send(JSON.stringify(this.turn.complete(result, result.text)));
  }
}

/**
 * A streamed response, in vLLM's order of events (each `event: <type>` + `data: <json>`, numbered by
 * `sequence_number` from 0): response.created and response.in_progress once accepted; with the
 * first token response.output_item.added and response.content_part.added; one
 * response.output_text.delta per token; once generated response.output_text.done,
 * response.content_part.done, response.output_item.done and response.completed with the whole
 * response and its usage. No `[DONE]` line, as vLLM.
 */
export class ResponsesEventStream extends EventStream implements GenerationListener {
  private sequence = 0;
  private text = '';
  private started = false;
  /** A delta event up to its sequence number, and from there to its text. */
  private readonly deltaHead: string;
  private readonly deltaMiddle: string;

  constructor(res: ServerResponse, headers: OutgoingHttpHeaders, private readonly turn: ResponsesTurn) {
    super(res, headers);
    this.deltaHead = 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":';
    this.deltaMiddle = `,"item_id":${JSON.stringify(turn.messageId)},"output_index":0,"content_index":0,"logprobs":[],"delta":`;
  }

  override begin(): void {
    if (this.started) return;
    this.started = true;
    super.begin();
    const initial = this.turn.response('in_progress', [], null);
    this.res.write(this.event('response.created', { response: initial }) + this.event('response.in_progress', { response: initial }));
  }

  onToken(text: string, index: number): void {
    this.begin();
    this.corkUntilNextTick();
    if (index === 0) {
      this.res.write(
        this.event('response.output_item.added', { output_index: 0, item: this.turn.message(undefined) }) +
          this.event('response.content_part.added', { item_id: this.turn.messageId, output_index: 0, content_index: 0, part: textPart('') }),
      );
    }
    this.text += text;
    this.res.write(this.deltaHead + this.sequence++ + this.deltaMiddle + JSON.stringify(text) + '}\n\n');
  }

  onFinish(result: GenerationResult): void {
    const completed = this.turn.complete(result, this.text);
    const ids = { item_id: this.turn.messageId, output_index: 0, content_index: 0 };
    this.res.end(
      this.event('response.output_text.done', { ...ids, text: this.text, logprobs: [] }) +
        this.event('response.content_part.done', { ...ids, part: textPart(this.text) }) +
        this.event('response.output_item.done', { output_index: 0, item: this.turn.message(this.text) }) +
        this.event('response.completed', { response: completed }),
    );
  }

  private event(type: string, fields: JsonObject): string {
    return `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: this.sequence++, ...fields })}\n\n`;
  }
}
