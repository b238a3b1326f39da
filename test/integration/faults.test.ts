/** Edge cases and faults on the request path, each against real servers on loopback. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { gzipSync } from 'node:zlib';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { request } from 'undici';
import { captureLogger, fleetConfig, gatewayFor, startFleet, withGateway } from '../helpers/fleet.js';
import { startFakeBackend } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';
import type { Gateway } from '../../src/app.js';

const MODEL = 'sim-model';
const chat = (content = 'hi', extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: MODEL, messages: [{ role: 'user', content }], ...extra });

async function post(url: string, body: string, headers: Record<string, string> = {}) {
  const r = await request(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await r.body.text();
  return { status: r.statusCode, headers: r.headers, text };
}

/**
 * A POST with `Expect: 100-continue` declaring `length` bytes: on `100 Continue` it sends `body`, or
 * gives up when there is none to send. Resolves with the final answer and whether it was told to go on.
 */
function postExpectingContinue(port: number, length: number, body?: string) {
  return new Promise<{ status: number; text: string; continued: boolean }>((resolve, reject) => {
    let continued = false;
    const req = http.request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'content-length': length, expect: '100-continue' } },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text, continued }));
      },
    );
    req.on('continue', () => {
      continued = true;
      if (body !== undefined) req.end(body);
      else req.destroy(new Error('told to send a body it has not got'));
    });
    req.on('error', reject);
  });
}

/** `sluice_endpoint_upstream_errors_total` samples as `endpoint/error` → value. */
async function endpointErrors(gw: Gateway): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const l of (await (await request(`${gw.metricsUrl}/metrics`)).body.text()).split('\n')) {
    const m = /^sluice_endpoint_upstream_errors_total\{endpoint_name="([^"]+)",error="([^"]+)"\} (\S+)$/.exec(l);
    if (m && Number(m[3]) !== 0) out[`${m[1]}/${m[2]}`] = Number(m[3]); // (every kind is exposed from 0)
  }
  return out;
}

describe('request path faults and limits', () => {
  test('a body over server.bodyLimit gets 413 without being buffered', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], '', '\n  bodyLimit: 1Ki'), async (gw) => {
      const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat('x'.repeat(5000)));
      assert.equal(r.status, 413);
      assert.equal(JSON.parse(r.text).error.type, 'RequestTooLargeError');
      assert.equal(backend.received.length, 0);
      const ok = await post(`${gw.apiUrl}/v1/chat/completions`, chat('small'));
      assert.equal(ok.status, 200);
    });
  });

  test('a large body over server.bodyLimit: the client reads the 413, never a connection reset', async () => {
    // Closing a socket with unread upload data sends a reset, which can overtake the 413: the openai
    // client then retries the whole upload as a network error. The client runs in its own process,
    // uploading while the gateway answers (in this one it could not race).
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], '', '\n  bodyLimit: 1Mi'), async (gw) => {
      const script = `
        const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(6 << 20) }] });
        const outcomes = [];
        for (let i = 0; i < 20; i++) {
          try {
            const r = await fetch(process.argv[1], { method: 'POST', headers: { 'content-type': 'application/json' }, body });
            await r.text();
            outcomes.push(String(r.status));
          } catch (e) { outcomes.push(e.cause?.code ?? e.message); }
        }
        console.log(JSON.stringify(outcomes));`;
      const child = spawn(process.execPath, ['--input-type=module', '-e', script, `${gw.apiUrl}/v1/chat/completions`]);
      let out = '';
      child.stdout.on('data', (c) => (out += c));
      await new Promise((r) => child.once('close', r));
      assert.deepEqual(JSON.parse(out), Array(20).fill('413'));
      assert.equal((await post(`${gw.apiUrl}/v1/chat/completions`, chat('small'))).status, 200);
    });
  });

  test('a compressed request body gets 415 saying so, not a JSON error that echoes its bytes', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      const gz = gzipSync(chat('compressed'));
      const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' }, body: gz });
      const body = JSON.parse(await r.body.text()) as { error: { message: string; code: number } };
      assert.equal(r.statusCode, 415);
      assert.equal(body.error.message, 'compressed request bodies are not supported (content-encoding: gzip): send the JSON uncompressed');
      assert.equal(backend.received.length, 0);
      const plain = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': 'identity' }, body: chat('plain') });
      assert.equal(plain.statusCode, 200);
      await plain.body.dump();
    });
  });

  test('Expect: 100-continue with a body declared over server.bodyLimit → 413 before the client sends it', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], '', '\n  bodyLimit: 1Ki'), async (gw) => {
      const r = await postExpectingContinue(gw.apiPort, 17 << 20);
      assert.equal(r.status, 413, r.text);
      assert.equal(r.continued, false, 'no 100 Continue');
      assert.match(JSON.parse(r.text).error.message, /exceeds the limit of 1024 bytes/);
      assert.equal(backend.received.length, 0);
    }, { waitMetrics: false });
  });

  test('no endpoint at all, flow control off → 503 rejected-no-endpoints at once', async () => {
    const gw = await gatewayFor(fleetConfig([], 'featureGates: ["flowControl=false"]\n'));
    try {
      const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat());
      assert.equal(r.status, 503);
      assert.equal(r.headers['x-llm-d-request-dropped-reason'], 'rejected-no-endpoints');
      assert.equal(JSON.parse(r.text).error.type, 'ServiceUnavailableError');
      assert.equal((await request(`${gw.apiUrl}/ready`)).statusCode, 503);
    } finally {
      await gw.close();
    }
  });

  test('a profile whose filters leave nothing → 429 rejected-saturated', async () => {
    const backend = await startFakeBackend();
    const extra = `plugins:
- type: label-selector-filter
  parameters: { matchLabels: { tier: gold } }
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins: [ { pluginRef: label-selector-filter }, { pluginRef: queue-scorer } ]
`;
    const { logger, lines } = captureLogger('info');
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port, labels: { tier: 'silver' } }], extra), async (gw) => {
      const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat(), { 'x-request-id': 'refused-1' });
      assert.equal(r.status, 429);
      assert.equal(r.headers['x-llm-d-request-dropped-reason'], 'rejected-saturated');
      assert.equal(backend.received.length, 0);
      // Counted as a request and an error; no latency sample (no model server answered it).
      const m = (await (await request(`${gw.metricsUrl}/metrics`)).body.text()).split('\n');
      assert.ok(m.some((l) => /^llm_d_epp_request_total\{.*\} 1$/.test(l)));
      assert.ok(m.some((l) => /^llm_d_epp_request_error_total\{.*error_code="429"\} 1$/.test(l)));
      assert.ok(!m.some((l) => /^llm_d_epp_request_duration_seconds_count\{.*\} [1-9]/.test(l)), 'no duration sample');
      // Visible without debug logging: one warning naming the reason, the request and why (a full
      // queue is rejected-saturated too: only the message tells the operator to look at the filters).
      const warned = lines().filter((l) => l.msg === 'the gateway is refusing requests');
      assert.deepEqual(warned.map((l) => [l.level, l.droppedReason, l.status, l.requestId, l.error]), [
        [40, 'rejected-saturated', 429, 'refused-1', 'profile default: filter label-selector-filter left no endpoints'],
      ]);
    }, { logger });
  });

  // Written out, not imported from headers.ts: the test is what must be stripped (llm-d's routing sidecar's names).
  const SIDECAR_ADDRESS_HEADERS = [
    'x-llm-d-prefiller-host-port',
    'x-prefiller-url',
    'x-llm-d-encoder-hosts-ports',
    'x-encoder-hosts-ports',
    'x-llm-d-kv-cache-source-host-port',
    'x-kv-cache-source-host-port',
    'x-data-parallel-host-port',
  ];

  test("a client-sent x-prefiller-host-port, the sidecar's other address headers and routing headers never reach upstream; hop-by-hop stripped", async () => {
    const backend = await startFakeBackend();
    const extra = 'objectives:\n- { name: interactive, priority: 10 }\n';
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], extra), async (gw) => {
      const body = chat('spoof');
      // node:http rather than undici: undici refuses to send hop-by-hop headers at all.
      const status = await new Promise<number | undefined>((resolve, reject) => {
        const req = http.request(
          `${gw.apiUrl}/v1/chat/completions?x=1`,
          {
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              'x-prefiller-host-port': '169.254.169.254:80',
              'x-llm-d-inference-objective': 'interactive',
              'x-llm-d-inference-fairness-id': 'tenant-a',
              'x-gateway-inference-objective': 'interactive',
              'x-llm-d-request-dropped-reason': 'rejected-saturated',
              'x-gateway-destination-endpoint': '10.0.0.9:8000',
              'x-llm-d-slo-tpot-ms': '50',
              // llm-d's routing sidecar would prefill, encode or pull KV blocks where these say.
              ...Object.fromEntries(SIDECAR_ADDRESS_HEADERS.map((h) => [h, 'attacker.example:9999'])),
              'x-custom': 'kept',
              'x-hop': 'named in Connection',
              connection: 'keep-alive, x-hop',
              'keep-alive': 'timeout=5',
            },
          },
          (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode));
          },
        );
        req.on('error', reject);
        req.end(body);
      });
      assert.equal(status, 200);
      const got = backend.received.at(-1)!;
      assert.equal(got.headers['x-prefiller-host-port'], undefined);
      assert.equal(got.headers['x-llm-d-inference-objective'], undefined);
      assert.equal(got.headers['x-llm-d-inference-fairness-id'], undefined);
      assert.equal(got.headers['x-gateway-inference-objective'], undefined);
      // llm-d's other control headers: stripped as llm-d strips them.
      assert.equal(got.headers['x-llm-d-request-dropped-reason'], undefined);
      assert.equal(got.headers['x-gateway-destination-endpoint'], undefined);
      assert.equal(got.headers['x-llm-d-slo-tpot-ms'], undefined);
      assert.deepEqual(SIDECAR_ADDRESS_HEADERS.filter((h) => got.headers[h] !== undefined), []);
      assert.equal(got.headers['keep-alive'], undefined);
      assert.equal(got.headers['x-hop'], undefined);
      assert.equal(got.headers['x-custom'], 'kept');
      assert.ok(got.headers['x-request-id']);
      assert.equal(got.url, '/v1/chat/completions?x=1');
      assert.equal(got.body, body, 'body forwarded byte for byte');
    });
  });

  test('Expect: 100-continue (curl sends it for large bodies): the client is told to go on, the model server never sees it', async () => {
    const backend = await startFakeBackend();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      const body = chat('a long prompt');
      const r = await postExpectingContinue(gw.apiPort, Buffer.byteLength(body), body);
      assert.equal(r.status, 200, r.text);
      assert.ok(r.continued, '100 Continue came first');
      assert.equal(backend.received.length, 1);
      assert.equal(backend.received[0]!.headers.expect, undefined);
      assert.equal(backend.received[0]!.body, body);
    });
  });

  test('a killed endpoint: requests still succeed via the others, and retries are counted', async () => {
    const fleet = await startFleet(3);
    try {
      await fleet.sims[0]!.close();
      const results = await Promise.all(
        Array.from({ length: 30 }, (_, i) => post(`${fleet.gw.apiUrl}/v1/chat/completions`, chat(`after kill ${i}`, { max_tokens: 1 }))),
      );
      for (const r of results) assert.equal(r.status, 200, r.text);
      for (const r of results) assert.notEqual(r.headers['x-inference-pod'], fleet.sims[0]!.name);
      const metrics = await (await request(`${fleet.gw.metricsUrl}/metrics`)).body.text();
      assert.match(metrics, /llm_d_epp_upstream_retries_total\{endpoint_name="sim-0"\} [1-9]/);
      // Refused: no connection was made, so the model server never saw the request.
      assert.match(metrics, /sluice_endpoint_upstream_errors_total\{endpoint_name="sim-0",error="connect"\} [1-9]/);
      assert.match(metrics, /endpoint_name="sim-0",error="reset"\} 0\n/);
      for (const ep of fleet.gw.pool.endpoints) assert.deepEqual([ep.inFlight, ep.inFlightTokens], [0, 0], ep.name);
    } finally {
      await fleet.close();
    }
  });

  test("the openai client does not retry on top of Sluice's retries when a server took the request and dropped it", async () => {
    // Reads each request, then resets: a model server that crashed on it (it may have run).
    let taken = 0;
    const dropper = net.createServer((socket) =>
      socket.once('data', (d: Buffer) => {
        if (d.toString('latin1').startsWith('POST')) taken++; // not the scrapes
        socket.resetAndDestroy();
      }),
    );
    await new Promise<void>((r) => dropper.listen(0, '127.0.0.1', r));
    const gw = await gatewayFor(fleetConfig([{ name: 'crashing', port: (dropper.address() as AddressInfo).port }], 'featureGates: ["flowControl=false"]\n'));
    try {
      const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 2 });
      const err = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }).then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(err instanceof OpenAI.InternalServerError, String(err));
      assert.equal(err.status, 502);
      // Sluice's own two tries (a lost connection gets one more on a fresh one), not three times that.
      assert.equal(taken, 2);
    } finally {
      await gw.close();
      dropper.close();
    }
  });

  test('a server that held the request a while before dropping it is not tried again (it may have run it); another endpoint is', async () => {
    // Each reads the request, "works" 400 ms, then resets: a model server that crashed on it.
    const taken: number[] = [0, 0];
    const servers = await Promise.all(
      taken.map(async (_, i) => {
        const server = net.createServer((socket) =>
          socket.once('data', (d: Buffer) => {
            if (!d.toString('latin1').startsWith('POST')) return socket.destroy(); // not the scrapes
            taken[i]!++;
            setTimeout(() => socket.resetAndDestroy(), 400);
          }),
        );
        await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
        return server;
      }),
    );
    const gw = await gatewayFor(
      fleetConfig(servers.map((s, i) => ({ name: `crashing-${i}`, port: (s.address() as AddressInfo).port })), 'featureGates: ["flowControl=false"]\n'),
    );
    try {
      const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat());
      assert.equal(r.status, 502);
      assert.match(JSON.parse(r.text).error.message, /no other endpoint is eligible/);
      assert.equal(r.headers['x-should-retry'], 'false');
      // Once on each: the retry went to the other server, and neither ran it twice.
      assert.deepEqual(taken, [1, 1]);
    } finally {
      await gw.close();
      for (const s of servers) s.close();
    }
  });

  test('all endpoints dropping connections → 502 after the retries, OpenAI-shaped; each retry counted once', async () => {
    // Listening servers that reset every connection at once (a closed port could be taken meanwhile
    // by another test's server, running in parallel).
    const droppers = await Promise.all(
      Array.from({ length: 4 }, async () => {
        const server = net.createServer((socket) => socket.resetAndDestroy());
        await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
        return server;
      }),
    );
    const deadPorts = droppers.map((d) => (d.address() as AddressInfo).port);
    const retries = async (gw: Gateway) =>
      (await (await request(`${gw.metricsUrl}/metrics`)).body.text())
        .split('\n')
        .filter((l) => l.startsWith('llm_d_epp_upstream_retries_total{'))
        .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
    // Flow control off: with it on, an endpoint that never answered a scrape is stale, so the request
    // would wait in the queue (the flow-control tests cover that) instead of reaching the dead server.
    const off = 'featureGates: ["flowControl=false"]\n';
    const four = await gatewayFor(fleetConfig(deadPorts.map((port, i) => ({ name: `dead-${i}`, port })), off));
    const one = await gatewayFor(fleetConfig([{ name: 'dead', port: deadPorts[0]! }], off));
    try {
      const r = await post(`${four.apiUrl}/v1/chat/completions`, chat());
      assert.equal(r.status, 502);
      assert.equal(JSON.parse(r.text).error.type, 'BadGatewayError');
      assert.match(JSON.parse(r.text).error.message, /after 3 attempt\(s\)/);
      // The servers took the request (may have run it) and Sluice has retried: the openai client must not run it a fourth time.
      assert.equal(r.headers['x-should-retry'], 'false');
      assert.equal(await retries(four), 2, 'retries: 2 → two retries, the third failure is not retried');
      // Each lost connection is counted against its endpoint: three attempts, three endpoints (the
      // untried ones first). The servers accepted and reset: `reset` (the request may have reached
      // them), not `connect`.
      const connectErrors = Object.entries(await endpointErrors(four));
      assert.equal(connectErrors.length, 3, JSON.stringify(connectErrors));
      for (const [key, n] of connectErrors) assert.ok(key.endsWith('/reset') && n === 1, key);
      const alone = await post(`${one.apiUrl}/v1/chat/completions`, chat());
      assert.equal(alone.status, 502);
      assert.match(JSON.parse(alone.text).error.message, /no other endpoint is eligible/);
      assert.equal(alone.headers['x-should-retry'], 'false');
      assert.equal(await retries(one), 1, 'alone, it gets one more try on a fresh connection, then nowhere to retry');
      // The endpoint was scheduled twice; the retry that found no other is the connection's 502, not a refusal.
      const attempts = (await (await request(`${one.metricsUrl}/metrics`)).body.text()).split('\n').filter((l) => l.startsWith('llm_d_epp_scheduler_attempts_total{'));
      assert.deepEqual(
        attempts.map((l) => [/status="(\w+)"/.exec(l)![1], Number(l.slice(l.lastIndexOf(' ') + 1))]).filter(([, n]) => n !== 0),
        [['success', 2]],
        attempts.join('\n'),
      );
    } finally {
      await four.close();
      await one.close();
      for (const d of droppers) d.close();
    }
  });

  test('a keep-alive connection the server closes as a request arrives: the request is sent again on a fresh one, to the same server if need be', async () => {
    // Each connection's first request is answered (keep-alive); a second one on it is read and the
    // connection closed unanswered, as a server closing an idle connection just as a request went out.
    const seen = new WeakMap<net.Socket, number>();
    let answered = 0;
    const backend = http.createServer((req, res) => {
      const n = (seen.get(req.socket) ?? 0) + 1;
      seen.set(req.socket, n);
      req.resume();
      req.on('end', () => {
        if (req.url === '/metrics') return void res.end('vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n');
        if (n > 1) return void req.socket.destroy();
        answered++;
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] }));
      });
    });
    backend.keepAliveTimeout = 60_000;
    await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
    const port = (backend.address() as AddressInfo).port;
    const gw = await gatewayFor(fleetConfig([{ name: 'only', port }], 'featureGates: ["flowControl=false"]\n'));
    try {
      for (let i = 0; i < 4; i++) {
        const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat(`turn ${i}`));
        assert.equal(r.status, 200, `request ${i}: ${r.text}`);
      }
      assert.equal(answered, 4);
      const errors = await endpointErrors(gw);
      assert.ok((errors['only/reset'] ?? 0) >= 1, `the lost connections are counted: ${JSON.stringify(errors)}`);
    } finally {
      await gw.close();
      backend.closeAllConnections();
      backend.close();
    }
  });

  test('an endpoint that never accepts the connection → 504 after connectTimeout (an upstream time-out)', async () => {
    // A listener in a stopped process whose accept queue is full: the kernel drops further SYNs, so
    // connecting times out (loopback refuses or accepts at once otherwise).
    const holder = spawn(process.execPath, ['-e', `require('net').createServer().listen({ port: 0, host: '127.0.0.1', backlog: 1 }, function () { console.log(this.address().port); })`]);
    const port = await new Promise<number>((resolve) => holder.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim()))));
    holder.kill('SIGSTOP');
    const fillers = Array.from({ length: 4 }, () => net.connect(port, '127.0.0.1').on('error', () => undefined));
    const gw = await gatewayFor(
      fleetConfig([{ name: 'silent', port }], 'featureGates: ["flowControl=false"]\n').replace('connectTimeout: 1s', 'connectTimeout: 300ms'),
    );
    try {
      const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat());
      assert.equal(r.status, 504, r.text);
      assert.equal(JSON.parse(r.text).error.type, 'GatewayTimeoutError');
      assert.equal(r.headers['x-should-retry'], undefined, 'never connected, nothing ran: the client may try again later');
      assert.match(JSON.parse(r.text).error.message, /upstream connection timed out/);
    } finally {
      await gw.close();
      for (const f of fillers) f.destroy();
      holder.kill('SIGKILL');
    }
  });

  test('a streamed answer: the first event reaches the client long before the last', async () => {
    const fleet = await startFleet(1, { itlMs: 40, ttftOverheadMs: 1 });
    try {
      const t0 = Date.now();
      const r = await request(`${fleet.gw.apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: chat('stream me', { stream: true, max_tokens: 12 }),
      });
      assert.equal(r.statusCode, 200);
      assert.match(String(r.headers['content-type']), /text\/event-stream/);
      const arrivals: number[] = [];
      let text = '';
      for await (const chunk of r.body) {
        arrivals.push(Date.now() - t0);
        text += chunk.toString();
      }
      assert.ok(text.trimEnd().endsWith('data: [DONE]'));
      const first = arrivals[0]!;
      const last = arrivals.at(-1)!;
      // 12 tokens × 40 ms: the stream lasts ≈ 480 ms; a buffering proxy would deliver it all at once.
      assert.ok(arrivals.length >= 5, `expected incremental delivery, got ${arrivals.length} reads`);
      assert.ok(last - first >= 200, `first at ${first} ms, last at ${last} ms`);
    } finally {
      await fleet.close();
    }
  });

  test('a client abort frees the upstream slot at once', async () => {
    const fleet = await startFleet(1, { maxNumSeqs: 1, itlMs: 50 });
    const sim = fleet.sims[0]!;
    try {
      const ac = new AbortController();
      const r = await request(`${fleet.gw.apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: chat('long one', { stream: true, max_tokens: 200 }),
        signal: ac.signal,
      });
      const it = r.body[Symbol.asyncIterator]();
      await it.next(); // the stream is running
      assert.equal(sim.engine.actualGauges().running, 1);
      assert.equal(fleet.gw.pool.endpoints[0]!.inFlight, 1);
      ac.abort();
      await until(() => sim.engine.actualGauges().running === 0 && fleet.gw.pool.endpoints[0]!.inFlight === 0, 2000);
      // the slot is free: a new request is served at once rather than queued behind 200 tokens
      const next = await post(`${fleet.gw.apiUrl}/v1/chat/completions`, chat('next', { max_tokens: 1 }));
      assert.equal(next.status, 200);
    } finally {
      await fleet.close();
    }
  });

  test('upstream failing mid-stream ends the SSE stream with an error event, not a hang; counted as a 502', async () => {
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
      setTimeout(() => res.socket?.destroy(), 30);
    });
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]), async (gw) => {
      const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat('x', { stream: true }));
      assert.equal(r.status, 200);
      assert.match(r.text, /data: \{"error":\{.*"code":502\}\}\n\ndata: \[DONE\]\n\n$/);
      assert.equal(gw.pool.endpoints[0]!.inFlight, 0);
      // The client got a broken answer whatever its status line said: an error to alert on.
      const lines = (await (await request(`${gw.metricsUrl}/metrics`)).body.text()).split('\n');
      const errors = lines.filter((l) => l.startsWith('llm_d_epp_request_error_total{') && !l.endsWith(' 0'));
      assert.deepEqual(errors, [`llm_d_epp_request_error_total{model_name="${MODEL}",target_model_name="${MODEL}",error_code="502"} 1`]);
      // The model server did answer (then broke off): its latency is recorded.
      assert.ok(lines.includes(`llm_d_epp_request_duration_seconds_count{model_name="${MODEL}",target_model_name="${MODEL}"} 1`));
      // ... and so are its first-byte time and the cut, against the endpoint.
      assert.ok(lines.includes('sluice_endpoint_first_byte_seconds_count{endpoint_name="b"} 1'), lines.filter((l) => l.includes('first_byte')).join('\n'));
      assert.deepEqual(await endpointErrors(gw), { 'b/cut': 1 });
    });
  });

  test('an upstream cut right after its data: [DONE] is a complete answer: no error event, no error counted, no ejection', async () => {
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n');
      setTimeout(() => res.socket?.destroy(), 30); // no end of the chunked body
    });
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], '', '\n  upstream: { outlierDetection: { consecutiveFailures: 1 } }').replace('  upstream: { connectTimeout: 1s, retries: 2 }\n', ''), async (gw) => {
      for (let i = 0; i < 3; i++) {
        const r = await post(`${gw.apiUrl}/v1/chat/completions`, chat('x', { stream: true }));
        assert.equal(r.status, 200);
        assert.equal(r.text, 'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n');
      }
      assert.deepEqual(await endpointErrors(gw), {});
      assert.equal(gw.pool.byName('b')?.failureStreak, 0);
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.doesNotMatch(text, /^llm_d_epp_request_error_total\{[^}]*error_code="502"[^}]*\} [1-9]/m);
    });
  });

  test('an upstream that never answers → 504 after headersTimeout', async () => {
    const backend = await startFakeBackend(() => undefined);
    const log = captureLogger();
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }]).replace('upstream: { connectTimeout: 1s, retries: 2 }', 'upstream: { connectTimeout: 1s, headersTimeout: 300ms, retries: 2 }'), async (gw2) => {
      const r = await post(`${gw2.apiUrl}/v1/chat/completions`, chat());
      assert.equal(r.status, 504);
      assert.equal(JSON.parse(r.text).error.type, 'GatewayTimeoutError');
      assert.equal(backend.received.length, 1, 'a time-out is not retried (the server may be working on it)');
      assert.equal(r.headers['x-should-retry'], 'false', 'nor by the openai client');
      assert.deepEqual(await endpointErrors(gw2), { 'b/headers_timeout': 1 });
      // Said at warn level, with the request and the endpoint: not only in a counter.
      const warned = log.lines().find((l) => l.msg === 'upstream did not answer within upstream.headersTimeout: 504');
      assert.equal(warned?.endpoint, 'b');
      assert.ok(typeof r.headers['x-request-id'] === 'string');
      assert.equal(warned?.requestId, r.headers['x-request-id']);
    }, { logger: log.logger });
  });
});

describe('GET /v1/models', () => {
  test('the client key reaches the servers; a refusal or no answer is an error, never an empty list', async () => {
    // Like vLLM started with --api-key: /v1/models needs the bearer token.
    const protectedServer = await startFakeBackend((r, res) => {
      const ok = r.headers.authorization === 'Bearer secret';
      res.writeHead(ok ? 200 : 401, { 'content-type': 'application/json' });
      res.end(ok ? JSON.stringify({ object: 'list', data: [{ id: 'm1', object: 'model' }] }) : '{"error":"Unauthorized"}');
    });
    const gw = await gatewayFor(fleetConfig([{ name: 'a', port: protectedServer.port }]));
    const down = net.createServer((socket) => socket.resetAndDestroy());
    await new Promise<void>((r) => down.listen(0, '127.0.0.1', r));
    const dead = await gatewayFor(fleetConfig([{ name: 'd', port: (down.address() as AddressInfo).port }]));
    const get = async (g: Gateway, headers: Record<string, string> = {}) => {
      const r = await request(`${g.apiUrl}/v1/models`, { headers });
      return { status: r.statusCode, body: await r.body.text(), requestId: r.headers['x-request-id'] };
    };
    try {
      const listed = await get(gw, { authorization: 'Bearer secret', 'x-request-id': 'list-1' });
      assert.equal(listed.status, 200);
      assert.deepEqual((JSON.parse(listed.body) as { data: { id: string }[] }).data.map((m) => m.id), ['m1']);
      assert.equal(listed.requestId, 'list-1');
      assert.equal(protectedServer.received.at(-1)?.headers['x-request-id'], 'list-1');
      // Without the key: the server's own 401, not a cached list and not an empty one.
      const refused = await get(gw);
      assert.deepEqual([refused.status, refused.body], [401, '{"error":"Unauthorized"}']);
      // The key's list is cached (a second call reaches no server).
      const calls = protectedServer.received.length;
      assert.equal((await get(gw, { authorization: 'Bearer secret' })).status, 200);
      assert.equal(protectedServer.received.length, calls);
      // No server answers at all: 502, OpenAI-shaped.
      const none = await get(dead);
      assert.equal(none.status, 502);
      assert.equal((JSON.parse(none.body) as { error: { type: string } }).error.type, 'BadGatewayError');
    } finally {
      await gw.close();
      await dead.close();
      await protectedServer.close();
      down.close();
    }
  });
});
