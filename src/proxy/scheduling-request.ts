/**
 * The scheduling request of an API call, and its light form. A request holds its body three times
 * over once parsed: the bytes to forward, their decoded text (which the prompt text, a slice of it,
 * keeps alive) and the parsed JSON. Only the bytes are needed while it waits in the queue and once
 * it is sent to a model server (a retry parses them again), so there it drops the rest: a queued or
 * in-flight request then costs about its size, not several times it. In place: no allocation per request.
 */
import type { ApiKind, SchedulingRequest } from '../scheduling/framework.js';
import { isInvalid, parseOpenAIRequest, type ValidRequest } from './openai.js';

const NO_BODY: Readonly<Record<string, unknown>> = Object.freeze({});

/** The proxy's own view: the fields plugins may only read. */
type Owned = { -readonly [K in keyof SchedulingRequest]: SchedulingRequest[K] };

export const schedulingRequest = (
  requestId: string,
  api: ApiKind,
  valid: ValidRequest,
  headers: SchedulingRequest['headers'],
  state: SchedulingRequest['state'],
): SchedulingRequest => ({ requestId, model: valid.model, api, body: valid.body, promptText: valid.promptText, headers, state });

/** Drops the parsed body and the prompt text (`body` becomes `{}`, `promptText` ''). */
export function dropParsedForm(r: SchedulingRequest): void {
  (r as Owned).body = NO_BODY;
  (r as Owned).promptText = '';
}

/** Parses the bytes again after `dropParsedForm` (a no-op otherwise); the same bytes were valid on arrival. */
export function restoreParsedForm(r: SchedulingRequest, raw: Buffer): void {
  if (r.body !== NO_BODY) return;
  const valid = parseOpenAIRequest(r.api, raw);
  if (isInvalid(valid)) throw new Error(`a queued request's body no longer parses: ${valid.message}`);
  (r as Owned).body = valid.body;
  (r as Owned).promptText = valid.promptText;
}
