/**
 * The edges of the HTTP surface (SPEC §2, §5): what Node would answer on its own — CONNECT, a
 * request without Host, an unknown `Expect`, malformed HTTP on a busy connection, an upload cut by
 * shutdown — and what a model server does badly (a stalled body, a refusal of /v1/models). Every
 * answer is a §5 error or a response; nothing ends silently or uncounted.
 */
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import type { ServerResponse } from 'node:http';
import { request } from 'undici';
import type { Gateway } from '../../src/app.js';
import { captureLogger, fleetConfig, gatewayFor, nothingInFlight, startFleet, waitForMetrics, withGateway } from '../helpers/fleet.js';
import { okJson, startFakeBackend, slowJson, vllmPage, type FakeBackend } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';
import { startSimulator } from '../../src/sim/server.js';

/** Sends raw bytes, returns everything the server sent until it closed (or `ms` passed). */
function raw(port: number, text: string, ms = 3000): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => s.write(text));
    let out = '';
    const t = setTimeout(() => {
      s.destroy();
      resolve(out);
    }, ms);
    s.on('data', (c) => (out += c));
    s.on('error', () => undefined);
    s.on('close', () => {
      clearTimeout(t);
      resolve(out);
    });
  });
}

/** A §5 error: the status, JSON content type and {"error":{message,type,param,code}}. */
function assertSpecError(response: string, status: number): { message: string } {
  assert.match(response, new RegExp(`^HTTP/1\\.1 ${status} `), JSON.stringify(response.slice(0, 200)));
  assert.match(response, /content-type: application\/json/i);
  const body = JSON.parse(response.slice(response.indexOf('\r\n\r\n') + 4)) as { error: { message: string; type: string; param: unknown; code: number } };
  assert.equal(body.error.code, status);
  assert.equal(typeof body.error.type, 'string');
  assert.ok('param' in body.error);
  return body.error;
}

/** A raw client connection, open: what it has received so far, and its close. */
async function connectRaw(port: number): Promise<{ socket: net.Socket; received: () => string; closed: Promise<unknown> }> {
  const socket = net.connect(port, '127.0.0.1');
  let out = '';
  socket.on('data', (c) => (out += c));
  socket.on('error', () => undefined);
  const closed = new Promise((resolve) => socket.on('close', resolve));
  await new Promise((resolve) => socket.once('connect', resolve));
  return { socket, received: () => out, closed };
}

const CHAT = '{"model":"m","messages":[{"role":"user","content":"h"}]}';
const post = (path: string, extra = '') =>
  `POST ${path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${CHAT.length}\r\nconnection: close\r\n${extra}\r\n${CHAT}`;
/** The chat request of `post`, keeping its connection alive (for a next request on it). */
const keepAlivePost = (path = '/v1/chat/completions') => post(path).replace('connection: close\r\n', '');

/** Starts the graceful stop and waits until the gateway says it is draining; `stopped` is the stop. */
async function startDraining(gw: Gateway): Promise<{ stopped: Promise<void> }> {
  const stopped = gw.close();
  await until(async () => (await request(`${gw.metricsUrl}/ready`).catch(() => undefined))?.statusCode !== 200, 3000, 'draining');
  return { stopped };
}

async function debugRequests(gw: Gateway): Promise<{ total: number; receivingBodies: number }> {
  return (await request(`${gw.metricsUrl}/debug/requests`)).body.json() as Promise<{ total: number; receivingBodies: number }>;
}

async function metricsText(gw: Gateway): Promise<string> {
  return (await request(`${gw.metricsUrl}/metrics`)).body.text();
}

describe('requests Node would answer on its own', () => {
  let backend: FakeBackend;
  let gw: Gateway;
  before(async () => {
    backend = await startFakeBackend();
    gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }]));
    await waitForMetrics(gw);
  });
  after(async () => {
    await gw.close();
    await backend.close();
  });

  test('CONNECT gets a §5 404, not a closed connection', async () => {
    const e = assertSpecError(await raw(gw.apiPort, 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'), 404);
    assert.match(e.message, /no route for CONNECT example\.com:443/);
  });

  test('an HTTP/1.1 request without Host is served (routing never reads it), not refused with an empty 400', async () => {
    const r = await raw(gw.apiPort, post('/v1/chat/completions').replace('Host: x\r\n', ''));
    assert.match(r, /^HTTP\/1\.1 200 /, JSON.stringify(r.slice(0, 200)));
  });

  test('an absolute-form request target is routed and forwarded as its path', async () => {
    const before = backend.received.length;
    const r = await raw(gw.apiPort, post('http://gateway.example/v1/chat/completions?x=1'));
    assert.match(r, /^HTTP\/1\.1 200 /, JSON.stringify(r.slice(0, 200)));
    assert.equal(backend.received.length, before + 1);
    assert.equal(backend.received.at(-1)!.url, '/v1/chat/completions?x=1');
    assertSpecError(await raw(gw.apiPort, post('http://gateway.example/v2/nothing')), 404);
  });

  test('an Expect other than 100-continue gets a §5 417, not an empty one', async () => {
    const e = assertSpecError(await raw(gw.apiPort, post('/v1/chat/completions', 'expect: 200-ok\r\n')), 417);
    assert.match(e.message, /unsupported expectation: 200-ok/);
  });

  test('metrics port: a client mistake is a §5 4xx, not 500; a bad URL and malformed HTTP are §5-shaped', async () => {
    const bad = await raw(gw.metricsPort, 'POST /metrics HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 3\r\nconnection: close\r\n\r\n{x}');
    assert.match(bad, /^HTTP\/1\.1 4\d\d /, JSON.stringify(bad.slice(0, 200)));
    assertSpecError(await raw(gw.metricsPort, 'GET /debug/%zz HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n'), 400);
    assertSpecError(await raw(gw.metricsPort, 'GARBAGE /\x00 HTTP/9\r\n\r\n'), 400);
    // The API port's answers to Node's client errors, so oversized headers are a 431 here too.
    assertSpecError(await raw(gw.metricsPort, `GET /metrics HTTP/1.1\r\nHost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`), 431);
  });

  test('a client that leaves mid-body is counted in sluice_request_body_incomplete_total; while it sends, the receiving gauges show it', async () => {
    const s = net.connect(gw.apiPort, '127.0.0.1');
    await new Promise((r) => s.once('connect', r));
    const whole = post('/v1/chat/completions');
    s.write(whole.slice(0, -10));
    await until(async () => (await debugRequests(gw)).receivingBodies === 1, 3000, 'the body is arriving');
    const sentBytes = Buffer.byteLength(whole.slice(whole.indexOf('\r\n\r\n') + 4)) - 10;
    const gauges = async () => {
      const text = await metricsText(gw);
      return [/^sluice_request_bodies_receiving (\d+)$/m.exec(text)?.[1], /^sluice_request_body_bytes_receiving (\d+)$/m.exec(text)?.[1]];
    };
    await until(async () => (await gauges())[1] === String(sentBytes), 3000, `bytes received: ${sentBytes}`);
    assert.deepEqual(await gauges(), ['1', String(sentBytes)]);
    s.destroy();
    await until(async () => /sluice_request_body_incomplete_total 1\b/.test(await metricsText(gw)), 3000, 'counted');
    assert.deepEqual(await gauges(), ['0', '0']);
    // A client that leaves is no malformed request: nobody got a 400.
    assert.match(await metricsText(gw), /^sluice_request_rejected_total\{reason="malformed_http",code="400"\} 0$/m);
  });
});

test("the gateway's own refusals before a request counts (no model known yet) are in sluice_request_rejected_total, by reason and status", async () => {
  const backend = await startFakeBackend();
  const debug = captureLogger('debug');
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], '', '\n  bodyLimit: 4Ki\n  requestHeadersTimeout: 200ms\n  requestTimeout: 400ms'), async (gw) => {
    const rejected = async () =>
      Object.fromEntries(
        (await metricsText(gw))
          .split('\n')
          .filter((l) => l.startsWith('sluice_request_rejected_total{'))
          .map((l) => [/reason="(\w+)",code="(\d+)"/.exec(l)!.slice(1).join(' '), Number(l.slice(l.lastIndexOf(' ') + 1))]),
      );
    const zero = {
      'invalid_request 400': 0,
      'malformed_http 400': 0,
      'unknown_route 404': 0,
      'request_timeout 408': 0,
      'body_too_large 413': 0,
      'compressed_body 415': 0,
      'expectation_failed 417': 0,
      'headers_too_large 431': 0,
      'too_many_pipelined 429': 0,
      'shutting_down 503': 0,
    };
    assert.deepEqual(await rejected(), zero, 'every series from the start');
    const send = (body: string, headers = '', path = '/v1/chat/completions') =>
      raw(gw.apiPort, `POST ${path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n${headers}\r\n${body}`);
    assertSpecError(await send('{"model": oops}'), 400);
    assertSpecError(await send('{"messages":[{"role":"user","content":"h"}]}'), 400);
    assert.match(assertSpecError(await send(''), 400).message, /^request body is empty/);
    assertSpecError(await send(CHAT, '', '/v1/nothing'), 404);
    assertSpecError(await send(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(5000) }] })), 413);
    assertSpecError(await send(CHAT, 'content-encoding: gzip\r\n'), 415);
    assertSpecError(await send(CHAT, 'expect: 200-ok\r\n'), 417);
    // Refusals Node reports at the HTTP level: malformed, headers too large, headers too slow; and
    // CONNECT. Each with an x-request-id, as every answer of the API port.
    const withId = (response: string, status: number, id = /^x-request-id: [0-9a-f-]{36}\r$/m): void => {
      assertSpecError(response, status);
      assert.match(response.slice(0, response.indexOf('\r\n\r\n') + 2), id);
    };
    withId(await raw(gw.apiPort, 'GARBAGE /\x00 HTTP/9\r\n\r\n'), 400);
    withId(await raw(gw.apiPort, `GET /health HTTP/1.1\r\nHost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`), 431);
    withId(await raw(gw.apiPort, 'GET /health HTTP/1.1\r\nHost: x\r\n'), 408);
    withId(await raw(gw.apiPort, 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'), 404);
    // A request whose body never comes: its 408 carries the request's own id.
    withId(await raw(gw.apiPort, post('/v1/chat/completions', 'x-request-id: mine-408\r\n').slice(0, -5)), 408, /^x-request-id: mine-408\r$/m);
    // ... and its log line says so (not "the client went away", status 0).
    const done = () => debug.lines().find((l) => l.msg === 'request done' && l.requestId === 'mine-408');
    await until(() => done() !== undefined, 2000, 'the line of the request that got 408');
    assert.deepEqual([done()!.status, done()!.error], [408, 'request not received in time']);
    assert.deepEqual(await rejected(), {
      ...zero,
      'invalid_request 400': 3,
      'malformed_http 400': 1,
      'unknown_route 404': 2,
      'request_timeout 408': 2,
      'body_too_large 413': 1,
      'compressed_body 415': 1,
      'expectation_failed 417': 1,
      'headers_too_large 431': 1,
    });
    assert.doesNotMatch(await metricsText(gw), /^llm_d_epp_request_(total|error_total)\{/m, 'not inference requests');
  }, { logger: debug.logger });
});

/** A `stream: true` chat request through the gateway (`extra` merged into the body). */
const streamChat = (gw: Gateway, extra: Record<string, unknown> = {}) =>
  request(`${gw.apiUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'h' }], ...extra }),
  });

test('TTFT is labelled by what the answer is: a JSON error to a stream request counts as streaming="false"', async () => {
  const backend = await startFakeBackend((r, res) => {
    if (JSON.parse(r.body).max_tokens === 1) {
      res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}');
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' }).end('data: {"choices":[]}\n\ndata: [DONE]\n\n');
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const stream = (maxTokens: number) => streamChat(gw, { max_tokens: maxTokens }).then(async (r) => [r.statusCode, await r.body.text()] as const);
    assert.equal((await stream(1))[0], 500);
    assert.equal((await stream(5))[0], 200);
    const counts = (await metricsText(gw)).split('\n').filter((l) => l.startsWith('llm_d_epp_request_ttft_seconds_count{'));
    assert.deepEqual(counts.map((l) => [/streaming="(\w+)"/.exec(l)![1], l.slice(l.lastIndexOf(' ') + 1)]).sort(), [['false', '1'], ['true', '1']], counts.join('\n'));
  });
});

test("TTFT of a stream is its first event, not a keep-alive comment before it; the endpoint's first byte is the comment", async () => {
  const backend = await startFakeBackend((_r, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(': ping\n\n');
    setTimeout(() => res.end('data: {"choices":[]}\n\ndata: [DONE]\n\n'), 300);
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const r = await streamChat(gw);
    assert.equal(await r.body.text(), ': ping\n\ndata: {"choices":[]}\n\ndata: [DONE]\n\n');
    const m = await metricsText(gw);
    // Bounds, not timings: the event cannot come before the server's 300 ms pause, the comment came well before it.
    const sum = (name: string) => Number(new RegExp(`^${name}_sum\\{[^}]*\\} (\\S+)$`, 'm').exec(m)![1]);
    assert.ok(sum('llm_d_epp_request_ttft_seconds') >= 0.29, m);
    assert.ok(sum('sluice_endpoint_first_byte_seconds') < sum('llm_d_epp_request_ttft_seconds'), m);
  });
});

/** A Responses API stream event as vLLM writes it (`event:` and `data:` lines), or its `data:` line alone. */
const responsesEvent = (type: string, sequence: number, dataOnly: boolean, fields: Record<string, unknown> = {}) =>
  `${dataOnly ? '' : `event: ${type}\n`}data: ${JSON.stringify({ type, sequence_number: sequence, ...fields })}\n\n`;
/** How long the model server below holds a Responses API stream's first output after its opening events. */
const OUTPUT_DELAY_MS = 300;

/**
 * A model server that opens each Responses API stream as vLLM does once it accepts the request —
 * response.created and response.in_progress at once, before its queue wait and prefill — and holds
 * the rest until the test calls `output` (not before OUTPUT_DELAY_MS after the request arrived).
 */
async function heldResponsesBackend(dataOnly: boolean) {
  const held: { res: ServerResponse; at: number }[] = [];
  const backend = await startFakeBackend((_r, res) => {
    const at = performance.now();
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const initial = { response: { id: 'resp_1', object: 'response', status: 'in_progress', output: [] } };
    res.write(responsesEvent('response.created', 0, dataOnly, initial) + responsesEvent('response.in_progress', 1, dataOnly, initial));
    held.push({ res, at });
  });
  const output = async (): Promise<void> => {
    const { res, at } = held.shift()!;
    await new Promise((resolve) => setTimeout(resolve, at + OUTPUT_DELAY_MS + 1 - performance.now()));
    res.end(
      responsesEvent('response.output_item.added', 2, dataOnly, { output_index: 0 }) +
        responsesEvent('response.output_text.delta', 3, dataOnly, { output_index: 0, delta: 'hi' }) +
        responsesEvent('response.completed', 4, dataOnly, { response: { id: 'resp_1', status: 'completed', usage: { input_tokens: 3, output_tokens: 1 } } }),
    );
  };
  return { backend, held, output };
}

/** Sends a streamed Responses API request; `text()` is what has arrived of the answer so far. */
async function streamResponses(gw: Gateway, requestId: string) {
  const r = await request(`${gw.apiUrl}/v1/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify({ model: 'm', input: 'a prompt of some tokens to compute', stream: true }),
  });
  let text = '';
  r.body.setEncoding('utf8');
  r.body.on('data', (c: string) => (text += c));
  const ended = new Promise((resolve) => r.body.once('end', resolve).once('error', resolve));
  return { r, text: () => text, ended };
}

for (const dataOnly of [false, true]) {
  test(`TTFT of a Responses API stream is its first event past response.created and response.in_progress, which vLLM sends before its queue wait and prefill (${dataOnly ? 'data: lines only, typed by their JSON' : 'event: lines, as vLLM'}); until then the request waits for its first byte and its prompt is counted on the endpoint`, async () => {
    const { backend, held, output } = await heldResponsesBackend(dataOnly);
    const debug = captureLogger('debug');
    await withGateway(
      backend,
      fleetConfig([{ name: 'b', port: backend.port }]),
      async (gw) => {
        const answer = await streamResponses(gw, 'resp-ttft');
        assert.equal(answer.r.statusCode, 200);
        await until(() => answer.text().includes('response.in_progress'), 5000, 'the opening events relayed');
        assert.equal(held.length, 1);
        const { requests } = (await (await request(`${gw.metricsUrl}/debug/requests`)).body.json()) as { requests: Record<string, unknown>[] };
        assert.deepEqual(
          requests.map((r) => [r.requestId, r.state, r.ttftMs]),
          [['resp-ttft', 'waiting_first_byte', null]],
        );
        assert.ok(gw.pool.endpoints[0]!.inFlightTokens > 0, 'its prompt is still being computed');
        await output();
        await answer.ended;
        assert.match(answer.text(), /response\.output_text\.delta[^]*response\.completed/);
        await until(() => debug.lines().some((l) => l.msg === 'request done'), 3000, 'request done');
        const done = debug.lines().find((l) => l.msg === 'request done')!;
        assert.equal(done.requestId, 'resp-ttft');
        assert.ok(Number(done.ttftMs) >= OUTPUT_DELAY_MS && Number(done.durationMs) >= Number(done.ttftMs), JSON.stringify(done));
        const m = await metricsText(gw);
        const sum = (name: string) => Number(new RegExp(`^${name}_sum\\{[^}]*\\} (\\S+)$`, 'm').exec(m)![1]);
        assert.match(m, /^llm_d_epp_request_ttft_seconds_count\{model_name="m",target_model_name="m",streaming="true"\} 1$/m);
        assert.ok(sum('llm_d_epp_request_ttft_seconds') >= OUTPUT_DELAY_MS / 1000, m);
        // The endpoint's first byte is its response.created, as before.
        assert.ok(sum('sluice_endpoint_first_byte_seconds') < OUTPUT_DELAY_MS / 1000, m);
        await nothingInFlight(gw);
      },
      { logger: debug.logger },
    );
  });
}

test('a client that leaves a Responses API stream after response.created and response.in_progress is counted cancelled waiting for its first byte; one that leaves after its first output, streaming', async () => {
  const { backend, held } = await heldResponsesBackend(false);
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const cancelled = async () => {
      const re = /^sluice_request_cancelled_total\{model_name="m",target_model_name="m",stage="(\w+)"\} (\d+)$/gm;
      return Object.fromEntries([...(await metricsText(gw)).matchAll(re)].map((m) => [m[1], Number(m[2])]));
    };
    const opened = await streamResponses(gw, 'resp-left-early');
    await until(() => opened.text().includes('response.in_progress'), 5000, 'the opening events relayed');
    opened.r.body.destroy();
    await until(async () => (await cancelled()).waiting_first_byte === 1, 3000, 'counted waiting_first_byte');
    const begun = await streamResponses(gw, 'resp-left-later');
    await until(() => held.length === 2 && begun.text().includes('response.in_progress'), 5000, 'the second stream opened');
    held[1]!.res.write(responsesEvent('response.output_item.added', 2, false, { output_index: 0 }));
    await until(() => begun.text().includes('response.output_item.added'), 5000, 'its first output relayed');
    begun.r.body.destroy();
    await until(async () => (await cancelled()).streaming === 1, 3000, 'counted streaming');
    assert.deepEqual(await cancelled(), { queued: 0, waiting_first_byte: 1, streaming: 1 });
    await nothingInFlight(gw);
  });
});

test("TTFT of a Responses API stream from the simulator (vLLM's events, opened once accepted) is its first output, after the simulated time to first token", async () => {
  const debug = captureLogger('debug');
  const sim = await startSimulator({ name: 'sim-0', model: 'm', ttftOverheadMs: OUTPUT_DELAY_MS, prefillMsPerToken: 0, itlMs: 1 });
  await withGateway(
    sim,
    fleetConfig([{ name: 'sim-0', port: sim.port }]),
    async (gw) => {
      const answer = await streamResponses(gw, 'resp-sim');
      await answer.ended;
      assert.match(answer.text(), /^event: response\.created\n[^]*event: response\.completed\n/);
      await until(() => debug.lines().some((l) => l.msg === 'request done'), 3000, 'request done');
      const done = debug.lines().find((l) => l.msg === 'request done')!;
      // The simulator's timer, not the gateway's clock: a millisecond of leeway.
      assert.ok(Number(done.ttftMs) >= OUTPUT_DELAY_MS - 1, JSON.stringify(done));
    },
    { logger: debug.logger },
  );
});

for (const code of [500, 400]) {
  test(`a 200 stream the model server ends with an error event of code ${code} (vLLM's mid-generation failure) is relayed as is and counted as an error; ${code >= 500 ? "a failure of that endpoint, logged" : "the request's, not the endpoint's"}`, async () => {
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: {"error":{"message":"KV load failed","type":"InternalServerError","param":null,"code":${code}}}\n\ndata: [DONE]\n\n`);
    });
    const { logger, lines } = captureLogger();
    await withGateway(
      backend,
      fleetConfig([{ name: 'b', port: backend.port }]),
      async (gw) => {
        const r = await streamChat(gw);
        assert.equal(r.statusCode, 200);
        assert.match(await r.body.text(), /KV load failed/);
        const m = await metricsText(gw);
        assert.match(m, new RegExp(`^llm_d_epp_request_error_total\\{model_name="m",target_model_name="m",error_code="${code}"\\} 1$`, 'm'));
        assert.match(m, /^llm_d_epp_request_total\{model_name="m",target_model_name="m"\} 1$/m);
        const failed = code >= 500 ? 1 : 0;
        assert.match(m, new RegExp(`^sluice_endpoint_upstream_errors_total\\{endpoint_name="b",error="stream_error"\\} ${failed}$`, 'm'));
        assert.equal(gw.pool.endpoints[0]!.failureStreak, failed, 'one more in its run of failures (outlier detection)');
        const warned = lines().filter((l) => l.msg === 'model server ended a stream with an error event');
        assert.deepEqual(
          warned.map((l) => [l.endpoint, l.code]),
          failed ? [['b', code]] : [],
        );
      },
      { logger },
    );
  });
}

test('a 5xx a model server answers is relayed, counted at its endpoint and logged at warn: the first of each status in a spell in full, with its request id', async () => {
  let n = 0;
  const backend = await startFakeBackend((_r, res) => {
    const status = ++n <= 3 ? 500 : 503;
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(`{"error":{"message":"engine trouble","type":"InternalServerError","param":null,"code":${status}}}`);
  });
  const { logger, lines } = captureLogger();
  await withGateway(
    backend,
    fleetConfig([{ name: 'b', port: backend.port }]),
    async (gw) => {
      const ids: string[] = [];
      for (let i = 0; i < 4; i++) {
        const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"m","messages":[{"role":"user","content":"x"}]}' });
        assert.match(await r.body.text(), /engine trouble/);
        ids.push(String(r.headers['x-request-id']));
      }
      assert.match(await metricsText(gw), /^sluice_endpoint_upstream_errors_total\{endpoint_name="b",error="http_5xx"\} 4$/m);
      const warned = lines().filter((l) => l.msg === 'model server answered 5xx (relayed)');
      assert.deepEqual(
        warned.map((l) => [l.endpoint, l.status, l.requestId]),
        [
          ['b', 500, ids[0]],
          ['b', 503, ids[3]],
        ],
      );
    },
    { logger },
  );
});

for (const sentAt of ['during the stream', 'the moment the stream ends'] as const) {
  test(`a request sent on a connection a stream begun before the drain kept alive (${sentAt}) gets 503 rejected-shutting-down, not a reset, counted as rejected shutting_down`, async () => {
    // A stream whose headers left before the drain keeps its connection alive: the client may send its
    // next request on it, behind the stream or as soon as it ends (a pooled client with work waiting).
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[]}\n\n');
      setTimeout(() => res.end('data: [DONE]\n\n'), 300);
    });
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      const s = net.connect(gw.apiPort, '127.0.0.1');
      let out = '';
      const keepAlive = keepAlivePost();
      let sentNext = false;
      const sendNext = (): void => {
        sentNext = true;
        s.write(keepAlive);
      };
      s.on('data', (c) => {
        out += c;
        if (!sentNext && sentAt === 'the moment the stream ends' && out.endsWith('\r\n0\r\n\r\n')) sendNext();
      });
      s.on('error', () => undefined);
      s.write(keepAlive);
      await until(() => out.includes('data: {"choices":[]}'), 3000, 'the stream has begun');
      const { stopped } = await startDraining(gw);
      if (sentAt === 'during the stream') sendNext();
      await stopped;
      assert.ok(sentNext, 'the next request was sent');
      assert.match(out, /^HTTP\/1\.1 200 [\s\S]*data: \[DONE\][\s\S]*HTTP\/1\.1 503 [\s\S]*x-llm-d-request-dropped-reason: rejected-shutting-down/i);
      assert.match(out.slice(out.lastIndexOf('HTTP/1.1 503')), /connection: close/i);
      const counted = (await gw.metrics.requestRejectedTotal.get()).values.filter((v) => v.value > 0).map((v) => [v.labels.reason, v.labels.code, v.value]);
      assert.deepEqual(counted, [['shutting_down', '503', 1]]);
    });
  });
}

test('a request arriving during the drain on an idle keep-alive connection gets 503 rejected-shutting-down, not a cut connection', async () => {
  // The backend holds one request (so the drain lasts) and answers the others at once.
  let releaseHeld: (() => void) | undefined;
  const backend = await startFakeBackend((req, res) => {
    const answer = () => okJson(req, res);
    if (releaseHeld === undefined && req.body.includes('held')) releaseHeld = answer;
    else answer();
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const s = net.connect(gw.apiPort, '127.0.0.1');
    let out = '';
    let closedAt = -1;
    s.on('data', (c) => (out += c));
    s.on('close', () => (closedAt = out.length));
    s.on('error', () => undefined);
    const keepAlive = keepAlivePost();
    s.write(keepAlive);
    await until(() => out.startsWith('HTTP/1.1 200 ') && out.endsWith('\r\n0\r\n\r\n'), 3000, 'the first answer arrived: the connection is idle');
    const held = request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'sim-model', messages: [{ role: 'user', content: 'held' }] }) });
    await until(() => releaseHeld !== undefined, 3000, 'a request in flight holds the drain open');
    const { stopped: closing } = await startDraining(gw);
    assert.equal(closedAt, -1, 'the idle connection is still open');
    s.write(keepAlive);
    await until(() => /HTTP\/1\.1 503 /.test(out), 3000, 'the second request is answered');
    releaseHeld!();
    assert.equal((await held).statusCode, 200);
    await closing;
    assert.match(out, /HTTP\/1\.1 503 [\s\S]*x-llm-d-request-dropped-reason: rejected-shutting-down/i);
    assert.match(out.slice(out.lastIndexOf('HTTP/1.1 503')), /connection: close/i);
  });
});

/**
 * Sends `requests` pipelined on one connection to a gateway (config `extra`) whose model server holds
 * every request, waits until `ready`, starts the drain, lets the model server answer: the answers the
 * client got, in order.
 */
async function pipelinedThroughDrain(extra: string, requests: string, ready: (gw: Gateway, held: number) => Promise<boolean>): Promise<string[]> {
  const held: (() => void)[] = [];
  const backend = await startFakeBackend((r, res) => held.push(() => okJson(r, res)));
  let answers: string[] = [];
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], extra), async (gw) => {
    const { socket: s, received, closed } = await connectRaw(gw.apiPort);
    s.write(requests);
    await until(() => ready(gw, held.length), 3000, 'the requests taken');
    const { stopped: closing } = await startDraining(gw);
    for (const answer of held) answer();
    await closing;
    await closed;
    answers = received().split(/(?=HTTP\/1\.1 )/);
  });
  return answers;
}

for (const [what, extra, statuses] of [
  ['all three at the model server', '', ['200', '200', '200']],
  [
    'the two behind it queued (concurrency 1)',
    'plugins:\n- type: concurrency-detector\n  parameters: { maxConcurrency: 1 }\nflowControl:\n  saturationDetector: { pluginRef: concurrency-detector }\n',
    ['200', '503', '503'],
  ],
] as const) {
  test(`three requests pipelined, then the drain (${what}): every answer reaches the client, only the last closes the connection`, async () => {
    // Node drops the answers queued behind one that closes its connection: only the last may say so.
    const atServer = statuses.filter((st) => st === '200').length;
    const ready = async (gw: Gateway, held: number) => held === atServer && (await debugRequests(gw)).total === 3;
    const answers = await pipelinedThroughDrain(extra, keepAlivePost().repeat(3), ready);
    assert.deepEqual(answers.map((a) => a.slice(9, 12)), statuses, answers.join(''));
    assert.deepEqual(answers.map((a) => /\r\nconnection: close\r\n/i.test(a)), [false, false, true]);
    for (const a of answers.slice(1)) if (a.startsWith('HTTP/1.1 503')) assert.match(a, /x-llm-d-request-dropped-reason: rejected-shutting-down/i);
  });
}

for (const [what, second, status] of [
  ['GET /health', 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n', '200'],
  ['invalid JSON', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 3\r\n\r\n{x}', '400'],
] as const) {
  test(`a request in flight, then ${what} pipelined behind it (answered at once, waiting its turn), then the drain: both answers reach the client`, async () => {
    // The second is answered as it is parsed, with the first: both are taken once the first is at the model server.
    const answers = await pipelinedThroughDrain('', keepAlivePost() + second, async (_gw, held) => held === 1);
    assert.deepEqual(answers.map((a) => a.slice(9, 12)), ['200', status], answers.join(''));
  });
}

for (const leaves of [true, false]) {
  test(`requests pipelined behind one still waiting: their answers, complete at the gateway, count as answered only once written (${leaves ? 'the client leaves first: cancelled' : 'written: answered'}); ten of them on one connection, no listener-leak warning`, async () => {
    let answerFirst: (() => void) | undefined;
    const backend = await startFakeBackend((r, res) => (JSON.parse(r.body).messages[0].content === 'first' ? (answerFirst = () => okJson(r, res)) : okJson(r, res)));
    const debug = captureLogger('debug');
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on('warning', onWarning);
    const later = Array.from({ length: 10 }, (_, i) => `p${i + 2}`);
    try {
      await withGateway(
        backend,
        fleetConfig([{ name: 'b', port: backend.port }]),
        async (gw) => {
          const ask = (content: string, id: string) => {
            const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] });
            return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nx-request-id: ${id}\r\n\r\n${body}`;
          };
          const client = await connectRaw(gw.apiPort);
          client.socket.write(ask('first', 'p1') + later.map((id) => ask('later', id)).join(''));
          // The later ones are answered by the model server while the first still waits for its own.
          await until(async () => backend.received.length === 11 && (await debugRequests(gw)).total === 1, 3000, 'the later ones answered at the gateway');
          const done = (id: string) => debug.lines().find((l) => l.msg === 'request done' && l.requestId === id);
          assert.deepEqual(later.filter((id) => done(id) !== undefined), [], 'not done while their answers wait behind the first');
          if (leaves) client.socket.destroy();
          else answerFirst!();
          await until(() => ['p1', ...later].every((id) => done(id) !== undefined), 3000, 'every request done');
          const cancelled = /^sluice_request_cancelled_total\{model_name="m",target_model_name="m",stage="(\w+)"\} (\d+)$/gm;
          const counts = Object.fromEntries([...(await metricsText(gw)).matchAll(cancelled)].map((m) => [m[1], Number(m[2])]));
          const statuses = ['p1', ...later].map((id) => done(id)!.status);
          if (leaves) {
            assert.deepEqual(statuses, Array(11).fill(0));
            assert.deepEqual(counts, { queued: 0, waiting_first_byte: 1, streaming: 10 });
          } else {
            assert.deepEqual(statuses, Array(11).fill(200));
            assert.deepEqual(counts, { queued: 0, waiting_first_byte: 0, streaming: 0 });
            await until(() => client.received().split('HTTP/1.1 200 ').length === 12, 3000, 'every answer');
          }
          await nothingInFlight(gw);
        },
        { logger: debug.logger },
      );
    } finally {
      process.off('warning', onWarning);
    }
    assert.deepEqual(warnings, []);
  });
}

test('a connection with more than 16 requests pipelined behind an unanswered one: the rest refused 429 in order, counted, and the connection stays usable', async () => {
  let answerFirst: (() => void) | undefined;
  const backend = await startFakeBackend((r, res) => (JSON.parse(r.body).messages[0].content === 'first' ? (answerFirst = () => okJson(r, res)) : okJson(r, res)));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const ask = (content: string) => {
      const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] });
      return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
    };
    const client = await connectRaw(gw.apiPort);
    client.socket.write(ask('first') + ask('later').repeat(20));
    const answers = (): string[] => client.received().split(/(?=HTTP\/1\.1 )/).filter((a) => a !== '');
    // 16 wait behind the first at the model server; the four after them never reach it.
    await until(() => backend.received.length === 17, 3000, 'the first and 16 behind it at the model server');
    await until(async () => /sluice_request_rejected_total\{reason="too_many_pipelined",code="429"\} 4$/m.test(await metricsText(gw)), 3000, 'four refused');
    assert.equal(backend.received.length, 17);
    assert.deepEqual(answers(), [], 'nothing goes out before the first answer');
    answerFirst!();
    await until(() => answers().length === 21, 3000, 'every answer');
    assert.deepEqual(answers().map((a) => a.slice(9, 12)), [...Array(17).fill('200'), ...Array(4).fill('429')]);
    const refused = answers()[20]!;
    assert.match(refused, /more than server.maxPipelinedRequests \(16\) requests pipelined on one connection/);
    assert.doesNotMatch(refused, /connection: close/i);
    client.socket.write(ask('again'));
    await until(() => answers().length === 22, 3000, 'the next request on the connection');
    assert.equal(answers()[21]!.slice(9, 12), '200');
    client.socket.destroy();
    await nothingInFlight(gw);
  });
});

test('a stream paused by its slow client, then a request pipelined behind it whose answer begins: the paused stream resumes when the client reads (no hang), and no model server is charged a failure', async () => {
  // The first answer outgrows the client's socket while it reads nothing; the second request arrives
  // then (Node stops reading the connection), and its answer's headers come at once. Flushing them
  // makes Node emit 'drain' on the first answer from inside the second's upstream callback: resumed
  // there, undici threw, the second answer failed ("cut", charged to its server) and the first stayed
  // paused for good, beyond any time-out.
  const EVENT = `data: {"choices":[{"delta":{"content":"${'x'.repeat(4000)}"}}]}\n\n`;
  const EVENTS = 2000; // 8 MB: far more than loopback socket buffers hold
  const backend = await startFakeBackend((r, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (JSON.parse(r.body).messages[0].content === 'second') return res.end('data: {"choices":[]}\n\ndata: [DONE]\n\n');
    let i = 0;
    const more = (): void => {
      while (i < EVENTS) {
        i++;
        if (!res.write(EVENT)) return void res.once('drain', more);
      }
      res.end('data: [DONE]\n\n');
    };
    more();
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const ask = (content: string) => {
      const body = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content }] });
      return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
    };
    const socket = net.connect(gw.apiPort, '127.0.0.1');
    socket.on('error', () => undefined);
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.pause(); // reads nothing yet
    socket.write(ask('first'));
    // The first answer is under way and held up by the client.
    await until(() => gw.pool.endpoints[0]!.inFlight === 1 && backend.received.length === 1, 3000, 'the first answer under way');
    await new Promise((r) => setTimeout(r, 300));
    socket.write(ask('second'));
    await until(() => backend.received.length === 2, 3000, 'the second request at the model server');
    await new Promise((r) => setTimeout(r, 200));
    let text = '';
    socket.setEncoding('latin1');
    socket.on('data', (c: string) => (text += c));
    socket.resume();
    await until(() => (text.match(/data: \[DONE\]/g) ?? []).length === 2, 20_000, 'both answers whole');
    assert.equal((text.match(/data: \{"choices":\[\{"delta"/g) ?? []).length, EVENTS);
    assert.doesNotMatch(text, /"error"/);
    socket.destroy();
    await nothingInFlight(gw);
    assert.doesNotMatch(await metricsText(gw), /^sluice_endpoint_upstream_errors_total\{[^}]*\} [1-9]/m);
  });
});

test('a body pipelined behind an answer still going out, never finished: cut at server.requestTimeout (Node times only the current request), and the log says why', async () => {
  let answerFirst: (() => void) | undefined;
  const backend = await startFakeBackend((r, res) => (answerFirst = () => okJson(r, res)));
  const debug = captureLogger('debug');
  await withGateway(
    backend,
    fleetConfig([{ name: 'b', port: backend.port }], '', '\n  requestHeadersTimeout: 200ms\n  requestTimeout: 400ms'),
    async (gw) => {
      const client = await connectRaw(gw.apiPort);
      const partial = post('/v1/chat/completions', 'x-request-id: slow-2\r\n').replace('connection: close\r\n', '').slice(0, -20);
      client.socket.write(keepAlivePost().replace('\r\n\r\n', '\r\nx-request-id: first-1\r\n\r\n') + partial);
      await until(() => backend.received.length === 1, 3000, 'the first at the model server');
      await until(async () => (await debugRequests(gw)).receivingBodies === 1, 3000, 'the second receiving its body');
      await until(() => client.socket.destroyed, 3000, 'the connection cut (no 408 can be written before the first answer)');
      const done = () => debug.lines().find((l) => l.msg === 'request done' && l.requestId === 'slow-2');
      await until(() => done() !== undefined, 3000, 'its line');
      assert.equal(done()!.status, 0);
      assert.match(String(done()!.error), /^request body not received within server\.requestTimeout/);
      assert.equal((await debugRequests(gw)).receivingBodies, 0);
      answerFirst?.();
      await nothingInFlight(gw);
    },
    { logger: debug.logger },
  );
});

test('a malformed request pipelined behind a streaming answer: the whole stream first, then the 400, then the connection closes', async () => {
  const fleet = await startFleet(1, { itlMs: 50, ttftOverheadMs: 1 });
  try {
    const body = JSON.stringify({ model: 'sim-model', stream: true, max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
    const out = await new Promise<string>((resolve) => {
      const s = net.connect(fleet.gw.apiPort, '127.0.0.1', () => {
        s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
      });
      let o = '';
      let sent = false;
      s.on('data', (c) => {
        o += c;
        // Garbage once the stream has begun (its first event is out).
        if (!sent && o.includes('data: ')) {
          sent = true;
          s.write('GARBAGE /\x00 HTTP/9\r\n\r\n');
        }
      });
      s.on('error', () => undefined);
      s.on('close', () => resolve(o));
      setTimeout(() => s.destroy(), 3000);
    });
    assert.match(out, /^HTTP\/1\.1 200 /);
    const answers = out.split(/(?=HTTP\/1\.1 )/);
    assert.equal(answers.length, 2, out);
    assert.match(answers[0]!, /data: \[DONE\]/, 'the stream went out whole');
    assert.match(answers[1]!, /^HTTP\/1\.1 400 [\s\S]*malformed HTTP request/);
  } finally {
    await fleet.close();
  }
});

test('a malformed request pipelined behind a request still waiting for its answer: that answer first, then the 400', async () => {
  let answer: (() => void) | undefined;
  const backend = await startFakeBackend((r, res) => (answer = () => okJson(r, res)));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const { socket: s, received, closed } = await connectRaw(gw.apiPort);
    s.write(keepAlivePost());
    await until(() => answer !== undefined, 3000, 'the request at the model server');
    s.write('GARBAGE /\x00 HTTP/9\r\n\r\n');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(received(), '', 'nothing before the first answer');
    answer!();
    await closed;
    const answers = received().split(/(?=HTTP\/1\.1 )/);
    assert.deepEqual(answers.map((a) => a.slice(0, 12)), ['HTTP/1.1 200', 'HTTP/1.1 400']);
    await nothingInFlight(gw);
  });
});

test('two requests pipelined, then malformed bytes: both answers, in order, then the 400', async () => {
  const backend = await startFakeBackend(slowJson(50));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const { socket: s, received, closed } = await connectRaw(gw.apiPort);
    const keepAlive = keepAlivePost();
    s.write(keepAlive + keepAlive + 'GARBAGE /\x00 HTTP/9\r\n\r\n');
    await closed;
    const answers = received().split(/(?=HTTP\/1\.1 )/);
    assert.deepEqual(answers.map((a) => a.slice(0, 12)), ['HTTP/1.1 200', 'HTTP/1.1 200', 'HTTP/1.1 400'], received());
    assert.equal(backend.received.length, 2);
    await nothingInFlight(gw);
  });
});

test('bytes after a request that says Connection: close are ignored: that request is answered, then the connection closes', async () => {
  const backend = await startFakeBackend(slowJson(20));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    for (const [first, after] of [
      [post('/v1/chat/completions'), post('/v1/chat/completions')],
      [post('/v1/chat/completions').replace('HTTP/1.1', 'HTTP/1.0').replace('connection: close\r\n', ''), 'GARBAGE /\x00 HTTP/9\r\n\r\n'],
      [keepAlivePost() + post('/v1/chat/completions'), post('/v1/chat/completions')],
    ] as const) {
      const { socket: s, received, closed } = await connectRaw(gw.apiPort);
      s.write(first + after);
      await closed;
      const out = received();
      const statuses = out.split(/(?=HTTP\/1\.[01] )/).map((a) => a.slice(9, 12));
      assert.ok(statuses.length >= 1 && statuses.every((st) => st === '200'), `${JSON.stringify(first.slice(0, 40))}: ${out}`);
      assert.equal(statuses.length, first.split('POST ').length - 1, out);
    }
    await nothingInFlight(gw);
  });
});

describe('a model server that stalls its answer past upstream.bodyTimeout: 504 (SPEC §2)', () => {
  const config = (port: number) => fleetConfig([{ name: 'b', port }]).replace('retries: 2 }', 'retries: 2, bodyTimeout: 300ms }');

  test('a JSON answer not yet relayed: a §5 504', async () => {
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"id":"x",');
    });
    await withGateway(backend, config(backend.port), async (gw) => {
      const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: CHAT });
      const e = ((await r.body.json()) as { error: { type: string; message: string } }).error;
      assert.equal(r.statusCode, 504);
      assert.equal(e.type, 'GatewayTimeoutError');
      assert.match(e.message, /upstream b stopped answering for longer than upstream\.bodyTimeout \(300 ms\)/);
      assert.match(await metricsText(gw), /sluice_endpoint_upstream_errors_total\{endpoint_name="b",error="body_timeout"\} 1/);
    });
  });

  test('a stream under way: a final error event with code 504', async () => {
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n');
    });
    await withGateway(backend, config(backend.port), async (gw) => {
      const body = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'h' }] });
      const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      assert.equal(r.statusCode, 200);
      const text = await r.body.text();
      assert.match(text, /"content":"a"/);
      // Then `[DONE]`, as vLLM ends a stream it failed (clients that read to it do not hang on a bare end).
      assert.match(text, /data: \{"error":\{[^}]*"type":"GatewayTimeoutError","param":null,"code":504\}\}\n\ndata: \[DONE\]\n\n$/);
    });
  });
});

test('/v1/models relays a model server refusal unchanged, its content type too', async () => {
  const backend = await startFakeBackend((_r, res) => {
    res.writeHead(401, { 'content-type': 'text/html' });
    res.end('<h1>401</h1>');
  });
  await withGateway(backend, fleetConfig([{ name: 'a', port: backend.port }]), async (gw) => {
    const r = await request(`${gw.apiUrl}/v1/models`);
    assert.equal(r.statusCode, 401);
    assert.equal(r.headers['content-type'], 'text/html');
    assert.equal(await r.body.text(), '<h1>401</h1>');
  }, { waitMetrics: false });
});

test('a request still uploading its body when the shutdown grace period ends gets 503 rejected-shutting-down', async () => {
  const backend = await startFakeBackend(slowJson(10));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]).replace('shutdownGracePeriod: 2s', 'shutdownGracePeriod: 300ms'), async (gw) => {
    const s = net.connect(gw.apiPort, '127.0.0.1');
    let out = '';
    s.on('data', (c) => (out += c));
    s.on('error', () => undefined);
    const closed = new Promise<void>((r) => s.on('close', () => r()));
    s.write(post('/v1/chat/completions').slice(0, -10));
    await until(async () => (await debugRequests(gw)).receivingBodies === 1, 3000, 'the body is arriving');
    await gw.close();
    await closed;
    assertSpecError(out, 503);
    assert.match(out, /x-llm-d-request-dropped-reason: rejected-shutting-down/i);
  });
});

for (const [what, body, status] of [
  ['a valid request', CHAT, 503],
  ['invalid JSON', '{"model": oops}', 400],
] as const) {
  test(`a keep-alive request whose body ends during the drain (${what}): ${status}, and the answer closes its connection`, async () => {
    const backend = await startFakeBackend(slowJson(10));
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      const s = net.connect(gw.apiPort, '127.0.0.1');
      let out = '';
      s.on('data', (c) => (out += c));
      s.on('error', () => undefined);
      const whole = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
      s.write(whole.slice(0, -5));
      await until(async () => (await debugRequests(gw)).receivingBodies === 1, 3000, 'the body is arriving');
      const closing = gw.close(); // the drain begins while the body arrives
      s.write(whole.slice(-5));
      await until(() => out.includes('"error"'), 3000, 'the answer');
      assertSpecError(out, status);
      // Else a client would send its next request on a connection the end of the drain cuts.
      assert.match(out, /\r\nconnection: close\r\n/i);
      await closing;
    });
  });
}

test('a client still sending its body through the end of the shutdown grace period reads its 503, not a reset', async () => {
  const backend = await startFakeBackend(slowJson(10));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]).replace('shutdownGracePeriod: 2s', 'shutdownGracePeriod: 300ms'), async (gw) => {
    const s = net.connect(gw.apiPort, '127.0.0.1');
    let out = '';
    let error: Error | undefined;
    s.on('data', (c) => (out += c));
    s.on('error', (err) => (error = err));
    const closed = new Promise<void>((r) => s.on('close', () => r()));
    // 30 × 20 KB, one every 20 ms: the upload goes on ~300 ms past the grace period, and like
    // undici's or fetch's, it is sent whole whatever comes back meanwhile.
    const head = '{"model":"m","messages":[';
    const chunks = 30;
    const chunk = ' '.repeat(20_000);
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${head.length + chunks * chunk.length}\r\n\r\n${head}`);
    let sent = 0;
    const sending = setInterval(() => {
      if (sent++ === chunks || s.destroyed) return void clearInterval(sending);
      s.write(chunk);
    }, 20);
    try {
      await until(async () => (await debugRequests(gw)).receivingBodies === 1, 3000, 'the body is arriving');
      await gw.close();
      await closed;
    } finally {
      clearInterval(sending);
    }
    assert.equal(error, undefined, `no reset: ${error?.message}`);
    assertSpecError(out, 503);
    assert.match(out, /x-llm-d-request-dropped-reason: rejected-shutting-down/i);
  });
});

describe('rules that hold, kept by a test', () => {
  test('/ready is 503 while the pool has endpoints but none with fresh metrics, 200 once one has', async () => {
    const backend = await startFakeBackend();
    backend.metrics = 500; // every scrape fails
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      await new Promise((r) => setTimeout(r, 200));
      assert.equal((await request(`${gw.apiUrl}/ready`)).statusCode, 503);
      assert.equal((await request(`${gw.metricsUrl}/ready`)).statusCode, 503);
      backend.metrics = vllmPage();
      await until(async () => (await request(`${gw.apiUrl}/ready`)).statusCode === 200, 3000, 'ready once fresh');
    }, { waitMetrics: false });
  });

  test('pool.metrics.maxBytes bounds the page read: a larger one is a failed scrape, with the reason in /debug/pool', async () => {
    const backend = await startFakeBackend();
    const text = fleetConfig([{ name: 'b', port: backend.port }]).replace('timeout: 500ms }', 'timeout: 500ms, maxBytes: 10 }');
    await withGateway(backend, text, async (gw) => {
      await until(() => gw.pool.endpoints[0]!.lastError !== undefined, 3000, 'a failed scrape');
      assert.match(gw.pool.endpoints[0]!.lastError!, /exceeds the 10-byte limit/);
      assert.equal(gw.pool.endpoints[0]!.metrics, undefined);
    }, { waitMetrics: false });
  });

  test('/ready stays 200 while a model server answers /metrics slower than the detector\'s staleness threshold (its own window, seconds)', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      backend.metricsDelayMs = 300; // the detector's threshold is 200 ms: stale for part of every scrape
      await until(() => gw.pool.endpoints[0]!.metricsAge(performance.timeOrigin + performance.now()) > 200, 3000, 'stale to the detector');
      for (let i = 0; i < 12; i++) {
        assert.equal((await request(`${gw.apiUrl}/ready`)).statusCode, 200, `probe ${i}`);
        await new Promise((r) => setTimeout(r, 40));
      }
    });
  });

  test('an unknown objective is priority 0 (not sheddable); the fairness-id alias and SLO headers are stripped', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], 'featureGates: ["flowControl=false"]\nobjectives:\n- { name: batch, priority: -1 }\n'), async (gw) => {
      backend.metrics = vllmPage(50);
      await until(() => gw.pool.endpoints[0]!.metrics?.waiting === 50);
      const send = async (h: Record<string, string>) => {
        const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...h }, body: CHAT });
        await r.body.text();
        return r.statusCode;
      };
      assert.equal(await send({ 'x-llm-d-inference-objective': 'batch' }), 429, 'a sheddable one is refused while saturated');
      const headers = { 'x-llm-d-inference-objective': 'no-such-objective', 'x-gateway-inference-fairness-id': 't', 'x-llm-d-slo-ttft-ms': '5', 'x-slo-ttft-ms': '5' };
      assert.equal(await send(headers), 200);
      const got = backend.received.at(-1)!.headers;
      for (const h of ['x-gateway-inference-fairness-id', 'x-llm-d-slo-ttft-ms', 'x-slo-ttft-ms']) assert.equal(got[h], undefined, h);
    });
  });

  test('/v1/responses without input: 400 naming the field', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      const r = await request(`${gw.apiUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"m"}' });
      assert.equal(r.statusCode, 400);
      assert.equal(((await r.body.json()) as { error: { param: string } }).error.param, 'input');
    }, { waitMetrics: false });
  });
});
