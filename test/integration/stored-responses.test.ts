/**
 * A Responses API request continuing a stored response (`previous_response_id`) goes to the server
 * that holds it (proxy/stored-responses.ts): vLLM keeps a stored response in that server's memory
 * alone, and any other answers 404. Fake vLLM servers that store what they answer and refuse an id
 * they do not hold, as vLLM does with VLLM_ENABLE_RESPONSES_API_STORE; the real `openai` client.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { request } from 'undici';
import type { Gateway } from '../../src/app.js';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import type { Logger } from 'pino';
import { alwaysDisaggProfiles, captureLogger, fleetConfig, gatewayFor, nothingInFlight, startFleet, waitForMetrics } from '../helpers/fleet.js';
import type { ServerResponse } from 'node:http';
import { startFakeBackend, vllmPage, type Behaviour, type FakeBackend, type Received } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';
import { systemClock } from '../../src/util/clock.js';

interface ResponsesServer {
  backend: FakeBackend;
  /** Ids of the responses it stored. */
  stored: Set<string>;
  /** Responses API requests it answered 2xx. */
  served: number;
}

/**
 * A vLLM Responses API server: answers JSON or, for `stream: true`, vLLM's event sequence, with no
 * `store` member (vLLM's response object has none) and the client's `request_id` as the id when it
 * sends one (as vLLM); keeps what it answers unless the request says `store: false`; an unknown
 * `previous_response_id` gets vLLM's 404. `pad`: characters of output text (a large answer).
 */
async function responsesServer(name: string, opts: { pad?: number; status?: number } = {}): Promise<ResponsesServer> {
  const s: ResponsesServer = { backend: undefined as unknown as FakeBackend, stored: new Set(), served: 0 };
  let n = 0;
  s.backend = await startFakeBackend((r, res) => {
    const body = JSON.parse(r.body) as { model?: string; stream?: boolean; store?: boolean; previous_response_id?: string; request_id?: string };
    const previous = body.previous_response_id;
    // vLLM checks the model first: another model's 404 says nothing of the response.
    if (body.model === 'missing') {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'The model `missing` does not exist.', type: 'NotFoundError', param: 'model', code: 404 } }));
      return;
    }
    if (previous !== undefined && !s.stored.has(previous)) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `Response with id '${previous}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } }));
      return;
    }
    s.served++;
    const id = body.request_id ?? `resp_${name}_${++n}`;
    if (body.store !== false) s.stored.add(id);
    const response = (status: string, usage: unknown) => ({
      id,
      object: 'response',
      created_at: 1,
      model: 'm',
      status,
      output: [{ type: 'message', id: `msg_${n}`, role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: `from ${name}${' '.repeat(opts.pad ?? 0)}`, annotations: [] }] }],
      usage,
      previous_response_id: previous ?? null,
    });
    const usage = { input_tokens: 5, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 7 };
    if (body.stream !== true) {
      res.writeHead(opts.status ?? 200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(response('completed', usage)));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const events = [
      { type: 'response.created', response: response('in_progress', null) },
      { type: 'response.output_text.delta', item_id: `msg_${n}`, output_index: 0, content_index: 0, delta: `from ${name}`, logprobs: [] },
      { type: 'response.completed', response: response('completed', usage) },
    ];
    res.end(events.map((e, i) => `event: ${e.type}\ndata: ${JSON.stringify({ ...e, sequence_number: i })}\n\n`).join(''));
  });
  return s;
}

interface Fleet {
  gw: Gateway;
  servers: ResponsesServer[];
  client: OpenAI;
  close(): Promise<void>;
}

/** `server`: YAML added to the server block; `upstream`: members added to server.upstream. */
async function fleet(servers: ResponsesServer[], server = '', logger?: Logger, upstream = ''): Promise<Fleet> {
  const text = fleetConfig(servers.map((s, i) => ({ name: `e${i}`, port: s.backend.port })), '', server).replace('retries: 2 }', `retries: 2${upstream} }`);
  const gw = await gatewayFor(text, { logger });
  await waitForMetrics(gw);
  return {
    gw,
    servers,
    client: new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'k', maxRetries: 0 }),
    async close() {
      await gw.close();
      await Promise.all(servers.map((s) => s.backend.close()));
    },
  };
}

async function metric(gw: Gateway, name: string, labels = ''): Promise<number> {
  const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
  const line = text.split('\n').find((l) => l.startsWith(labels === '' ? `${name} ` : `${name}{`) && l.includes(labels));
  assert.ok(line !== undefined, `${name}{${labels}} exposed`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

/** Every server but `home` looks idle, `home` busy (`waiting` queued): the scorers would send anything elsewhere. */
async function makeBusy(f: Fleet, home: number, waiting: number, gateways: Gateway[] = [f.gw]): Promise<void> {
  f.servers.forEach((s, i) => (s.backend.metrics = vllmPage(i === home ? waiting : 0, i === home ? 8 : 0)));
  for (const gw of gateways) {
    const ep = gw.pool.endpoints.find((e) => e.name === `e${home}`)!;
    const at = ep.metricsAt;
    await until(() => ep.metricsAt > at && ep.metrics?.waiting === waiting, 5000, `e${home} scraped busy`);
  }
}

const homeOf = (f: Fleet, id: string): number => f.servers.findIndex((s) => s.stored.has(id));

test('a conversation by previous_response_id stays on the server holding it, streamed or not, however busy that server looks', async () => {
  const log = captureLogger('debug');
  const f = await fleet(await Promise.all([0, 1, 2, 3].map((i) => responsesServer(`s${i}`))), '', log.logger);
  try {
    const first = await f.client.responses.create({ model: 'm', input: 'hello' });
    const home = homeOf(f, first.id);
    assert.ok(home >= 0, 'the first turn was stored');
    // Busy (4 waiting: under the detector's threshold of 5) and then saturated (10 waiting): the
    // queue scorer and then the saturation filter would send a new request elsewhere.
    let previous = first.id;
    for (const [waiting, stream] of [[4, false], [4, true], [10, false], [10, true]] as const) {
      await makeBusy(f, home, waiting);
      let id: string;
      if (stream) {
        const events = [];
        for await (const e of await f.client.responses.create({ model: 'm', input: 'and then?', previous_response_id: previous, stream: true })) events.push(e);
        const done = events.at(-1)!;
        assert.equal(done.type, 'response.completed');
        id = (done as { response: { id: string } }).response.id;
      } else {
        const r = await f.client.responses.create({ model: 'm', input: 'and then?', previous_response_id: previous });
        assert.equal(r.output_text, `from s${home}`);
        id = r.id;
      }
      assert.equal(homeOf(f, id), home, `turn after ${previous} (waiting ${waiting}, stream ${stream}) served by its home`);
      previous = id;
    }
    assert.deepEqual(f.servers.map((s) => s.served), f.servers.map((_, i) => (i === home ? 5 : 0)));
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="pinned"'), 4);
    assert.equal(await metric(f.gw, 'sluice_stored_responses'), 5);
    const done = log.lines().filter((l) => l.msg === 'request done');
    assert.deepEqual(done.map((l) => l.previousResponse), [undefined, 'pinned', 'pinned', 'pinned', 'pinned']);
    // The decision line says why one candidate was scheduled over.
    const decisions = log.lines().filter((l) => l.msg === 'scheduling decision');
    assert.deepEqual(decisions.map((l) => l.previousResponse), [undefined, 'pinned', 'pinned', 'pinned', 'pinned']);
    // A request continuing no response is scheduled as usual: away from the busy home.
    await f.client.responses.create({ model: 'm', input: 'new conversation' });
    assert.equal(f.servers[home]!.served, 5);
    await nothingInFlight(f.gw);
  } finally {
    await f.close();
  }
});

test('the answer to a request that said store: false is not remembered, nor an id longer than 256 characters; an id no server holds is asked of each server once, then the 404 relayed', async () => {
  const log = captureLogger('debug');
  const f = await fleet([await responsesServer('a'), await responsesServer('b')], '', log.logger);
  try {
    await f.client.responses.create({ model: 'm', input: 'hello', store: false });
    // vLLM takes a client's request_id as the response's id: a huge one costs no memory here.
    await f.client.responses.create({ model: 'm', input: 'hello', request_id: `resp_${'x'.repeat(300_000)}` } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.equal(await metric(f.gw, 'sluice_stored_responses'), 0);
    await assert.rejects(f.client.responses.create({ model: 'm', input: 'next', previous_response_id: 'resp_never_seen' }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.NotFoundError);
      assert.match(err.message, /Response with id 'resp_never_seen' not found/);
      return true;
    });
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="unknown"'), 1);
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="pinned"'), 0);
    assert.equal(await metric(f.gw, 'sluice_previous_response_search_total', 'result="not_found"'), 1);
    assert.equal(await metric(f.gw, 'sluice_previous_response_search_total', 'result="found"'), 0);
    const asked = (s: ResponsesServer) => s.backend.received.filter((r) => r.body.includes('resp_never_seen')).length;
    assert.deepEqual(f.servers.map(asked), [1, 1], 'each server asked once');
    const done = log.lines().filter((l) => l.msg === 'request done').at(-1)!;
    assert.equal(done.status, 404);
    assert.equal(done.attempts, 2);
    assert.equal(done.previousResponseSearch, 'not_found');
    // Only the answer relayed is timed: one TTFT per request, not per server asked.
    assert.equal(await metric(f.gw, 'llm_d_epp_request_ttft_seconds_count', 'streaming="false"'), 3);

    // Another 404 (here: another model's) is about the request, not the server: relayed at once.
    const before = f.servers.map((s) => s.backend.received.length);
    const r = await request(`${f.gw.apiUrl}/v1/responses`, { method: 'POST', body: JSON.stringify({ model: 'missing', input: 'x', previous_response_id: 'resp_never_seen' }) });
    assert.equal(r.statusCode, 404);
    assert.match(await r.body.text(), /The model `missing` does not exist/);
    assert.equal(f.servers.reduce((n, s, i) => n + s.backend.received.length - before[i]!, 0), 1, 'one server asked');
    assert.equal(await metric(f.gw, 'sluice_previous_response_search_total', 'result="not_found"'), 1);
    await nothingInFlight(f.gw);
  } finally {
    await f.close();
  }
});

test('server.storedResponses: 0 remembers nothing and asks no other server', async () => {
  const f = await fleet([await responsesServer('a'), await responsesServer('b')], '\n  storedResponses: 0');
  try {
    const first = await f.client.responses.create({ model: 'm', input: 'hello' });
    assert.equal(await metric(f.gw, 'sluice_stored_responses'), 0);
    const home = homeOf(f, first.id);
    await makeBusy(f, home, 4);
    await assert.rejects(f.client.responses.create({ model: 'm', input: 'next', previous_response_id: first.id }), OpenAI.NotFoundError);
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="unknown"'), 1);
    assert.equal(f.servers[home]!.backend.received.length, 1, 'the home was not asked');
    assert.equal(await metric(f.gw, 'sluice_previous_response_search_total', 'result="not_found"'), 0);
  } finally {
    await f.close();
  }
});

test('the home server gone from the pool: the request is scheduled as usual (unavailable); a home that drops connections is tried again, then the others are asked and their 404 relayed', async () => {
  // s1 stores as the others do, but can be told to drop every connection.
  let drop = false;
  const servers = [await responsesServer('s0'), await responsesServer('s1'), await responsesServer('s2')];
  const dropping = servers[1]!;
  const answer = dropping.backend.behave;
  dropping.backend.behave = (r, res) => (drop ? res.socket?.destroy() : answer(r, res));
  const f = await fleet(servers);
  try {
    // Turns until one lands on s1 (the picker takes equal scores in turn).
    let onS1: string | undefined;
    for (let i = 0; i < 6 && onS1 === undefined; i++) {
      const r = await f.client.responses.create({ model: 'm', input: `hello ${i}` });
      if (homeOf(f, r.id) === 1) onS1 = r.id;
    }
    assert.ok(onS1 !== undefined, 'a first turn served by s1');
    drop = true;
    const received = () => servers.map((s) => s.backend.received.length);
    const before = received();
    // Its store went with it: the client gets what a replica that never knew the home would get.
    const r = await request(`${f.gw.apiUrl}/v1/responses`, { method: 'POST', body: JSON.stringify({ model: 'm', input: 'next', previous_response_id: onS1 }) });
    assert.equal(r.statusCode, 404);
    assert.equal(await r.body.text(), JSON.stringify({ error: { message: `Response with id '${onS1}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } }));
    assert.deepEqual(received().map((n, i) => n - before[i]!), [1, 2, 1], 'the home twice (a connection lost at once gets one more try), each other once');
    assert.equal(await metric(f.gw, 'sluice_previous_response_search_total', 'result="not_found"'), 1);
    drop = false;

    // s1 removed by a reload: its responses are gone with it.
    const text = fleetConfig(servers.map((s, i) => ({ name: `e${i}`, port: s.backend.port })).filter((e) => e.name !== 'e1'));
    await f.gw.reload(loadConfigText(text, 'test.yaml', builtinRegistry()));
    await assert.rejects(f.client.responses.create({ model: 'm', input: 'next', previous_response_id: onS1 }), OpenAI.NotFoundError);
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="unavailable"'), 1);
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="pinned"'), 1);
    await nothingInFlight(f.gw);
  } finally {
    await f.close();
  }
});

test('a conversation continued through another replica, or after a restart: the servers are asked in turn until one holds it, which is remembered', async () => {
  const log = captureLogger('debug');
  const f = await fleet(await Promise.all([0, 1, 2].map((i) => responsesServer(`s${i}`))));
  // A second replica over the same servers: it relayed none of their answers (as a restarted gateway).
  const other = await gatewayFor(fleetConfig(f.servers.map((s, i) => ({ name: `e${i}`, port: s.backend.port }))), { logger: log.logger });
  try {
    await waitForMetrics(other);
    const client = new OpenAI({ baseURL: `${other.apiUrl}/v1`, apiKey: 'k', maxRetries: 0 });
    const first = await f.client.responses.create({ model: 'm', input: 'hello' });
    const home = homeOf(f, first.id);
    // The home looks busiest, so the other replica tries the others first.
    await makeBusy(f, home, 4, [f.gw, other]);
    const received = () => f.servers.map((s) => s.backend.received.length);
    const before = received();
    const events = [];
    for await (const e of await client.responses.create({ model: 'm', input: 'and then?', previous_response_id: first.id, stream: true })) events.push(e);
    const done = events.at(-1) as { type: string; response: { id: string } };
    assert.equal(done.type, 'response.completed');
    assert.equal(homeOf(f, done.response.id), home, 'served by the home');
    assert.deepEqual(received().map((n, i) => n - before[i]!), [1, 1, 1], 'the two others said they do not hold it, then the home answered');
    assert.equal(await metric(other, 'sluice_previous_response_routing_total', 'result="unknown"'), 1);
    assert.equal(await metric(other, 'sluice_previous_response_search_total', 'result="found"'), 1);
    // The previous response is remembered where it was found, and the new one too.
    assert.equal(await metric(other, 'sluice_stored_responses'), 2);
    assert.equal(await metric(other, 'llm_d_epp_request_ttft_seconds_count', 'streaming="true"'), 1);
    const line = log.lines().find((l) => l.msg === 'request done')!;
    assert.deepEqual([line.previousResponse, line.previousResponseSearch, line.attempts, line.endpoint], ['unknown', 'found', 3, `e${home}`]);

    // A second answer to the same previous response (a fork) goes straight there.
    const fork = await client.responses.create({ model: 'm', input: 'or else?', previous_response_id: first.id });
    assert.equal(homeOf(f, fork.id), home);
    assert.equal(await metric(other, 'sluice_previous_response_routing_total', 'result="pinned"'), 1);
    assert.deepEqual(received().map((n, i) => n - before[i]!), [1, 1, 1].map((n, i) => (i === home ? n + 1 : n)));

    // A pinned home that lost the response (its server restarted): its 404 is relayed, no other server asked.
    f.servers[home]!.stored.clear();
    const asked = received();
    await assert.rejects(client.responses.create({ model: 'm', input: 'again', previous_response_id: fork.id }), OpenAI.NotFoundError);
    assert.deepEqual(received().map((n, i) => n - asked[i]!), asked.map((_, i) => (i === home ? 1 : 0)));
    await nothingInFlight(other);
  } finally {
    await other.close();
    await f.close();
  }
});

test('asking the servers in turn spends no retries: with upstream.retries 1, one not holding it and one dropping the connection, the third is found', async () => {
  const servers = [await responsesServer('s0'), await responsesServer('s1'), await responsesServer('s2')];
  const answer = servers[1]!.backend.behave;
  let drop = false;
  servers[1]!.backend.behave = (r, res) => (drop ? res.socket?.destroy() : answer(r, res));
  const gw = await gatewayFor(fleetConfig(servers.map((s, i) => ({ name: `e${i}`, port: s.backend.port }))).replace('retries: 2', 'retries: 1'));
  const f: Fleet = { gw, servers, client: new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'k', maxRetries: 0 }), close: async () => {
    await gw.close();
    await Promise.all(servers.map((s) => s.backend.close()));
  } };
  try {
    await waitForMetrics(gw);
    servers[2]!.stored.add('resp_elsewhere');
    await makeBusy(f, 2, 4);
    drop = true;
    const r = await f.client.responses.create({ model: 'm', input: 'next', previous_response_id: 'resp_elsewhere' });
    assert.equal(homeOf(f, r.id), 2);
    assert.deepEqual(servers.map((s) => s.backend.received.length), [1, 1, 1]);
    assert.equal(await metric(gw, 'sluice_previous_response_search_total', 'result="found"'), 1);
    assert.equal(await metric(gw, 'llm_d_epp_upstream_retries_total', 'endpoint_name="e1"'), 1);
    await nothingInFlight(gw);
  } finally {
    await f.close();
  }
});

test('P/D: a continued response goes to the decode server holding it, decode-only as every Responses API request', async () => {
  const servers = [await responsesServer('p'), await responsesServer('d0'), await responsesServer('d1')];
  const extra = alwaysDisaggProfiles('sidecar');
  const roles = ['prefill', 'decode', 'decode'];
  const gw = await gatewayFor(fleetConfig(servers.map((s, i) => ({ name: `e${i}`, port: s.backend.port, labels: { 'llm-d.ai/role': roles[i]! } })), extra));
  const f: Fleet = {
    gw,
    servers,
    client: new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'k', maxRetries: 0 }),
    close: async () => {
      await gw.close();
      await Promise.all(servers.map((s) => s.backend.close()));
    },
  };
  try {
    await waitForMetrics(gw);
    const first = await f.client.responses.create({ model: 'm', input: 'hello' });
    const home = homeOf(f, first.id);
    assert.ok(home === 1 || home === 2, 'served by a decode server');
    // Decode-only: the routing sidecar passes /v1/responses to its decoder (no prefill leg).
    assert.equal(servers[home]!.backend.received.at(-1)!.headers['x-prefiller-host-port'], undefined);
    await makeBusy(f, home, 4);
    const next = await f.client.responses.create({ model: 'm', input: 'next', previous_response_id: first.id });
    assert.equal(homeOf(f, next.id), home);
    assert.equal(servers[home]!.backend.received.at(-1)!.headers['x-prefiller-host-port'], undefined);
    const decisions = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
    assert.match(decisions, /llm_d_epp_disagg_decision_total\{model_name="m",decision_type="decode-only"\} 2/);
  } finally {
    await f.close();
  }
});

test('an answer over 1 MiB (JSON) and a 201 answer are remembered: the id is read from its first bytes', async () => {
  for (const opts of [{ pad: 1_500_000 }, { status: 201 }]) {
    const f = await fleet([await responsesServer('a', opts), await responsesServer('b', opts)]);
    try {
      const first = await f.client.responses.create({ model: 'm', input: 'hello' });
      const home = homeOf(f, first.id);
      await makeBusy(f, home, 4);
      const next = await f.client.responses.create({ model: 'm', input: 'next', previous_response_id: first.id });
      assert.equal(homeOf(f, next.id), home, JSON.stringify(opts));
      assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="pinned"'), 1);
    } finally {
      await f.close();
    }
  }
});

test('a home set aside by outlier detection still gets its conversations (any other server would answer 404)', async () => {
  const servers = [await responsesServer('s0'), await responsesServer('s1')];
  const f = await fleet(servers, '', undefined, ', outlierDetection: { consecutiveFailures: 2, baseEjectionTime: 1m }');
  try {
    const first = await f.client.responses.create({ model: 'm', input: 'hello' });
    const home = homeOf(f, first.id);
    // Two 5xx answers in a row set the home aside for a minute.
    const answer = servers[home]!.backend.behave;
    servers[home]!.backend.behave = (r, res) => (JSON.parse(r.body).input === 'fail' ? res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom","code":500}}') : answer(r, res));
    const ep = f.gw.pool.endpoints.find((e) => e.name === `e${home}`)!;
    for (let i = 0; i < 6 && f.gw.pool.eligible(Date.now()).includes(ep); i++) {
      await f.client.responses.create({ model: 'm', input: 'fail' }).catch(() => undefined);
    }
    assert.ok(!f.gw.pool.eligible(Date.now()).includes(ep), 'the home is set aside');
    const next = await f.client.responses.create({ model: 'm', input: 'next', previous_response_id: first.id });
    assert.equal(homeOf(f, next.id), home);
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="pinned"'), 1);
  } finally {
    await f.close();
  }
});

test('simulators with the store on: a six-turn conversation through the gateway, streamed every other turn, each turn finding the conversation cached', async () => {
  const f = await startFleet(4, { responsesStore: true });
  try {
    const client = new OpenAI({ baseURL: `${f.gw.apiUrl}/v1`, apiKey: 'k', maxRetries: 0 });
    const words = 'The keeper opens the lower paddles and the chamber empties into the river below. '.repeat(3);
    let previous: string | undefined;
    const cached: number[] = [];
    for (let turn = 0; turn < 6; turn++) {
      const body = { model: 'sim-model', input: `${turn}: ${words}`, max_output_tokens: 8, previous_response_id: previous };
      let response: { id: string; usage?: { input_tokens_details: { cached_tokens: number } } | null };
      if (turn % 2 === 1) {
        let done: typeof response | undefined;
        for await (const e of await client.responses.create({ ...body, stream: true })) if (e.type === 'response.completed') done = e.response;
        response = done!;
      } else response = await client.responses.create(body);
      cached.push(response.usage?.input_tokens_details.cached_tokens ?? 0);
      previous = response.id;
    }
    assert.equal(cached[0], 0);
    for (let t = 1; t < 6; t++) assert.ok(cached[t]! > cached[t - 1]!, `turn ${t} finds more cached than turn ${t - 1}: ${cached.join(' ')}`);
    assert.equal(await metric(f.gw, 'sluice_previous_response_routing_total', 'result="pinned"'), 5);
    // A restarted gateway finds the conversation: the simulators' 404 is vLLM's. (Its first pick may
    // be the home by chance; the fake-server tests above fix the order and count every server asked.)
    const restarted = await gatewayFor(fleetConfig(f.sims.map((s) => ({ name: s.name, port: s.port }))));
    try {
      await waitForMetrics(restarted);
      const again = new OpenAI({ baseURL: `${restarted.apiUrl}/v1`, apiKey: 'k', maxRetries: 0 });
      const r = await again.responses.create({ model: 'sim-model', input: `6: ${words}`, max_output_tokens: 8, previous_response_id: previous });
      assert.ok(r.usage!.input_tokens_details.cached_tokens > cached[5]!, 'the seventh turn reached the conversation\'s server');
      assert.equal(await metric(restarted, 'sluice_previous_response_routing_total', 'result="unknown"'), 1);
    } finally {
      await restarted.close();
    }
  } finally {
    await f.close();
  }
});

// --- The held 404s of a search, at the edges (from a review) -------------------------------------

const notHeldBody = (id: string) => JSON.stringify({ error: { message: `Response with id '${id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } });

type Answer = (r: Received, res: ServerResponse) => void;

/** A server that holds `holds` (answers 200) and answers a request continuing another response with vLLM's 404, or with `on404`. */
async function holder(name: string, holds: string[], on404?: Answer): Promise<FakeBackend> {
  return startFakeBackend((r, res) => {
    const prev = (JSON.parse(r.body) as { previous_response_id?: string }).previous_response_id;
    if (prev !== undefined && !holds.includes(prev)) {
      if (on404 !== undefined) return on404(r, res);
      res.writeHead(404, { 'content-type': 'application/json' }).end(notHeldBody(prev));
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ id: `resp_${name}_${r.body.length}`, object: 'response', status: 'completed', output: [], usage: null }));
  });
}

/** A gateway over `backends`, every one idle but `busy` (asked last); `upstream`: members added to server.upstream. */
async function searchGateway(backends: FakeBackend[], busy?: number, upstream = '', logger?: Logger): Promise<Gateway> {
  backends.forEach((b, i) => (b.metrics = vllmPage(i === busy ? 4 : 0, i === busy ? 8 : 0)));
  const gw = await gatewayFor(fleetConfig(backends.map((b, i) => ({ name: `e${i}`, port: b.port }))).replace('retries: 2 }', `retries: 2${upstream} }`), { logger });
  await waitForMetrics(gw);
  if (busy !== undefined) await until(() => gw.pool.endpoints[busy]!.metrics?.waiting === 4, 5000, 'the busy one scraped');
  return gw;
}

const postResponse = (gw: Gateway, body: object) => request(`${gw.apiUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

const unaryTtfts = (gw: Gateway) => metric(gw, 'llm_d_epp_request_ttft_seconds_count', 'streaming="false"');

/** Writes vLLM's not-found 404 in two chunks, without a content-length. */
const chunkedNotHeld: Answer = (r, res) => {
  const body = notHeldBody((JSON.parse(r.body) as { previous_response_id: string }).previous_response_id);
  res.writeHead(404, { 'content-type': 'application/json' });
  res.write(body.slice(0, 10));
  setTimeout(() => res.end(body.slice(10)), 30);
};

test('a held 404 is never timed: chunked and passed over, chunked and relayed, or longer than any not-found answer', async () => {
  const backends = [await holder('a', [], chunkedNotHeld), await holder('b', ['resp_x'])];
  let gw = await searchGateway(backends, 1);
  try {
    const found = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_x' });
    assert.equal(found.statusCode, 200);
    await found.body.text();
    const relayed = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_nowhere' });
    assert.equal(relayed.statusCode, 404);
    const text = await relayed.body.text();
    assert.equal(text, notHeldBody('resp_nowhere'));
    assert.equal(relayed.headers['content-length'], String(Buffer.byteLength(text)));
    assert.equal(await unaryTtfts(gw), 2, 'one TTFT per request');
    await nothingInFlight(gw);
  } finally {
    await gw.close();
    await Promise.all(backends.map((b) => b.close()));
  }
  const big = await holder('a', [], (_r, res) => res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: 'x'.repeat(200_000), code: 404 } })));
  gw = await searchGateway([big]);
  try {
    const r = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_x' });
    assert.equal(r.statusCode, 404);
    assert.ok((await r.body.text()).length > 200_000);
    assert.equal(await unaryTtfts(gw), 1);
    await nothingInFlight(gw);
  } finally {
    await gw.close();
    await big.close();
  }
});

test('a search ended by an error answer finds nothing: relayed, not remembered, not counted found', async () => {
  const backends = [await holder('a', []), await holder('b', [], (_r, res) => res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom","code":500}}'))];
  const gw = await searchGateway(backends, 1);
  try {
    const r = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_x' });
    assert.equal(r.statusCode, 500);
    await r.body.text();
    assert.equal(await metric(gw, 'sluice_stored_responses'), 0);
    assert.equal(await metric(gw, 'sluice_previous_response_search_total', 'result="found"'), 0);
    assert.equal(await metric(gw, 'sluice_previous_response_search_total', 'result="not_found"'), 0);
  } finally {
    await gw.close();
    await Promise.all(backends.map((b) => b.close()));
  }
});

test('a search asks the servers outlier detection set aside, last', async () => {
  let fail = false;
  const backends = [await holder('a', []), await holder('b', ['resp_x'])];
  const answer = backends[1]!.behave;
  backends[1]!.behave = (r, res) => (fail ? res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom","code":500}}') : answer(r, res));
  const gw = await searchGateway(backends, undefined, ', outlierDetection: { consecutiveFailures: 2, baseEjectionTime: 1m }');
  try {
    fail = true;
    const ep = gw.pool.endpoints.find((e) => e.name === 'e1')!;
    for (let i = 0; i < 8 && gw.pool.eligible(Date.now()).includes(ep); i++) await (await postResponse(gw, { model: 'm', input: 'fail' })).body.text();
    assert.ok(!gw.pool.eligible(Date.now()).includes(ep), 'e1 set aside');
    fail = false;
    const r = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_x' });
    assert.equal(r.statusCode, 200);
    assert.match(await r.body.text(), /resp_b_/);
    assert.equal(await metric(gw, 'sluice_previous_response_search_total', 'result="found"'), 1);
    await nothingInFlight(gw);
  } finally {
    await gw.close();
    await Promise.all(backends.map((b) => b.close()));
  }
});

test('a server that cannot be reached holds nothing: one not holding it and one dropping the connection give the 404 in either order', async () => {
  // The dropper holds the request 300 ms before it drops the connection: ruled out at once, no second try.
  for (const busy of [0, 1]) {
    const backends = [await startFakeBackend((_r, res) => void setTimeout(() => res.socket?.destroy(), 300)), await holder('b', [])];
    const log = captureLogger('debug');
    const gw = await searchGateway(backends, busy, '', log.logger);
    try {
      const r = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_x' });
      assert.equal(r.statusCode, 404, `the dropper asked ${busy === 0 ? 'last' : 'first'}`);
      assert.equal(await r.body.text(), notHeldBody('resp_x'));
      assert.equal(await metric(gw, 'sluice_previous_response_search_total', 'result="not_found"'), 1);
      // The request's endpoint is the one whose answer the client got.
      const done = log.lines().find((l) => l.msg === 'request done')!;
      assert.deepEqual([done.endpoint, done.attempts], ['e1', 2]);
      // Every scheduling decision logged picked a server (the run over none left is not one).
      assert.deepEqual(log.lines().filter((l) => l.msg === 'scheduling decision').map((l) => l.refused), [undefined, undefined]);
      await nothingInFlight(gw);
    } finally {
      await gw.close();
      await Promise.all(backends.map((b) => b.close()));
    }
  }
});

test('a search asks no silent server (down or hung: no scrape answered for several seconds), which would hold the request until upstream.headersTimeout', async () => {
  // e2 accepts the request and never answers; its scrapes fail.
  const backends = [await holder('a', []), await holder('b', []), await startFakeBackend(() => undefined)];
  // Asked, it would answer the client a 504 after 3 s.
  const gw = await searchGateway(backends, undefined, ', headersTimeout: 3s');
  try {
    backends[2]!.metrics = 500;
    const silent = gw.pool.endpoints[2]!;
    silent.metricsAt = systemClock.now() - 60_000;
    const r = await postResponse(gw, { model: 'm', input: 'x', previous_response_id: 'resp_x' });
    assert.equal(r.statusCode, 404);
    assert.equal(await r.body.text(), notHeldBody('resp_x'));
    assert.equal(backends[2]!.received.length, 0, 'the silent server was not asked');
    assert.equal(await metric(gw, 'sluice_previous_response_search_total', 'result="not_found"'), 1);
  } finally {
    await gw.close();
    await Promise.all(backends.map((b) => b.close()));
  }
});
