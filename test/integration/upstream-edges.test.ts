/**
 * Model servers that answer oddly or break off at awkward moments: the client still gets a reason it
 * can read (a §5 error, or an SSE error event that is an event of its own), no request runs on two
 * servers, and nothing is left counted in flight.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net, { type AddressInfo, type Socket } from 'node:net';
import zlib from 'node:zlib';
import OpenAI from 'openai';
import { request } from 'undici';
import type { Gateway } from '../../src/app.js';
import { alwaysDisaggProfiles, captureLogger, fleetConfig, gatewayFor, nothingInFlight, waitForMetrics, withGateway } from '../helpers/fleet.js';
import { okJson, startFakeBackend, vllmPage } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';

const CHAT = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
const ANSWER = JSON.stringify({ id: 'x', object: 'chat.completion', model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] });
const EVENT = 'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}\n\n';
const chunk = (s: string) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;

/** A model server on a raw socket: /metrics answered properly, each API request handed to `answer`. */
async function rawServer(answer: (socket: Socket) => void) {
  const sockets = new Set<Socket>();
  let requests = 0;
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => undefined);
    let buf = '';
    socket.on('data', (c) => {
      buf += c.toString('latin1');
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const length = Number(/content-length:\s*(\d+)/i.exec(buf.slice(0, end))?.[1] ?? 0);
        if (buf.length < end + 4 + length) return;
        const head = buf.slice(0, end);
        buf = buf.slice(end + 4 + length);
        if (head.startsWith('GET /metrics')) {
          const page = vllmPage();
          socket.write(`HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: ${page.length}\r\n\r\n${page}`);
        } else {
          requests++;
          answer(socket);
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    requests: () => requests,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

async function post(gw: Gateway, body = CHAT): Promise<{ status: number; text: string; shouldRetry?: unknown }> {
  try {
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const answer: { status: number; text: string; shouldRetry?: unknown } = { status: r.statusCode, text: await r.body.text() };
    if (r.headers['x-should-retry'] !== undefined) answer.shouldRetry = r.headers['x-should-retry'];
    return answer;
  } catch (err) {
    return { status: -1, text: String((err as { code?: string }).code ?? err) };
  }
}

const withBodyTimeout = (text: string) => text.replace('retries: 2 }', 'retries: 2, bodyTimeout: 300ms }');

test('an upstream header named like an Object.prototype member (constructor) is relayed like any other', async () => {
  const server = await rawServer((s) => s.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconstructor: x\r\nConstructor: y\r\ncontent-length: ${ANSWER.length}\r\n\r\n${ANSWER}`));
  await withGateway(server, fleetConfig([{ name: 'e0', port: server.port }]), async (gw) => {
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', body: CHAT });
    assert.equal(r.statusCode, 200);
    assert.deepEqual(r.headers['constructor'], ['x', 'y']);
    assert.equal(await r.body.text(), ANSWER);
  });
});

for (const first of ['HTTP/1.1 100 Continue\r\n\r\n', 'HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n']) {
  test(`a server that answered (${first.split('\r\n')[0]}) is not retried elsewhere as a lost connection: a 502, the request ran once`, async () => {
    const answer = first + `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${ANSWER.length}\r\n\r\n${ANSWER}`;
    const [a, b] = [await rawServer((s) => s.write(answer)), await rawServer((s) => s.write(answer))];
    const gw = await gatewayFor(fleetConfig([{ name: 'a', port: a.port }, { name: 'b', port: b.port }]));
    try {
      await waitForMetrics(gw);
      const r = await post(gw);
      assert.equal(r.status, 502, r.text);
      assert.equal(a.requests() + b.requests(), 1, 'sent to one model server only');
      assert.equal(r.shouldRetry, 'false', 'it ran: the openai client must not send it again');
      await nothingInFlight(gw);
    } finally {
      await gw.close();
      await a.close();
      await b.close();
    }
  });
}

for (const [name, headers] of [
  ['chunked JSON', { 'content-type': 'application/json' }],
  ['JSON of over 256 KiB', { 'content-type': 'application/json', 'content-length': String(300 << 10) }],
] as const) {
  for (const how of ['stalls', 'dies'] as const) {
    test(`${name} whose server ${how} after its headers, before any body byte: a §5 ${how === 'stalls' ? 504 : 502}, not a bare reset`, async () => {
      const backend = await startFakeBackend((_r, res) => {
        res.writeHead(200, headers);
        res.flushHeaders();
        if (how === 'dies') setTimeout(() => res.socket?.resetAndDestroy(), 50);
      });
      await withGateway(backend, withBodyTimeout(fleetConfig([{ name: 'b', port: backend.port }])), async (gw) => {
        const r = await post(gw);
        assert.equal(r.status, how === 'stalls' ? 504 : 502, r.text);
        assert.match(r.text, /"type":"(GatewayTimeout|BadGateway)Error"/);
        assert.equal(r.shouldRetry, 'false', 'the server took the request: not to be sent again');
        await nothingInFlight(gw);
      });
    });
  }
}

test('chunked JSON is still relayed whole, with its status line sent at the first body byte', async () => {
  const backend = await startFakeBackend((_r, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write(ANSWER.slice(0, 20));
    setTimeout(() => res.end(ANSWER.slice(20)), 20);
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    assert.deepEqual(await post(gw), { status: 200, text: ANSWER });
  });
});

/** An SSE answer: one whole event, then the first 40 bytes of the next, then `then`. */
function brokenStream(then: (s: Socket) => void) {
  return rawServer((s) => {
    s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n');
    s.write(chunk(EVENT));
    s.write(chunk(EVENT.slice(0, 40)));
    then(s);
  });
}

async function readStream(gw: Gateway): Promise<{ contents: string[]; err: unknown }> {
  const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
  const stream = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true });
  const contents: string[] = [];
  try {
    for await (const c of stream) contents.push(c.choices[0]?.delta?.content ?? '');
  } catch (err) {
    return { contents, err };
  }
  return { contents, err: undefined };
}

for (const [how, status] of [['reset', 502], ['stall', 504]] as const) {
  test(`an SSE stream cut mid-event (${how}): the whole events, then the gateway's error event, which the openai client reads (${status}); the request's log line says why`, async () => {
    const server = await brokenStream((s) => (how === 'reset' ? setTimeout(() => s.resetAndDestroy(), 50) : undefined));
    const debug = captureLogger('debug');
    await withGateway(
      server,
      withBodyTimeout(fleetConfig([{ name: 'e0', port: server.port }])),
      async (gw) => {
        const { contents, err } = await readStream(gw);
        assert.deepEqual(contents, ['hello']);
        assert.ok(err instanceof OpenAI.APIError, `the client got ${String(err)}`);
        const why = how === 'reset' ? /upstream e0 failed mid-response/ : /upstream e0 stopped answering/;
        assert.match(err.message, why);
        await nothingInFlight(gw);
        const done = debug.lines().find((l) => l.msg === 'request done')!;
        assert.equal(done.status, status);
        assert.match(String(done.error), why);
      },
      { logger: debug.logger },
    );
  });
}

test("a Responses API stream cut mid-answer ends with that API's typed error event, which the openai client throws with the gateway's message", async () => {
  const created = 'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"r","object":"response","status":"in_progress","output":[]}}\n\n';
  const delta = 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":1,"item_id":"i","output_index":0,"content_index":0,"delta":"hel"}\n\n';
  const server = await rawServer((s) => {
    s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n');
    s.write(chunk(created + delta));
    setTimeout(() => s.resetAndDestroy(), 50);
  });
  await withGateway(server, fleetConfig([{ name: 'e0', port: server.port }]), async (gw) => {
    const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
    const events: string[] = [];
    const err = await (async () => {
      for await (const e of await client.responses.create({ model: 'm', input: 'hi', stream: true })) events.push(e.type);
    })().catch((e: unknown) => e);
    assert.deepEqual(events, ['response.created', 'response.output_text.delta']);
    assert.ok(err instanceof OpenAI.APIError, String(err));
    assert.match(err.message, /upstream e0 failed mid-response/);
    // On the wire: the typed event (what typed parsers such as the Vercel AI SDK validate), no [DONE].
    const raw = await request(`${gw.apiUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"m","input":"hi","stream":true}' });
    const text = await raw.body.text();
    const last = text.slice(text.lastIndexOf('event: '));
    // Numbered after the events before it (0 and 1): a client ordering or resuming by sequence_number keeps it.
    assert.match(last, /^event: error\ndata: \{"type":"error","code":"BadGatewayError","message":"upstream e0 failed mid-response[^"]*","param":null,"sequence_number":2,"error":\{/);
    assert.ok(last.endsWith('}}\n\n'), JSON.stringify(last));
    await nothingInFlight(gw);
  });
});

test('an event too long to hold back (over 1 MiB) cut by a reset: every byte of it relayed, then the connection cut, no error event glued to it', async () => {
  const piece = 'x'.repeat(256 * 1024);
  const server = await rawServer((s) => {
    s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n');
    s.write(chunk(EVENT));
    s.write(chunk('data: {"choices":[{"delta":{"content":"'));
    // Six pieces: past the 1 MiB held back, then two more that must not be held again.
    let n = 0;
    const next = () => (n++ < 6 ? s.write(chunk(piece), () => setTimeout(next, 20)) : setTimeout(() => s.resetAndDestroy(), 50));
    next();
  });
  await withGateway(server, fleetConfig([{ name: 'e0', port: server.port }]), async (gw) => {
    const received = await new Promise<{ text: string; aborted: boolean }>((resolve, reject) => {
      const req = http.request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        let text = '';
        res.setEncoding('latin1');
        res.on('data', (c: string) => (text += c));
        res.on('aborted', () => resolve({ text, aborted: true }));
        res.on('end', () => resolve({ text, aborted: false }));
      });
      req.on('error', reject);
      req.end(JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] }));
    });
    assert.equal(received.aborted, true, `cut, as a JSON answer under way is; ended with ${JSON.stringify(received.text.slice(-120))}`);
    assert.ok(received.text.startsWith(EVENT));
    assert.equal(received.text.length, EVENT.length + 'data: {"choices":[{"delta":{"content":"'.length + 6 * piece.length, 'nothing held back and lost');
    assert.doesNotMatch(received.text, /error/);
    await nothingInFlight(gw);
  });
});

test('after an event too long to hold back ends, events are whole again: the next one split across reads is held, and a failure gets its own error event', async () => {
  const piece = 'x'.repeat(256 * 1024);
  const big = `data: {"choices":[{"delta":{"content":"${piece.repeat(5)}"}}]}\n\n`;
  const server = await rawServer((s) => {
    s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n');
    // Five writes of the long event (past 1 MiB: relayed as it comes), the sixth ends it and starts the next.
    const writes = [0, 1, 2, 3, 4].map((i) => big.slice(i * piece.length, (i + 1) * piece.length));
    writes.push(big.slice(5 * piece.length) + EVENT.slice(0, 30), EVENT.slice(30), EVENT.slice(0, 20));
    let n = 0;
    const next = () => (n < writes.length ? s.write(chunk(writes[n++]!), () => setTimeout(next, 20)) : setTimeout(() => s.resetAndDestroy(), 50));
    next();
  });
  await withGateway(server, fleetConfig([{ name: 'e0', port: server.port }]), async (gw) => {
    const text = await new Promise<string>((resolve, reject) => {
      const req = http.request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        let body = '';
        res.setEncoding('latin1');
        res.on('data', (c: string) => (body += c));
        res.on('aborted', () => reject(new Error(`cut after ${body.length} bytes`)));
        res.on('end', () => resolve(body));
      });
      req.on('error', reject);
      req.end(STREAM);
    });
    assert.ok(text.startsWith(big + EVENT), 'the long event, then the next one whole');
    // The third event broke off after 20 bytes: dropped, and the error is an event of its own.
    assert.match(text.slice(big.length + EVENT.length), /^data: \{"error":\{.*"code":502\}\}\n\ndata: \[DONE\]\n\n$/);
    await nothingInFlight(gw);
  });
});

test('an SSE stream mid-event when the shutdown grace period ends: the client reads the 503 event', async () => {
  const server = await brokenStream(() => undefined);
  await withGateway(server, fleetConfig([{ name: 'e0', port: server.port }]).replace('shutdownGracePeriod: 2s', 'shutdownGracePeriod: 300ms'), async (gw) => {
    const reading = readStream(gw);
    await until(() => gw.pool.endpoints[0]!.inFlight === 1, 3000, 'streaming');
    await gw.close();
    const { contents, err } = await reading;
    assert.deepEqual(contents, ['hello']);
    assert.ok(err instanceof OpenAI.APIError, `the client got ${String(err)}`);
    assert.match(err.message, /shutting down/);
  });
});

test('SSE events split across chunks anywhere, \\r\\n line ends included, reach the client whole and in order', async () => {
  const events = ['a', 'b', 'c', 'd'].map((t) => EVENT.replace('hello', t));
  const text = events[0]! + events[1]!.replace(/\n/g, '\r\n') + events[2]! + events[3]! + 'data: [DONE]\n\n';
  const cuts = [7, 150, 151, 290, 300, text.length - 3];
  const server = await rawServer((s) => {
    s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n');
    let from = 0;
    for (const to of [...cuts, text.length]) {
      s.write(chunk(text.slice(from, to)));
      from = to;
    }
    s.write('0\r\n\r\n');
  });
  await withGateway(server, fleetConfig([{ name: 'e0', port: server.port }]), async (gw) => {
    const { contents, err } = await readStream(gw);
    assert.equal(err, undefined);
    assert.deepEqual(contents, ['a', 'b', 'c', 'd']);
  });
});

for (const connector of ['nixlv2', 'shared-storage'] as const) {
  test(`${connector}: a body nested 1000 levels deep is served with its prefill leg; one nested deeper is refused 400 before either leg`, async () => {
    const [prefill, decode] = [await startFakeBackend(okJson), await startFakeBackend(okJson)];
    const gw = await gatewayFor(
      fleetConfig(
        [
          { name: 'p', port: prefill.port, labels: { 'llm-d.ai/role': 'prefill' } },
          { name: 'd', port: decode.port, labels: { 'llm-d.ai/role': 'decode' } },
        ],
        alwaysDisaggProfiles(connector),
      ),
    );
    try {
      await waitForMetrics(gw);
      // The body itself is one level: tools nests 999 more.
      const nested = (depth: number) => `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":${'['.repeat(depth)}${']'.repeat(depth)}}`;
      const served = await post(gw, nested(999));
      assert.equal(served.status, 200, served.text);
      assert.equal(prefill.received.length, 1, 'the prefill leg ran');
      const refused = await post(gw, nested(1000));
      assert.equal(refused.status, 400);
      assert.match(JSON.parse(refused.text).error.message, /nests arrays and objects more than 1000 levels deep/);
      assert.deepEqual([prefill.received.length, decode.received.length], [1, 1], 'neither leg saw it');
      await nothingInFlight(gw);
    } finally {
      await gw.close();
      await prefill.close();
      await decode.close();
    }
  });
}

test('no connection cap by default: 200 requests at once all reach the one model server (a cap would queue them unseen, in undici)', async () => {
  const held: (() => void)[] = [];
  const backend = await startFakeBackend((_r, res) => held.push(() => okJson(_r, res)));
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], 'featureGates: ["flowControl=false"]\n'), async (gw) => {
    const answers = Array.from({ length: 200 }, () =>
      request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: CHAT }).then(async (r) => {
        await r.body.text();
        return r.statusCode;
      }),
    );
    await until(() => backend.active === 200, 10_000, "all 200 at the server at once");
    for (const release of held.splice(0)) release();
    assert.deepEqual([...new Set(await Promise.all(answers))], [200]);
    await nothingInFlight(gw);
  });
});

/** Rejects when `p` has not settled within `ms` (a hang would otherwise last until the test's own time-out). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms).unref())]);
}

const STREAM = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] });

test("an SSE answer's headers reach the client when the model server sends them, before its first event; model servers are asked for uncompressed answers", async () => {
  let release: (() => void) | undefined;
  const backend = await startFakeBackend((_r, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders();
    release = () => res.end(`${EVENT}data: [DONE]\n\n`);
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const ac = new AbortController();
    const answer = request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'accept-encoding': 'gzip' }, body: STREAM, signal: ac.signal });
    try {
      // The first event is still held by the model server: only its headers can have come.
      const r = await within(answer, 3000, 'the headers');
      assert.equal(r.statusCode, 200);
      assert.equal(r.headers['content-type'], 'text/event-stream');
      assert.equal(backend.received[0]!.headers['accept-encoding'], 'identity');
      release!();
      assert.match(await r.body.text(), /data: \[DONE\]/);
    } finally {
      release?.();
      ac.abort();
    }
  });
});

test('a compressed SSE answer (the model server ignored accept-encoding) is relayed as it comes, not held back to cut it at event ends', async () => {
  let release: (() => void) | undefined;
  const backend = await startFakeBackend((_r, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
    const gz = zlib.createGzip();
    gz.pipe(res);
    gz.write(EVENT);
    gz.flush();
    release = () => gz.end('data: [DONE]\n\n');
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const ac = new AbortController();
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: STREAM, signal: ac.signal });
    try {
      const parts: Buffer[] = [];
      const first = new Promise<void>((resolve) => r.body.once('data', () => resolve()));
      r.body.on('data', (c: Buffer) => parts.push(c));
      await within(first, 3000, 'the first compressed event');
      release!();
      await new Promise((resolve) => r.body.once('end', resolve));
      assert.equal(zlib.gunzipSync(Buffer.concat(parts)).toString(), `${EVENT}data: [DONE]\n\n`);
    } finally {
      release?.();
      ac.abort();
    }
  });
});

test('response headers the model server names in Connection are hop-by-hop: not relayed', async () => {
  const backend = await startFakeBackend((_r, res) => {
    res.writeHead(200, { 'content-type': 'application/json', connection: 'keep-alive, x-hop', 'x-hop': 'secret', 'x-kept': 'yes' }).end(ANSWER);
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: CHAT });
    assert.equal(await r.body.text(), ANSWER);
    assert.equal(r.headers['x-hop'], undefined);
    assert.equal(r.headers['x-kept'], 'yes');
  });
});

test("a model server's x-llm-d-request-dropped-reason and x-prefiller-host-port are not relayed: only Sluice refuses, and the address is internal", async () => {
  const backend = await startFakeBackend((_r, res) => {
    res
      .writeHead(200, { 'content-type': 'application/json', 'x-llm-d-request-dropped-reason': 'rejected-saturated', 'x-prefiller-host-port': '10.0.0.9:8000', 'x-kept': 'yes' })
      .end(ANSWER);
  });
  await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: CHAT });
    assert.equal(await r.body.text(), ANSWER);
    assert.equal(r.statusCode, 200);
    assert.equal(r.headers['x-llm-d-request-dropped-reason'], undefined);
    assert.equal(r.headers['x-prefiller-host-port'], undefined);
    assert.equal(r.headers['x-kept'], 'yes');
  });
});

test('a request refused with 417 while waiting behind another on its connection, whose client left: the drain does not wait for it', async () => {
  let answerFirst: (() => void) | undefined;
  const backend = await startFakeBackend((r, res) => (answerFirst = () => okJson(r, res)));
  const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }]).replace('shutdownGracePeriod: 2s', 'shutdownGracePeriod: 10s'));
  try {
    await waitForMetrics(gw);
    const s = net.connect(gw.apiPort, '127.0.0.1');
    s.on('error', () => undefined);
    await new Promise((resolve) => s.once('connect', resolve));
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${CHAT.length}\r\n\r\n${CHAT}`);
    s.write('GET /health HTTP/1.1\r\nHost: x\r\nexpect: something\r\n\r\n');
    await until(() => answerFirst !== undefined, 3000, 'the first request at the model server');
    s.destroy();
    await nothingInFlight(gw);
  } finally {
    // The 417 never reached a socket; a drain waiting for it would last the whole 10 s grace period.
    await within(gw.close(), 5000, 'the drain');
    await backend.close();
  }
});

test("an idle connection to a model server is closed after 4 s even when the server's Keep-Alive offers 65 s (idle sockets count against the open-file limit)", async () => {
  let proxied: Socket | undefined;
  const server = http.createServer((req, res) => {
    if (req.url === '/metrics') return res.end(vllmPage());
    proxied = req.socket;
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(ANSWER));
  });
  server.keepAliveTimeout = 65_000; // Node then sends `Keep-Alive: timeout=65`, as the simulator does: undici alone keeps the socket ~64 s
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const backend = { close: () => new Promise<void>((r) => (server.closeAllConnections(), server.close(() => r()))) };
  await withGateway(backend, fleetConfig([{ name: 'k', port }]), async (gw) => {
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: CHAT });
    assert.equal(r.statusCode, 200);
    assert.match((await r.body.text()), /"ok"/);
    const socket = proxied!;
    const closedAt = await new Promise<number>((resolve) => {
      const start = Date.now();
      if (socket.destroyed) resolve(0);
      socket.once('close', () => resolve(Date.now() - start));
      setTimeout(() => resolve(Infinity), 15_000).unref();
    });
    assert.ok(closedAt < 15_000, 'the idle upstream connection was still open after 15 s');
  });
});
