/** proxy/errors.ts: the `type` of each status Sluice answers itself (SPEC §5, and its own for the rest). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { errorBody, errorType } from '../../src/proxy/errors.js';

test("errorType: SPEC §5's types; Sluice's other statuses as the openai client classes them (4xx a bad request, 5xx a server error)", () => {
  const spec = { 400: 'BadRequestError', 404: 'NotFoundError', 413: 'RequestTooLargeError', 429: 'RateLimitError', 500: 'InternalServerError', 502: 'BadGatewayError', 503: 'ServiceUnavailableError', 504: 'GatewayTimeoutError' };
  for (const [status, type] of Object.entries(spec)) assert.equal(errorType(Number(status)), type, status);
  const own = { 405: 'NotFoundError', 408: 'BadRequestError', 415: 'BadRequestError', 417: 'BadRequestError', 431: 'RequestTooLargeError', 501: 'InternalServerError' };
  for (const [status, type] of Object.entries(own)) assert.equal(errorType(Number(status)), type, status);
  assert.deepEqual(JSON.parse(errorBody(408, 'too slow')), { error: { message: 'too slow', type: 'BadRequestError', param: null, code: 408 } });
});
