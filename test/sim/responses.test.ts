/** The simulator's POST /v1/responses (vLLM's Responses API, its SimpleContext path) and its response store, driven by the openai client. */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request } from 'undici';
import OpenAI from 'openai';
import { startSimulator, type RunningSimulator, type SimOptions } from '../../src/sim/server.js';
import { ResponseStore } from '../../src/sim/responses.js';
import { saysNotHeld } from '../../src/proxy/stored-responses.js';

const agent = new Agent({ keepAliveTimeout: 1000 });
after(() => agent.close());

const FAST: SimOptions = { ttftOverheadMs: 1, prefillMsPerToken: 0, itlMs: 0 };
/** An input of several 64-character blocks (the sim's 16 tokens × 4 characters), so a conversation's prefix fills whole blocks. */
const LONG_INPUT = 'Tell me about the lighthouse keeper, the storm, the ship and the long night that followed it.';

const clientFor = (sim: RunningSimulator): OpenAI => new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: 'sk-test', maxRetries: 0 });

async function postJson(sim: RunningSimulator, body: unknown, headers: Record<string, string> = {}) {
  const res = await request(`${sim.url}/v1/responses`, {
    method: 'POST',
    dispatcher: agent,
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.statusCode, json: (await res.body.json()) as { error: { message: string; type: string; param: string | null; code: number } } };
}

async function withSims(count: number, opts: SimOptions, fn: (...sims: RunningSimulator[]) => Promise<void>): Promise<void> {
  const sims = await Promise.all(Array.from({ length: count }, () => startSimulator({ ...FAST, ...opts })));
  try {
    await fn(...sims);
  } finally {
    await Promise.all(sims.map((s) => s.close()));
  }
}

async function waitFor(check: () => boolean, timeoutMs = 2000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not reached in time');
    await sleep(5);
  }
}

describe('sim POST /v1/responses: answers', () => {
  let sim: RunningSimulator;
  before(async () => {
    sim = await startSimulator({ ...FAST, name: 'pod-r' });
  });
  after(() => sim.close());

  test('the openai client gets a response: output_text, usage and a resp_ id, in vLLM\'s shape', async () => {
    const r = await clientFor(sim).responses.create({ model: 'sim-model', input: 'Hi there', instructions: 'Be brief.', max_output_tokens: 5 });
    assert.match(r.id, /^resp_[0-9a-f]{32}$/);
    assert.equal(r.object, 'response');
    assert.equal(r.status, 'completed');
    assert.equal(r.model, 'sim-model');
    assert.equal(r.output_text.split(' ').length, 5);
    assert.equal(r.output.length, 1);
    const message = r.output[0]!;
    assert.ok(message.type === 'message');
    assert.match(message.id, /^msg_[0-9a-f]{32}$/);
    assert.equal(message.role, 'assistant');
    assert.equal(message.status, 'completed');
    assert.deepEqual(message.content, [{ type: 'output_text', text: r.output_text, annotations: [] }]);
    // The prompt is the conversation as JSON lines: the instructions' system message, then the input.
    const prompt = '{"role":"system","content":"Be brief."}\n{"role":"user","content":"Hi there"}\n';
    const inputTokens = Math.ceil(prompt.length / 4);
    assert.deepEqual(r.usage, {
      input_tokens: inputTokens,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: 5,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: inputTokens + 5,
    });
    assert.equal(r.instructions, 'Be brief.');
    assert.equal(r.max_output_tokens, 5);
    assert.equal(r.previous_response_id, null);
    assert.equal(r.incomplete_details, null);
    assert.deepEqual(r.tools, []);
    assert.equal(r.tool_choice, 'auto');
    // vLLM's answer says neither whether it stored the response nor an error.
    assert.ok(!Object.hasOwn(r, 'store') && !Object.hasOwn(r, 'error'));
    const again = await clientFor(sim).responses.create({ model: 'sim-model', input: 'Hi there' });
    assert.notEqual(again.id, r.id);
    // vLLM's request_id extension names the response.
    const named = await clientFor(sim).responses.create({ model: 'sim-model', input: 'Hi', request_id: 'resp_mine' } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.equal(named.id, 'resp_mine');
  });

  test('input as messages with text parts; another shape is a 400 naming input', async () => {
    const r = await clientFor(sim).responses.create({
      model: 'sim-model',
      input: [
        { role: 'user', content: 'first' },
        // An output item of an earlier response, as the client sends it back.
        { type: 'message', id: 'msg_1', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'reply', annotations: [] }] },
        { role: 'user', content: [{ type: 'input_text', text: 'second' }] },
      ],
    });
    assert.ok(r.output_text.length > 0);
    for (const input of [42, [], [{ role: 'user' }], [{ role: 'tool', content: 'x' }], [{ type: 'function_call_output', call_id: 'c', output: 'x' }],
      [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }]]) {
      const bad = await postJson(sim, { model: 'sim-model', input });
      assert.equal(bad.status, 400, JSON.stringify(input));
      assert.equal(bad.json.error.param, 'input');
    }
    const missing = await postJson(sim, { model: 'sim-model' });
    assert.equal(missing.status, 400);
    assert.equal(missing.json.error.param, 'input');
  });

  test('the model rules of chat: another model is a 404, none is the served one', async () => {
    await assert.rejects(clientFor(sim).responses.create({ model: 'other', input: 'x' }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.NotFoundError);
      assert.match(err.message, /The model `other` does not exist/);
      return true;
    });
    const r = await clientFor(sim).responses.create({ input: 'x' } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.equal(r.model, 'sim-model');
  });

  test('streamed: vLLM\'s events in order, numbered from 0, one delta per token joining to the text, usage in response.completed, no [DONE]', async () => {
    const stream = await clientFor(sim).responses.create({ model: 'sim-model', input: 'stream please', max_output_tokens: 6, stream: true });
    const types: string[] = [];
    const sequence: number[] = [];
    let deltas = '';
    let done: OpenAI.Responses.ResponseTextDoneEvent | undefined;
    let completed: OpenAI.Responses.Response | undefined;
    let created: OpenAI.Responses.Response | undefined;
    for await (const e of stream) {
      types.push(e.type);
      sequence.push(e.sequence_number);
      if (e.type === 'response.created') created = e.response;
      if (e.type === 'response.output_text.delta') {
        assert.equal(e.output_index, 0);
        assert.equal(e.content_index, 0);
        assert.match(e.item_id, /^msg_/);
        assert.deepEqual(e.logprobs, []);
        deltas += e.delta;
      }
      if (e.type === 'response.output_text.done') done = e;
      if (e.type === 'response.completed') completed = e.response;
    }
    assert.deepEqual(types, [
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      ...Array<string>(6).fill('response.output_text.delta'),
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    assert.deepEqual(sequence, types.map((_, i) => i));
    assert.equal(created?.status, 'in_progress');
    assert.deepEqual(created?.output, []);
    assert.equal(created?.usage, null);
    assert.equal(done?.text, deltas);
    assert.ok(completed);
    assert.equal(completed.status, 'completed');
    assert.equal(completed.id, created?.id);
    const message = completed.output[0]!;
    assert.ok(message.type === 'message');
    assert.equal(message.id, done?.item_id);
    assert.deepEqual(message.content, [{ type: 'output_text', text: deltas, annotations: [] }]);
    assert.equal(completed.usage?.output_tokens, 6);
    assert.ok(completed.usage.input_tokens > 0);
    assert.equal(completed.usage.total_tokens, completed.usage.input_tokens + 6);

    const raw = await request(`${sim.url}/v1/responses`, {
      method: 'POST', dispatcher: agent, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sim-model', input: 'raw', max_output_tokens: 2, stream: 'true' }),
    });
    assert.match(String(raw.headers['content-type']), /^text\/event-stream/);
    const text = await raw.body.text();
    assert.ok(text.startsWith('event: response.created\ndata: {"type":"response.created","sequence_number":0,'), text.slice(0, 120));
    assert.ok(text.endsWith('}\n\n'));
    assert.doesNotMatch(text, /\[DONE\]/);
  });

  test('x-return-error and the failure rate answer their status at once, as on the chat route', async () => {
    const r = await postJson(sim, { model: 'sim-model', input: 'x' }, { 'x-return-error': '503' });
    assert.equal(r.status, 503);
    assert.equal(r.json.error.code, 503);
    await withSims(1, { failureRate: 1, failureStatus: 502 }, async (failing) => {
      const f = await postJson(failing!, { model: 'sim-model', input: 'x' });
      assert.equal(f.status, 502);
      assert.equal(f.json.error.message, 'Injected failure (failure rate)');
    });
  });
});

describe('sim POST /v1/responses: the store and previous_response_id', () => {
  test('store on: three turns chained by previous_response_id (the second streamed); each prompt holds the conversation and hits its cache', async () => {
    await withSims(2, { responsesStore: true }, async (sim, other) => {
      const client = clientFor(sim!);
      const first = await client.responses.create({ model: 'sim-model', input: LONG_INPUT, instructions: 'Answer in one line.' });
      const firstTokens = first.usage!.input_tokens + first.usage!.output_tokens;

      const stream = await client.responses.create({ model: 'sim-model', input: 'And after that?', previous_response_id: first.id, stream: true });
      let second: OpenAI.Responses.Response | undefined;
      for await (const e of stream) if (e.type === 'response.completed') second = e.response;
      assert.ok(second);
      assert.equal(second.previous_response_id, first.id);
      assert.ok(second.usage!.input_tokens > firstTokens, `the second prompt holds the first turn (${second.usage!.input_tokens} > ${firstTokens})`);
      assert.ok(second.usage!.input_tokens_details.cached_tokens > 0, 'the first prompt\'s blocks hit');

      const third = await client.responses.create({ model: 'sim-model', input: 'And finally?', previous_response_id: second.id });
      assert.equal(third.previous_response_id, second.id);
      assert.ok(third.usage!.input_tokens > second.usage!.input_tokens + second.usage!.output_tokens);
      assert.ok(third.usage!.input_tokens_details.cached_tokens > second.usage!.input_tokens_details.cached_tokens,
        `the third turn hits the second's prompt (${JSON.stringify(third.usage)})`);

      // The store is the server's own: the same follow-up on another server is vLLM's 404.
      await assert.rejects(clientFor(other!).responses.create({ model: 'sim-model', input: 'And finally?', previous_response_id: second.id }), (err: unknown) => {
        assert.ok(err instanceof OpenAI.NotFoundError, String(err));
        assert.equal(err.message, `404 Response with id '${second.id}' not found.`);
        assert.deepEqual(err.error, { message: `Response with id '${second.id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 });
        return true;
      });
    });
  });

  test('store on, store: false: the response is not kept', async () => {
    await withSims(1, { responsesStore: true }, async (sim) => {
      const r = await clientFor(sim!).responses.create({ model: 'sim-model', input: 'x', store: false });
      const follow = await postJson(sim!, { model: 'sim-model', input: 'y', previous_response_id: r.id });
      assert.equal(follow.status, 404);
    });
  });

  test('store off (vLLM\'s default): store reads false and a follow-up is vLLM\'s 404', async () => {
    await withSims(1, {}, async (sim) => {
      const r = await clientFor(sim!).responses.create({ model: 'sim-model', input: LONG_INPUT, store: true });
      const follow = await postJson(sim!, { model: 'sim-model', input: 'more', previous_response_id: r.id });
      assert.equal(follow.status, 404);
      assert.deepEqual(follow.json.error, { message: `Response with id '${r.id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 });
      // The gateway reads it as a server not holding the response: it asks the next server.
      assert.equal(saysNotHeld(Buffer.from(JSON.stringify(follow.json)), r.id), true);
    });
  });

  test('background: a 400 — vLLM\'s with the store off, or with store: false; with the store on the sim does not implement it', async () => {
    await withSims(2, {}, async (off) => {
      const r = await postJson(off!, { model: 'sim-model', input: 'x', background: true });
      assert.equal(r.status, 400);
      assert.match(r.json.error.message, /does not support `store=True` and therefore does not support the background mode/);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.equal(r.json.error.param, null, 'vLLM names no parameter');
      const notStored = await postJson(off!, { model: 'sim-model', input: 'x', background: true, store: false });
      assert.equal(notStored.status, 400);
      assert.match(notStored.json.error.message, /background can only be used when `store` is true/);
    });
    await withSims(1, { responsesStore: true }, async (on) => {
      await assert.rejects(clientFor(on!).responses.create({ model: 'sim-model', input: 'x', background: true }), (err: unknown) => {
        assert.ok(err instanceof OpenAI.BadRequestError, String(err));
        assert.match(err.message, /sluice sim does not implement background mode/);
        return true;
      });
    });
  });

  test('the store keeps the newest responses and drops the oldest past its limits', () => {
    const store = new ResponseStore({ responses: 2, chars: 10 });
    store.set('a', 'aaa');
    store.set('b', 'bbb');
    store.set('c', 'ccc');
    assert.equal(store.get('a'), undefined);
    assert.equal(store.get('b'), 'bbb');
    assert.equal(store.get('c'), 'ccc');
    store.set('d', 'dddddddd'); // 11 characters with c's: c goes too
    assert.equal(store.size, 1);
    assert.equal(store.get('d'), 'dddddddd');
  });
});

describe('sim POST /v1/responses: admission and disconnects, as the chat route', () => {
  test('a full waiting queue is a 429; a streamed response has its headers and first events once accepted; a client that goes away aborts it', async () => {
    await withSims(1, { maxNumSeqs: 1, maxWaiting: 0, ttftOverheadMs: 60_000 }, async (sim) => {
      const controller = new AbortController();
      const res = await request(`${sim!.url}/v1/responses`, {
        method: 'POST', dispatcher: agent, headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sim-model', input: 'slow', stream: true }),
        signal: controller.signal,
      });
      assert.equal(res.statusCode, 200, 'headers before the (minute-long) prefill');
      // Read up to response.in_progress without ending the body (leaving a for-await loop would close the connection).
      let first = '';
      await new Promise<void>((resolve) => {
        const onData = (chunk: Buffer): void => {
          first += chunk.toString();
          if (!first.includes('event: response.in_progress')) return;
          res.body.off('data', onData);
          res.body.pause();
          resolve();
        };
        res.body.on('data', onData);
      });
      assert.match(first, /^event: response.created\n/);
      assert.equal(sim!.engine.actualGauges().running, 1);

      const refused = await postJson(sim!, { model: 'sim-model', input: 'x' });
      assert.equal(refused.status, 429);
      assert.equal(refused.json.error.message, 'Failed to enqueue request, waiting requests queue is full');

      controller.abort();
      await waitFor(() => sim!.engine.actualGauges().running === 0);
    });
  });
});
