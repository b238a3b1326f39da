/**
 * Abuse: whatever a client sends, Sluice itself answers only 2xx/4xx, always in the OpenAI error
 * shape, never a 500 from its own code; client-controlled label values stay capped; invalid config
 * files always end in a ConfigError, never a crash.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fc from 'fast-check';
import { request } from 'undici';
import { captureLogger, fleetConfig, gatewayFor, nothingInFlight, waitForMetrics } from '../helpers/fleet.js';
import { okJson, startFakeBackend, type FakeBackend } from '../helpers/fake-backend.js';
import type { Gateway } from '../../src/app.js';
import { ConfigError, loadConfigText } from '../../src/config/load.js';
import { until } from '../helpers/wait.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';

const ROUTES = ['/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/responses', '/v1/models', '/health', '/ready'];

function assertErrorShape(status: number, contentType: unknown, text: string) {
  assert.match(String(contentType), /application\/json/, `status ${status} body ${text}`);
  const body = JSON.parse(text) as { error?: { message?: unknown; type?: unknown; code?: unknown; param?: unknown } };
  assert.equal(typeof body.error?.message, 'string');
  assert.equal(typeof body.error?.type, 'string');
  assert.equal(body.error?.code, status);
  assert.ok(body.error && 'param' in body.error);
  assert.doesNotMatch(text, /\n\s+at .*\(/, 'no stack trace');
}

describe('abuse', () => {
  let backend: FakeBackend;
  let gw: Gateway;
  before(async () => {
    // A model server: it lists its model (else /v1/models is rightly a 502) and answers the rest.
    backend = await startFakeBackend((r, res) => {
      if (r.method !== 'GET' || !r.url.startsWith('/v1/models')) return okJson(r, res);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"object":"list","data":[{"id":"m","object":"model"}]}');
    });
    gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], '', '\n  bodyLimit: 64Ki'));
    await waitForMetrics(gw);
  });
  after(async () => {
    await gw.close();
    await backend.close();
  });

  test('random bodies, headers, paths and methods: only 2xx/4xx, OpenAI-shaped errors, never a 500', async () => {
    const jsonValue = fc.jsonValue({ maxDepth: 3 });
    const openaiish = fc.record(
      {
        model: fc.oneof(fc.string(), fc.constant('m'), jsonValue),
        messages: fc.oneof(fc.array(fc.record({ role: fc.string(), content: fc.oneof(fc.string(), jsonValue) })), jsonValue),
        prompt: fc.oneof(fc.string(), fc.array(fc.string()), jsonValue),
        input: jsonValue,
        stream: fc.oneof(fc.boolean(), jsonValue),
        max_tokens: fc.oneof(fc.integer(), jsonValue),
        stream_options: jsonValue,
      },
      { requiredKeys: [] },
    );
    const body = fc.oneof(
      openaiish.map((o) => JSON.stringify(o)),
      jsonValue.map((v) => JSON.stringify(v)),
      fc.string({ maxLength: 200 }),
      fc.uint8Array({ maxLength: 200 }).map((a) => Buffer.from(a).toString('latin1')),
    );
    const path = fc.oneof(
      fc.constantFrom(...ROUTES),
      fc.constantFrom(...ROUTES).chain((r) => fc.webQueryParameters().map((q) => `${r}?${q}`)),
      fc.webPath().map((p) => (p.startsWith('/') ? p : `/${p}`)),
    );
    const headerValue = fc.string({ maxLength: 60 }).map((s) => s.replace(/[^\x20-\x7e]/g, ''));
    const headers = fc.record(
      {
        'x-llm-d-inference-objective': headerValue,
        'x-llm-d-inference-fairness-id': headerValue,
        'x-gateway-inference-fairness-id': headerValue,
        'x-llm-d-slo-ttft-ms': fc.oneof(headerValue, fc.integer().map(String)),
        'x-request-id': headerValue,
        'x-prefiller-host-port': headerValue,
        'x-session-token': headerValue,
        'content-type': fc.constantFrom('application/json', 'text/plain', 'application/x-www-form-urlencoded'),
      },
      { requiredKeys: [] },
    );
    const method = fc.constantFrom('POST', 'POST', 'POST', 'GET', 'PUT', 'DELETE', 'PATCH');

    await fc.assert(
      fc.asyncProperty(method, path, headers, body, async (m, p, h, b) => {
        const r = await request(`${gw.apiUrl}${p}`, { method: m, headers: h, body: m === 'GET' ? undefined : b });
        const text = await r.body.text();
        const fromUpstream = backend.received.length > 0 && r.headers['x-backend-url'] !== undefined;
        backend.received.length = 0;
        assert.ok(r.statusCode < 500, `${m} ${p} → ${r.statusCode}: ${text}`);
        if (r.statusCode >= 400 && !fromUpstream) assertErrorShape(r.statusCode, r.headers['content-type'], text);
      }),
      { numRuns: 300, seed: 20261130 },
    );
  });

  test('oversized headers get 431, malformed HTTP gets 400 — both JSON, and the gateway keeps serving', async () => {
    const big = await request(`${gw.apiUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'x-huge': 'a'.repeat(40_000) },
      body: '{}',
    }).catch((e: Error) => e);
    if (!(big instanceof Error)) {
      assert.equal(big.statusCode, 431);
      assertErrorShape(431, big.headers['content-type'], await big.body.text());
    }
    const raw = await new Promise<string>((resolve) => {
      const s = net.connect(gw.apiPort, '127.0.0.1', () => s.write('GARBAGE /\x00 HTTP/9\r\n\r\n'));
      let out = '';
      s.on('data', (c) => (out += c));
      s.on('close', () => resolve(out));
    });
    assert.match(raw, /^HTTP\/1\.1 400 /);
    assert.match(raw, /"code":400/);
    const ok = await request(`${gw.apiUrl}/health`);
    assert.equal(ok.statusCode, 200);
    await ok.body.dump();
  });

  test('thousands of distinct model names and fairness ids: metric series stay capped', async () => {
    for (let i = 0; i < 1200; i += 50) {
      await Promise.all(
        Array.from({ length: 50 }, (_, k) =>
          request(`${gw.apiUrl}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-llm-d-inference-fairness-id': `tenant-${i + k}` },
            body: JSON.stringify({ model: `model-${i + k}`, messages: [{ role: 'user', content: 'x' }] }),
          }).then((r) => r.body.dump()),
        ),
      );
    }
    const m = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
    const series = (name: string) => m.split('\n').filter((l) => l.startsWith(`${name}{`)).length;
    assert.ok(series('llm_d_epp_request_total') <= 1001, `request_total series: ${series('llm_d_epp_request_total')}`);
    assert.match(m, /llm_d_epp_request_total\{model_name="other"/);
    const queueDurationFlows = new Set(
      m
        .split('\n')
        .filter((l) => l.startsWith('llm_d_epp_flow_control_request_queue_duration_seconds_count{'))
        .map((l) => /fairness_id="([^"]*)"/.exec(l)?.[1]),
    );
    assert.ok(queueDurationFlows.size <= 1001, `fairness_id values: ${queueDurationFlows.size}`);
    assert.ok(queueDurationFlows.has('other'));
  });
});

describe('config fuzzing', () => {
  test('any YAML or JSON document: a config or a ConfigError, never another exception', () => {
    const registry = builtinRegistry();
    const key = fc.constantFrom(
      'server', 'pool', 'plugins', 'schedulingProfiles', 'flowControl', 'objectives', 'featureGates', 'apiVersion', 'kind',
      'port', 'metricsPort', 'endpoints', 'name', 'address', 'type', 'parameters', 'pluginRef', 'weight', 'priority',
      'maxRequests', 'defaultRequestTTL', 'priorityBands', 'saturationDetector', 'labels', 'bodyLimit', 'metrics', 'interval',
    );
    const leaf = fc.oneof(fc.string({ maxLength: 12 }), fc.integer(), fc.double(), fc.boolean(), fc.constant(null), fc.constantFrom('50ms', '1Gi', 'queue-scorer', 'utilization-detector', '-1', 'decode'));
    const tree = fc.letrec((tie) => ({
      node: fc.oneof({ depthSize: 'small' }, leaf, fc.array(tie('node'), { maxLength: 3 }), fc.dictionary(key, tie('node'), { maxKeys: 4 })),
    })).node;
    const text = fc.oneof(
      tree.map((t) => JSON.stringify(t)),
      fc.dictionary(key, tree, { maxKeys: 6 }).map((t) => JSON.stringify(t)),
      fc.string({ maxLength: 120 }),
    );
    fc.assert(
      fc.property(text, (t) => {
        try {
          loadConfigText(t, 'fuzz.yaml', registry);
        } catch (err) {
          if (!(err instanceof ConfigError)) throw err;
          for (const line of err.format().split('\n')) assert.match(line, /^fuzz\.yaml:\d+:\d+: /);
        }
      }),
      { numRuns: 500, seed: 7 },
    );
  });
});

describe('slowloris', () => {
  test('a client that dribbles its headers is cut off with 408; others are served meanwhile', async () => {
    const backend = await startFakeBackend();
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], '', '\n  requestHeadersTimeout: 300ms'));
    try {
      await waitForMetrics(gw);
      const started = Date.now();
      const answer = await new Promise<string>((resolve) => {
        const s = net.connect(gw.apiPort, '127.0.0.1');
        let out = '';
        s.on('data', (c) => (out += c));
        s.on('close', () => resolve(out));
        s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n');
        const drip = setInterval(() => s.writable && s.write('x-drip: 1\r\n'), 50);
        s.on('close', () => clearInterval(drip));
        // meanwhile a well-behaved client is served
        void request(`${gw.apiUrl}/health`).then((r) => r.body.dump());
      });
      assert.match(answer, /^HTTP\/1\.1 408 /);
      assert.match(answer, /"code":408/);
      assert.ok(Date.now() - started < 5000, 'cut off in time');
    } finally {
      await gw.close();
      await backend.close();
    }
  });
});

describe('clients that leave or stall', () => {
  const chat = (stream: boolean) => JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: 'hi' }] });
  /** A whole chat completion request as raw HTTP/1.1 bytes (keep-alive), to pipeline on one socket. */
  const rawPost = (body: string): string =>
    `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
  /** Answers the first request slowly, every later one at once with ~3 MiB of SSE. */
  function bigSecondAnswer(): Promise<FakeBackend> {
    let n = 0;
    const chunk = `data: ${'x'.repeat(16 * 1024)}\n\n`;
    return startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (++n === 1) return void setTimeout(() => res.end('data: [DONE]\n\n'), 5000);
      let i = 0;
      const pump = (): void => {
        while (i++ < 200) if (!res.write(chunk)) return void res.once('drain', pump);
        res.end('data: [DONE]\n\n');
      };
      pump();
    });
  }

  test('a client that pipelines two requests and leaves: both are dropped upstream, nothing stays in flight', async () => {
    const backend = await bigSecondAnswer();
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }]));
    try {
      await waitForMetrics(gw);
      const one = rawPost(chat(true));
      const s = net.connect(gw.apiPort, '127.0.0.1');
      s.on('data', () => undefined);
      s.write(one + one);
      await until(() => backend.received.length === 2, 3000, 'both forwarded');
      s.destroy();
      // The second one's answer waits behind the first: Node never closes its response itself.
      await nothingInFlight(gw);
      await until(() => backend.active === 0, 3000, 'both upstream requests aborted');
    } finally {
      await gw.close();
      await backend.close();
    }
  });

  test('a client that pipelines a dozen requests and leaves: all dropped upstream, and no listener-leak warning', async () => {
    const backend = await startFakeBackend(() => undefined); // holds every request
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }]));
    const warnings: string[] = [];
    const onWarning = (w: Error): void => void warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    try {
      await waitForMetrics(gw);
      const one = rawPost(chat(false));
      const s = net.connect(gw.apiPort, '127.0.0.1');
      s.on('data', () => undefined);
      s.on('error', () => undefined);
      s.write(one.repeat(12));
      await until(async () => ((await (await request(`${gw.metricsUrl}/debug/requests`)).body.json()) as { total: number }).total === 12, 3000, 'all twelve received');
      s.destroy();
      await nothingInFlight(gw);
      await until(async () => ((await (await request(`${gw.metricsUrl}/debug/requests`)).body.json()) as { total: number }).total === 0, 3000, 'all twelve ended');
      await new Promise((r) => setImmediate(r));
      assert.deepEqual(warnings.filter((w) => /MaxListeners/.test(w)), []);
    } finally {
      process.off('warning', onWarning);
      await gw.close();
      await backend.close();
    }
  });

  test('a client that stops reading a stream is cut after upstream.bodyTimeout, and its slot freed; its log line says why', async () => {
    const chunk = `data: ${'x'.repeat(64 * 1024)}\n\n`;
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let i = 0;
      const pump = (): void => {
        while (i++ < 4000) if (!res.write(chunk)) return void res.once('drain', pump);
        res.end('data: [DONE]\n\n');
      };
      pump();
    });
    const debug = captureLogger('debug');
    const gw = await gatewayFor(
      fleetConfig([{ name: 'b', port: backend.port }]).replace('upstream: { connectTimeout: 1s, retries: 2 }', 'upstream: { connectTimeout: 1s, retries: 2, bodyTimeout: 300ms }'),
      { logger: debug.logger },
    );
    try {
      await waitForMetrics(gw);
      const body = chat(true);
      const s = net.connect(gw.apiPort, '127.0.0.1');
      const closed = new Promise<void>((r) => s.on('close', () => r()));
      s.on('error', () => undefined);
      s.write(rawPost(body));
      s.pause(); // reads nothing
      await until(() => backend.received.length === 1, 3000, 'forwarded');
      await until(() => gw.pool.endpoints[0]!.inFlight === 0 && backend.active === 0, 5000, 'slot freed, upstream aborted');
      s.resume(); // what was buffered, then the cut
      await closed;
      const done = () => debug.lines().find((l) => l.msg === 'request done');
      await until(() => done() !== undefined, 3000, 'request done');
      assert.deepEqual([done()!.status, done()!.error], [0, 'client read nothing for upstream.bodyTimeout: connection closed']);
    } finally {
      await gw.close();
      await backend.close();
    }
  });

  /**
   * `requests` pipelined requests (server.maxPipelinedRequests lifted) for 200 KB JSON answers (each relayed in one write once complete):
   * megabytes, more than loopback's socket buffers hold unread, so a client that stops reading
   * leaves a finished answer half written in the gateway, and the answers after it wait their turn
   * behind it. Node itself would keep that connection for ever. The client reads nothing (`budget`
   * undefined) or `budget` bytes every 100 ms, and hangs up once it has every answer.
   */
  async function pipelinedBigAnswers(bodyTimeout: string, budget: number | undefined, requests: number): Promise<{ cut: boolean; answers: number; seconds: number }> {
    const END = 'end-of-answer';
    const answer = JSON.stringify({ id: 'c', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: `${'y'.repeat(200 * 1024)}${END}` } }] });
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
      res.end(answer);
    });
    const log = captureLogger('warn');
    const gw = await gatewayFor(
      fleetConfig([{ name: 'b', port: backend.port }]).replace('upstream: { connectTimeout: 1s, retries: 2 }', `maxPipelinedRequests: 0\n  upstream: { connectTimeout: 1s, retries: 2, bodyTimeout: ${bodyTimeout} }`),
      { logger: log.logger },
    );
    let ticker: NodeJS.Timeout | undefined;
    try {
      await waitForMetrics(gw);
      const one = rawPost(chat(false));
      const s = net.connect(gw.apiPort, '127.0.0.1');
      const closed = new Promise<void>((r) => s.on('close', () => r()));
      s.on('error', () => undefined);
      // Whole answers seen (their end marker, which may straddle two chunks).
      let answers = 0;
      let tail = '';
      let left = budget ?? 0;
      s.on('data', (c: Buffer) => {
        const text = tail + c.toString('latin1');
        answers += text.split(END).length - 1;
        tail = text.slice(-(END.length - 1));
        if (answers === requests) s.end();
        left -= c.length;
        if (budget !== undefined && left <= 0) s.pause();
      });
      s.pause();
      const started = Date.now();
      s.write(one.repeat(requests));
      if (budget !== undefined) {
        ticker = setInterval(() => {
          left = budget;
          s.resume();
        }, 100);
      }
      const warned = (): boolean => log.lines().some((l) => String(l.msg).startsWith('client read nothing more of its finished answer'));
      // Once cut, the client reads what reached it, then sees the close.
      await Promise.race([closed, until(warned, 10_000, 'the gateway cut the connection').then(() => s.resume())]);
      await closed;
      await nothingInFlight(gw);
      return { cut: warned(), answers, seconds: (Date.now() - started) / 1000 };
    } finally {
      clearInterval(ticker);
      await gw.close();
      await backend.close();
    }
  }

  test('a client that never reads the end of a finished answer is cut after upstream.bodyTimeout', async () => {
    const r = await pipelinedBigAnswers('300ms', undefined, 40);
    assert.ok(r.cut, 'cut, with a warning that says why');
    assert.ok(r.answers < 40, `${r.answers} of 40 answers`);
  });

  test('a client that reads its answers slowly, but reads, is not cut', async () => {
    // 400 KB every 100 ms: the 24 MB take ~6 s, more than two checks of 2.5 s. Between two checks
    // the client reads ~10 MB, more than loopback holds between the gateway and the client (~4 MB
    // measured), so each check sees some of the gateway's writes complete.
    const r = await pipelinedBigAnswers('2500ms', 400 * 1024, 120);
    assert.equal(r.cut, false);
    assert.equal(r.answers, 120);
    assert.ok(r.seconds > 5, `${r.seconds} s: the checks ran while the client read`);
  });

  /**
   * Two requests pipelined on one connection, the first slow to answer: the second's answer, ready
   * first, waits for the connection. Its client is not stalling it, and must not be cut for it.
   */
  async function pipelinedBehindSlow(behave: (content: string, res: import('node:http').ServerResponse) => void, second: { stream: boolean }): Promise<{ text: string; warned: string[] }> {
    const backend = await startFakeBackend((r, res) => behave(JSON.parse(r.body).messages[0].content as string, res));
    const log = captureLogger('warn');
    const gw = await gatewayFor(
      fleetConfig([{ name: 'b', port: backend.port }]).replace('upstream: { connectTimeout: 1s, retries: 2 }', 'upstream: { connectTimeout: 1s, retries: 2, bodyTimeout: 300ms }'),
      { logger: log.logger },
    );
    try {
      await waitForMetrics(gw);
      const one = (content: string, stream: boolean): string => {
        const body = JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content }] });
        return rawPost(body);
      };
      const s = net.connect(gw.apiPort, '127.0.0.1');
      s.on('error', () => undefined);
      let text = '';
      s.on('data', (c: Buffer) => (text += c.toString('latin1')));
      const closed = new Promise<void>((r) => s.on('close', () => r()));
      s.write(one('first', true) + one('second', second.stream));
      await until(() => (text.match(/\[DONE\]|"total_tokens":4\}\}/g) ?? []).length >= 2 || s.destroyed, 8000, 'both answers');
      s.end();
      await closed;
      await nothingInFlight(gw);
      return { text, warned: log.lines().map((l) => String(l.msg)) };
    } finally {
      await gw.close();
      await backend.close();
    }
  }

  /** An SSE answer: `events` events of `size` bytes, `gapMs` apart (0: at once), then [DONE]. */
  function sse(res: import('node:http').ServerResponse, events: number, size: number, gapMs: number): void {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    let i = 0;
    const next = (): void => {
      if (res.destroyed) return;
      if (i++ === events) return void res.end('data: [DONE]\n\n');
      res.write(`data: {"choices":[{"delta":{"content":"${'z'.repeat(size)}"}}]}\n\n`);
      if (gapMs > 0) setTimeout(next, gapMs);
      else next();
    };
    next();
  }

  test('a pipelined answer that waits behind a silent one is not cut as unread', async () => {
    // The first, a JSON answer, says nothing for 1.2 s (a long generation); the second is ready at once.
    const json = (res: import('node:http').ServerResponse, content: string): void => okJson({ method: 'POST', url: `/${content}`, headers: {}, body: '' }, res);
    const r = await pipelinedBehindSlow((content, res) => (content === 'first' ? void setTimeout(() => json(res, content), 1200) : json(res, content)), { stream: false });
    assert.equal((r.text.match(/HTTP\/1\.1 200/g) ?? []).length, 2, r.text.slice(0, 300));
    assert.match(r.text, /x-backend-url: \/first[^]*x-backend-url: \/second/, 'both answers, in order');
    assert.deepEqual(r.warned.filter((m) => m.startsWith('client read nothing')), []);
  });

  test('a pipelined stream that waits behind a slow one is not cut as stalled', async () => {
    // The second streams 64 KB at once: more than its response holds before the connection is its own.
    const r = await pipelinedBehindSlow((content, res) => (content === 'first' ? sse(res, 12, 10, 100) : sse(res, 64, 1024, 0)), { stream: true });
    assert.equal((r.text.match(/data: \[DONE\]/g) ?? []).length, 2, r.text.slice(-300));
    assert.deepEqual(r.warned.filter((m) => m.startsWith('client read nothing')), []);
  });
});
