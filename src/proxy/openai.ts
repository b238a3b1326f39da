/**
 * The OpenAI request surface Sluice accepts: which paths, which fields must be present, and the
 * text the prefix index hashes (reference pd-and-vllm.md §3.2 step 1).
 */
import type { ApiKind } from '../scheduling/framework.js';
import { jsonShapeProblem, topLevelMemberText } from './json-member.js';
import { laxBoolean } from '../util/lax-boolean.js';

export const API_ROUTES: Readonly<Record<string, ApiKind>> = {
  '/v1/chat/completions': 'chat',
  '/v1/completions': 'completions',
  '/v1/embeddings': 'embeddings',
  '/v1/responses': 'responses',
};

export interface ValidRequest {
  /** The parsed body. */
  body: Record<string, unknown>;
  model: string;
  promptText: string;
  stream: boolean;
}

export interface InvalidRequest {
  message: string;
  param: string | null;
}

/** JSON text of a parsed value; undefined when it is nested too deeply to serialise. */
function jsonText(v: unknown): string | undefined {
  try {
    return JSON.stringify(v);
  } catch (err) {
    if (err instanceof RangeError) return undefined;
    throw err;
  }
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Validates the parsed body for the API and extracts what routing needs. With `source` (the text
 * that was parsed), a structured prompt is the client's own JSON text of it rather than a
 * re-serialisation: the same bytes for the same conversation, without the cost of `JSON.stringify`.
 */
export function validateOpenAIRequest(api: ApiKind, body: unknown, source?: string): ValidRequest | InvalidRequest {
  if (!isObject(body)) return { message: 'request body must be a JSON object', param: null };
  const model = body.model;
  if (model === undefined) return { message: "missing required field 'model'", param: 'model' };
  if (typeof model !== 'string' || model.length === 0)
    return { message: "'model' must be a non-empty string", param: 'model' };
  const stream = body.stream === undefined || body.stream === null ? false : laxBoolean(body.stream);
  if (stream === undefined) return { message: "'stream' must be a boolean", param: 'stream' };
  let promptText: string | undefined;
  switch (api) {
    case 'chat': {
      const messages = body.messages;
      if (messages === undefined) return { message: "missing required field 'messages'", param: 'messages' };
      if (!Array.isArray(messages) || messages.length === 0)
        return { message: "'messages' must be a non-empty array", param: 'messages' };
      for (let i = 0; i < messages.length; i++) {
        if (!isObject(messages[i])) return { message: `'messages[${i}]' must be an object`, param: `messages[${i}]` };
      }
      promptText = memberText(source, 'messages') ?? jsonText(messages);
      break;
    }
    case 'completions': {
      const prompt = body.prompt;
      if (prompt === undefined || prompt === null) return { message: "missing required field 'prompt'", param: 'prompt' };
      if (typeof prompt === 'string') promptText = prompt;
      else if (Array.isArray(prompt) && prompt.length > 0) promptText = memberText(source, 'prompt') ?? jsonText(prompt);
      else return { message: "'prompt' must be a string or a non-empty array", param: 'prompt' };
      break;
    }
    case 'embeddings': {
      const input = body.input;
      if (input === undefined || input === null) return { message: "missing required field 'input'", param: 'input' };
      promptText = typeof input === 'string' ? input : (memberText(source, 'input') ?? jsonText(input));
      break;
    }
    case 'responses': {
      const input = body.input;
      if (input === undefined || input === null) return { message: "missing required field 'input'", param: 'input' };
      promptText = jsonText([{ instructions: body.instructions }, { tools: body.tools }, { input }]);
      break;
    }
  }
  // JSON.parse reads any depth; re-serialising a structure nested thousands deep overflows the stack.
  if (promptText === undefined) return { message: 'request body is nested too deeply', param: null };
  return { body, model, promptText, stream };
}

/**
 * Decodes, parses and validates a request body: on arrival, and again when a request that waited
 * in the queue without its parsed form is dispatched (same bytes, same result).
 */
export function parseOpenAIRequest(api: ApiKind, raw: Buffer): ValidRequest | InvalidRequest {
  // Said plainly: JSON.parse's "Unexpected end of JSON input" reads as a truncated body. (An
  // HTTP/1.0 client sending a body without Content-Length arrives here too: Node reads none.)
  if (raw.length === 0) return { message: 'request body is empty: expected a JSON object (an HTTP/1.0 request needs a Content-Length)', param: null };
  // A byte-order mark before the JSON: vLLM's parser (Python's json.loads on bytes) skips it.
  const decoded = raw.toString('utf8');
  const text = decoded.charCodeAt(0) === 0xfeff ? decoded.slice(1) : decoded;
  const tooMuch = jsonShapeProblem(text);
  if (tooMuch !== undefined) return { message: tooMuch, param: null };
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (err) {
    return { message: `invalid JSON body: ${(err as Error).message}`, param: null };
  }
  return validateOpenAIRequest(api, body, text);
}

const memberText = (source: string | undefined, key: string): string | undefined =>
  source === undefined ? undefined : topLevelMemberText(source, key);

export function isInvalid<T extends object>(v: T | InvalidRequest): v is InvalidRequest {
  return (v as Partial<InvalidRequest>).message !== undefined;
}
