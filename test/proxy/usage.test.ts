import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { SseUsageScanner, usageFromJson } from '../../src/proxy/usage.js';

/** Feeds `text` to a scanner in pieces of `size` bytes (splitting lines and multi-byte characters). */
function scan(text: string, size: number): SseUsageScanner {
  const scanner = new SseUsageScanner();
  const bytes = Buffer.from(text, 'utf8');
  for (let i = 0; i < bytes.length; i += size) scanner.feed(bytes.subarray(i, i + size));
  return scanner;
}

describe('usage of an answer', () => {
  test('chat and completions: prompt, completion and cached tokens', () => {
    const body = JSON.stringify({ id: 'x', choices: [{ text: '"usage" in a string' }], usage: { prompt_tokens: 12, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 8 } } });
    assert.deepEqual(usageFromJson(body), { promptTokens: 12, completionTokens: 3, cachedTokens: 8 });
    assert.equal(usageFromJson('{"id":"x"}'), undefined);
    assert.equal(usageFromJson('not json'), undefined);
  });

  test('a key ending in "usage" (its opening quote escaped) after the real usage: the real one counts', () => {
    const body = '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1},"say \\"usage":{"prompt_tokens":999,"completion_tokens":9}}';
    assert.equal(Object.keys(JSON.parse(body)).at(-1), 'say "usage');
    assert.deepEqual(usageFromJson(body), { promptTokens: 3, completionTokens: 1 });
  });

  test('embeddings: no completion count, so no output-token sample', () => {
    assert.deepEqual(usageFromJson(JSON.stringify({ data: [], usage: { prompt_tokens: 7, total_tokens: 7 } })), { promptTokens: 7 });
  });

  test("the Responses API's input_tokens and output_tokens, usage not last", () => {
    const body = JSON.stringify({
      id: 'resp_1',
      object: 'response',
      output: [{ type: 'message', content: [{ type: 'output_text', text: 'hi' }] }],
      usage: { input_tokens: 13, input_tokens_details: { cached_tokens: 4 }, output_tokens: 4, total_tokens: 17 },
      user: null,
    });
    assert.deepEqual(usageFromJson(body), { promptTokens: 13, completionTokens: 4, cachedTokens: 4 });
  });

  test('SSE: the include_usage chunk, whatever the read boundaries', () => {
    const stream =
      'data: {"choices":[{"delta":{"content":"é"}}],"usage":null}\n\n' +
      'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n' +
      'data: [DONE]\n\n';
    for (const size of [1, 3, 7, 1000]) assert.deepEqual(scan(stream, size).usage, { promptTokens: 5, completionTokens: 2 }, `pieces of ${size}`);
  });

  test("SSE: the Responses API's response.completed event carries the usage in its response", () => {
    const stream =
      'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","usage":null}}\n\n' +
      'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n' +
      'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":13,"output_tokens":4,"total_tokens":17}}}\n\n';
    for (const size of [2, 1000]) assert.deepEqual(scan(stream, size).usage, { promptTokens: 13, completionTokens: 4 });
    assert.equal(scan(stream.slice(0, stream.indexOf('event: response.completed')), 1000).usage, undefined);
  });
});

describe('error events in a stream', () => {
  test("vLLM's error event after a 200 (a generation that failed): its code, whatever the read boundaries", () => {
    const stream =
      'data: {"choices":[{"delta":{"content":"an error message about errors"}}]}\n\n' +
      'data: {"error":{"message":"KV load failed","type":"InternalServerError","param":null,"code":500}}\n\n' +
      'data: [DONE]\n\n';
    for (const size of [3, 1000]) assert.equal(scan(stream, size).errorCode, 500, `pieces of ${size}`);
    assert.equal(scan('data: {"error":{"message":"x","code":"bad"}}\n\n', 100).errorCode, 500, 'no usable code: 500');
    assert.equal(scan('data: {"error":{"message":"x","code":503}}\n\ndata: {"error":{"code":400}}\n\n', 100).errorCode, 503, 'the first one');
  });

  test('a token that says "error", or an error key deeper down, is no error event', () => {
    assert.equal(scan('data: {"choices":[{"delta":{"content":"\\"error\\": fine"}}]}\n\n', 7).errorCode, undefined);
    assert.equal(scan('data: {"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\"error\\":1}"}}]}}]}\n\n', 100).errorCode, undefined);
    assert.equal(scan('data: {"error":null,"choices":[]}\n\n', 100).errorCode, undefined);
  });
});

test("SseUsageScanner on a Responses API stream: the sequence_number after the last event's, across chunk cuts; never one inside a string", () => {
  const s = new SseUsageScanner(true);
  assert.equal(s.nextSequenceNumber, 0, 'nothing seen: the first');
  const events =
    'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n' +
    'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":1,"delta":"say \\"sequence_number\\":99"}\n\n' +
    'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number": 12,"delta":"x"}\n\n';
  const bytes = Buffer.from(events);
  for (let i = 0; i < bytes.length; i += 7) s.feed(bytes.subarray(i, i + 7));
  assert.equal(s.nextSequenceNumber, 13);
  const other = new SseUsageScanner();
  other.feed(bytes);
  assert.equal(other.nextSequenceNumber, 0, 'chat and completions streams are not numbered');
});
