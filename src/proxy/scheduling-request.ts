/**
 * The scheduling request of an API call, and its light form. A request holds its body three times
 * over once parsed: the bytes to forward, their decoded text (which the prompt text, a slice of it,
 * keeps alive) and the parsed JSON. Only the bytes are needed while it waits in the queue and once
 * its answer has started (no retry can follow), so there it keeps the light form: a queued or
 * streaming request then costs about its size, not three times it.
 */
import type { ApiKind, SchedulingRequest } from '../scheduling/framework.js';
import { isInvalid, parseOpenAIRequest, type ValidRequest } from './openai.js';

const NO_BODY: Readonly<Record<string, unknown>> = Object.freeze({});

export const schedulingRequest = (
  requestId: string,
  api: ApiKind,
  valid: ValidRequest,
  headers: SchedulingRequest['headers'],
  state: SchedulingRequest['state'],
): SchedulingRequest => ({ requestId, model: valid.model, api, body: valid.body, promptText: valid.promptText, headers, state });

/** The same request without its parsed body and prompt text (`body` is `{}`, `promptText` ''). */
export const withoutParsedForm = (r: SchedulingRequest): SchedulingRequest => ({
  requestId: r.requestId,
  model: r.model,
  api: r.api,
  body: NO_BODY,
  promptText: '',
  headers: r.headers,
  state: r.state,
});

/** The whole request again from its bytes, after `withoutParsedForm` (the same bytes were valid on arrival). */
export function reparsed(light: SchedulingRequest, raw: Buffer): SchedulingRequest {
  const valid = parseOpenAIRequest(light.api, raw);
  if (isInvalid(valid)) throw new Error(`a queued request's body no longer parses: ${valid.message}`);
  return schedulingRequest(light.requestId, light.api, valid, light.headers, light.state);
}
