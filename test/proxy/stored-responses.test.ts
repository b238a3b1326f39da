import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../src/datalayer/endpoint.js';
import { homeOf, pinnedTo, previousResponseId, StoredResponses, storedResponseId } from '../../src/proxy/stored-responses.js';
import { responsesAnswerOf, SseUsageScanner } from '../../src/proxy/usage.js';
import type { ApiKind, SchedulingRequest } from '../../src/scheduling/framework.js';

const ep = (name: string, port: number) => new Endpoint({ name, address: '10.0.0.1', port, labels: {} });
const req = (body: Record<string, unknown>, api: ApiKind = 'responses'): SchedulingRequest => ({
  requestId: 'r',
  model: 'm',
  api,
  body,
  promptText: '',
  headers: {},
  state: new Map(),
});

describe('stored responses', () => {
  test('the newest `capacity` are kept; a repeated id moves to the newest end; a smaller capacity forgets the oldest at once', () => {
    const s = new StoredResponses(3);
    for (const id of ['a', 'b', 'c']) s.remember(id, `o-${id}`);
    s.remember('a', 'o-a2'); // now the newest
    s.remember('d', 'o-d'); // b goes
    assert.equal(s.originOf('b'), undefined);
    assert.deepEqual(['a', 'c', 'd'].map((id) => s.originOf(id)), ['o-a2', 'o-c', 'o-d']);
    s.resize(1);
    assert.equal(s.size, 1);
    assert.equal(s.originOf('d'), 'o-d');
    s.resize(0);
    s.remember('e', 'o-e');
    assert.equal(s.size, 0);
  });

  test('a Responses API request continuing a response: pinned to its server when a candidate, unavailable when not, unknown when never stored', () => {
    const [a, b] = [ep('a', 1), ep('b', 2)];
    const s = new StoredResponses(10);
    s.remember('resp_1', b.origin);
    assert.deepEqual(homeOf(req({ previous_response_id: 'resp_1' }), [a, b], s), { result: 'pinned', origin: b.origin });
    assert.deepEqual(homeOf(req({ previous_response_id: 'resp_1' }), [a], s), { result: 'unavailable' });
    assert.deepEqual(homeOf(req({ previous_response_id: 'resp_2' }), [a, b], s), { result: 'unknown' });
    // Not a continuation: no id, an empty or non-string one, another API.
    for (const r of [req({}), req({ previous_response_id: '' }), req({ previous_response_id: 7 }), req({ previous_response_id: 'resp_1' }, 'chat')]) {
      assert.equal(homeOf(r, [a, b], s), undefined);
    }
    assert.equal(previousResponseId(req({ previous_response_id: 'resp_1' })), 'resp_1');
    // By origin: an endpoint of the same name moved to another port is another server.
    const moved = ep('b', 3);
    assert.deepEqual(homeOf(req({ previous_response_id: 'resp_1' }), [a, moved], s), { result: 'unavailable' });
    assert.deepEqual(pinnedTo([a, b], b.origin), [b]);
    assert.deepEqual(pinnedTo([a], b.origin), []);
    assert.deepEqual(pinnedTo([a, b], undefined), [a, b]);
  });

  test("a response's id counts when the server says it stored it (store true, or not said)", () => {
    assert.equal(storedResponseId({ id: 'resp_1', object: 'response', store: true }), 'resp_1');
    assert.equal(storedResponseId({ id: 'resp_1', object: 'response' }), 'resp_1');
    assert.equal(storedResponseId({ id: 'resp_1', object: 'response', store: false }), undefined);
    assert.equal(storedResponseId({ id: 'chatcmpl-1', object: 'chat.completion' }), undefined);
    assert.equal(storedResponseId({ id: 7, object: 'response' }), undefined);
    assert.equal(storedResponseId(null), undefined);
  });

  test('a JSON answer: usage and stored id from one parse', () => {
    const answer = { id: 'resp_1', object: 'response', store: true, output: [], usage: { input_tokens: 5, output_tokens: 2, input_tokens_details: { cached_tokens: 3 } } };
    assert.deepEqual(responsesAnswerOf(Buffer.from(JSON.stringify(answer))), { usage: { promptTokens: 5, completionTokens: 2, cachedTokens: 3 }, storedId: 'resp_1' });
    assert.deepEqual(responsesAnswerOf(Buffer.from(JSON.stringify({ ...answer, store: false }))).storedId, undefined);
    assert.deepEqual(responsesAnswerOf(Buffer.from('{"id":')), { usage: undefined, storedId: undefined });
  });

  test('a stream: the id of its completed response, whatever the chunking; not of one it did not store, nor of a chat stream', () => {
    const response = (store: boolean, usage: unknown) => ({ id: 'resp_é1', object: 'response', status: 'completed', store, usage });
    const usage = { input_tokens: 5, output_tokens: 2 };
    const stream = (store: boolean) =>
      [
        { type: 'response.created', sequence_number: 0, response: response(store, null) },
        { type: 'response.output_text.delta', sequence_number: 1, delta: 'résumé "usage"' },
        { type: 'response.completed', sequence_number: 2, response: response(store, usage) },
      ]
        .map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`)
        .join('');
    for (const size of [1, 7, 10_000]) {
      const bytes = Buffer.from(stream(true));
      const s = new SseUsageScanner(true);
      for (let i = 0; i < bytes.length; i += size) s.feed(bytes.subarray(i, i + size));
      assert.equal(s.storedResponseId, 'resp_é1', `pieces of ${size}`);
      assert.deepEqual(s.usage, { promptTokens: 5, completionTokens: 2 });
    }
    const unstored = new SseUsageScanner(true);
    unstored.feed(Buffer.from(stream(false)));
    assert.equal(unstored.storedResponseId, undefined);
    const chat = new SseUsageScanner(false);
    chat.feed(Buffer.from(stream(true)));
    assert.equal(chat.storedResponseId, undefined);
  });
});
