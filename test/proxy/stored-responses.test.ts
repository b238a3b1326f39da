import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../src/datalayer/endpoint.js';
import {
  candidatesFor,
  homeOf,
  MAX_RESPONSE_ID_LENGTH,
  previousResponseId,
  responseIdAtHead,
  responseIdOf,
  saysNotHeld,
  StoredResponses,
} from '../../src/proxy/stored-responses.js';
import { SseUsageScanner } from '../../src/proxy/usage.js';
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
  test('saysNotHeld: vLLM\'s not-found for that id (its error body, or its older one) and OpenAI\'s; no other 404', () => {
    const error = (message: unknown) => Buffer.from(JSON.stringify({ error: { message, type: 'invalid_request_error', param: 'response_id', code: 404 } }));
    const id = 'resp_1a2b';
    assert.equal(saysNotHeld(error(`Response with id '${id}' not found.`), id), true);
    assert.equal(saysNotHeld(Buffer.from(JSON.stringify({ object: 'error', message: `Response with id '${id}' not found.`, type: 'NotFoundError', code: 404 })), id), true);
    assert.equal(saysNotHeld(error(`Previous response with id '${id}' not found.`), id), true);
    // An id with quotes and escapes reads as it was sent.
    const odd = 'resp_"\\\u00e9\'';
    assert.equal(saysNotHeld(error(`Response with id '${odd}' not found.`), odd), true);
    // Another id, another 404, or no JSON.
    assert.equal(saysNotHeld(error(`Response with id 'resp_other' not found.`), id), false);
    assert.equal(saysNotHeld(error('The model `m` does not exist.'), id), false);
    assert.equal(saysNotHeld(error(undefined), id), false);
    assert.equal(saysNotHeld(Buffer.from('Not Found'), id), false);
    assert.equal(saysNotHeld(Buffer.from('null'), id), false);
    assert.equal(saysNotHeld(Buffer.from(`"Response with id '${id}' not found."`), id), false);
  });

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

  test('ids longer than MAX_RESPONSE_ID_LENGTH are not remembered (a client chooses vLLM\'s request_id)', () => {
    const s = new StoredResponses(10);
    s.remember('x'.repeat(MAX_RESPONSE_ID_LENGTH), 'o');
    s.remember('y'.repeat(MAX_RESPONSE_ID_LENGTH + 1), 'o');
    assert.equal(s.size, 1);
  });

  test('a Responses API request continuing a response: pinned to its server while it is in the pool, unavailable when not, unknown when never seen', () => {
    const [a, b] = [ep('a', 1), ep('b', 2)];
    const s = new StoredResponses(10);
    s.remember('resp_1', b.origin);
    assert.deepEqual(homeOf(req({ previous_response_id: 'resp_1' }), [a, b], s), { result: 'pinned', endpoint: b });
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
    // The candidates: the home alone when pinned, else the eligible ones.
    assert.deepEqual(candidatesFor({ result: 'pinned', endpoint: b }, [a]), [b]);
    assert.deepEqual(candidatesFor({ result: 'unknown' }, [a, b]), [a, b]);
    assert.deepEqual(candidatesFor(undefined, [a, b]), [a, b]);
  });

  test("a response object's id", () => {
    assert.equal(responseIdOf({ id: 'resp_1', object: 'response' }), 'resp_1');
    assert.equal(responseIdOf({ id: 'chatcmpl-1', object: 'chat.completion' }), undefined);
    assert.equal(responseIdOf({ id: 7, object: 'response' }), undefined);
    assert.equal(responseIdOf(null), undefined);
  });

  test("a JSON answer's id from its first bytes, where vLLM and OpenAI write it", () => {
    assert.equal(responseIdAtHead(Buffer.from('{"id":"resp_1","object":"response","output":[')), 'resp_1');
    assert.equal(responseIdAtHead(Buffer.from('\ufeff{ \n "id" : "resp_\\u00e9" ,')), 'resp_é');
    assert.equal(responseIdAtHead(Buffer.from('{"object":"response","id":"resp_1"}')), undefined);
    assert.equal(responseIdAtHead(Buffer.from('{"id":"resp_unterminated')), undefined);
    assert.equal(responseIdAtHead(Buffer.from('{"id":7}')), undefined);
    assert.equal(responseIdAtHead(Buffer.from('')), undefined);
  });

  test("a stream: its response's id from response.created, whatever the chunking; from a usage event when no created event came; none for a chat stream", () => {
    const response = (usage: unknown) => ({ id: 'resp_é1', object: 'response', status: 'completed', usage });
    const usage = { input_tokens: 5, output_tokens: 2 };
    const events = [
      { type: 'response.created', sequence_number: 0, response: response(null) },
      { type: 'response.output_text.delta', sequence_number: 1, delta: 'résumé "usage" "response.created"' },
      { type: 'response.completed', sequence_number: 2, response: response(usage) },
    ];
    const text = (list: typeof events, nl = '\n') => list.map((e) => `event: ${e.type}${nl}data: ${JSON.stringify(e)}${nl}${nl}`).join('');
    for (const nl of ['\n', '\r\n']) {
      for (const size of [1, 7, 10_000]) {
        const bytes = Buffer.from(text(events, nl));
        const s = new SseUsageScanner(true);
        for (let i = 0; i < bytes.length; i += size) s.feed(bytes.subarray(i, i + size));
        assert.equal(s.responseId, 'resp_é1', `pieces of ${size}`);
        assert.deepEqual(s.usage, { promptTokens: 5, completionTokens: 2 });
      }
    }
    const noCreated = new SseUsageScanner(true);
    noCreated.feed(Buffer.from(text(events.slice(1))));
    assert.equal(noCreated.responseId, 'resp_é1');
    const chat = new SseUsageScanner(false);
    chat.feed(Buffer.from(text(events)));
    assert.equal(chat.responseId, undefined);
  });
});
