/** Flow control end to end: gating, stage awareness, staleness, priority, fairness, limits. */
import { describe, test } from 'node:test';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { request } from 'undici';
import { captureLogger, fleetConfig, gatewayFor, waitForMetrics, withGateway } from '../helpers/fleet.js';
import { okJson, slowJson, startFakeBackend, vllmPage, type FakeBackend } from '../helpers/fake-backend.js';
import type { Gateway } from '../../src/app.js';
import { until } from '../helpers/wait.js';

const chat = (content = 'hi') => JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] });

function post(gw: Gateway, headers: Record<string, string> = {}, content = 'hi', signal?: AbortSignal) {
  return request(`${gw.apiUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: chat(content),
    signal,
  }).then(async (r) => ({ status: r.statusCode, headers: r.headers, text: await r.body.text() }));
}

async function metricsText(gw: Gateway): Promise<string> {
  return (await request(`${gw.metricsUrl}/metrics`)).body.text();
}

function gauge(text: string, name: string, labels: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && labels.split(',').every((kv) => l.includes(kv)));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}


const closeAll = async (gw: Gateway, ...backends: FakeBackend[]) => {
  await gw.close();
  await Promise.all(backends.map((b) => b.close()));
};

/** The backend holds the next request until the returned function is called; later ones answer after 5 ms. */
function holdNext(backend: FakeBackend): () => void {
  let held: (() => void) | undefined;
  let released = false;
  backend.behave = (r, res) => {
    backend.behave = slowJson(5);
    held = () => okJson(r, res);
    if (released) held();
  };
  return () => {
    released = true;
    held?.();
  };
}

/**
 * A gateway whose only slot (concurrency detector, max 1) a held first request takes, so what is sent
 * next queues until `release()`. `top` adds sections; `plugins` and `flowControl` add lines to those.
 */
async function oneSlotTaken(opts: { top?: string; plugins?: string; flowControl?: string; firstHeaders?: Record<string, string> } = {}) {
  const backend = await startFakeBackend(slowJson(5));
  const extra = `${opts.top ?? ''}plugins:
${opts.plugins ?? ''}- type: concurrency-detector
  parameters: { maxConcurrency: 1 }
flowControl:
  saturationDetector: { pluginRef: concurrency-detector }
${opts.flowControl ?? ''}`;
  const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], extra));
  await waitForMetrics(gw);
  const release = holdNext(backend);
  const first = post(gw, opts.firstHeaders ?? {}, 'first');
  await until(() => backend.received.length === 1);
  return { backend, gw, release, first };
}

const DETECTOR = `- type: utilization-detector
  parameters: { queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 300ms }
`;

describe('flow control', () => {
  test('prefill saturated while decode idle: requests are held, then released when prefill recovers', async () => {
    const prefill = await startFakeBackend();
    const decode = await startFakeBackend();
    const extra = `plugins:
- type: decode-filter
- type: queue-scorer
${DETECTOR}schedulingProfiles:
- name: default
  plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer } ]
`;
    const gw = await gatewayFor(
      fleetConfig(
        [
          { name: 'prefill-0', port: prefill.port, labels: { 'llm-d.ai/role': 'prefill' } },
          { name: 'decode-0', port: decode.port, labels: { 'llm-d.ai/role': 'decode' } },
        ],
        extra,
      ),
    );
    try {
      await waitForMetrics(gw);
      prefill.metrics = vllmPage(10); // 10 waiting / threshold 5 → prefill stage at 2.0
      await until(() => gw.pool.endpoints[0]!.metrics?.waiting === 10);
      const held = post(gw);
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="default-flow"') ?? 0) === 1, 3000, 'request queued');
      const m = await metricsText(gw);
      assert.equal(gauge(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="prefill"'), 2);
      assert.ok(gauge(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="decode"')! < 1);
      assert.equal(gauge(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="global"'), 2);
      assert.equal(gauge(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="interleaved"'), undefined, 'empty stage has no series');
      assert.equal(decode.received.length, 0, 'decode idle but the request is held');
      prefill.metrics = vllmPage(0);
      const r = await held;
      assert.equal(r.status, 200);
      assert.equal(decode.received.length, 1);
      assert.equal(prefill.received.length, 0, 'plain traffic goes to decode pods');
    } finally {
      await closeAll(gw, prefill, decode);
    }
  });

  test('every /metrics failing: stale gauge = endpoints, saturation 1.0, TTL 429, one warning; recovery lets traffic flow and is logged', async () => {
    const a = await startFakeBackend();
    const b = await startFakeBackend();
    const { logger, lines } = captureLogger('info');
    const extra = `plugins:
${DETECTOR}flowControl:
  defaultRequestTTL: 400ms
`;
    const gw = await gatewayFor(fleetConfig([{ name: 'a', port: a.port }, { name: 'b', port: b.port }], extra), { logger });
    try {
      await waitForMetrics(gw);
      a.metrics = 500;
      b.metrics = 500;
      await until(async () => gauge(await metricsText(gw), 'llm_d_epp_flow_control_stale_endpoints', 'detector=') === 2, 3000, 'stale gauge = 2');
      const m = await metricsText(gw);
      assert.equal(gauge(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="global"'), 1);
      const r = await post(gw);
      assert.equal(r.status, 429);
      assert.equal(r.headers['x-llm-d-request-dropped-reason'], 'rejected-ttl-expired');
      assert.equal(r.headers['retry-after'], undefined, 'it waited its TTL: a retry is the client\'s call');
      assert.equal(JSON.parse(r.text).error.type, 'RateLimitError');
      // The answer says why it waited: the stage that held it and the servers that cannot be read.
      assert.equal(
        JSON.parse(r.text).error.message,
        'request timed out in queue: the pool stayed saturated: decode 1.00; 2 endpoints with stale metrics (unreachable or not answering /metrics)',
      );
      assert.equal(a.received.length + b.received.length, 0);
      const staleWarnings = lines().filter((l) => /stale/i.test(String(l.msg)));
      assert.equal(staleWarnings.length, 1, JSON.stringify(staleWarnings));
      assert.match(JSON.stringify(staleWarnings[0]), /HTTP 500/);
      a.metrics = vllmPage();
      b.metrics = vllmPage();
      await until(async () => gauge(await metricsText(gw), 'llm_d_epp_flow_control_stale_endpoints', 'detector=') === 0, 3000, 'stale gauge back to 0');
      assert.equal((await post(gw)).status, 200);
      // Each endpoint's failure is logged once (throttled), and so is its recovery, with how long it lasted.
      const byMsg = (msg: string) => lines().filter((l) => l.msg === msg).map((l) => l.endpoint).sort();
      assert.deepEqual(byMsg('metrics scrape failed'), ['a', 'b']);
      await until(() => byMsg('metrics scrape recovered').length === 2, 3000, 'both recoveries logged');
      assert.deepEqual(byMsg('metrics scrape recovered'), ['a', 'b']);
      for (const l of lines().filter((x) => x.msg === 'metrics scrape recovered')) assert.ok(Number(l.failingMs) > 0, JSON.stringify(l));
      const outcomes = await metricsText(gw);
      assert.ok((gauge(outcomes, 'llm_d_epp_flow_control_requests_total', 'outcome="EvictedTTL"') ?? 0) >= 1);
    } finally {
      await closeAll(gw, a, b);
    }
  });

  test('a server that refuses a request is read as stale at once: the next requests wait for it to come back, not 502', async () => {
    // A staleness threshold long enough that the server's last metrics would stay fresh all through the test.
    let refusedFirst = false;
    const serve = (req: http.IncomingMessage, res: http.ServerResponse) => {
      req.resume();
      req.on('end', () => {
        if (req.url === '/metrics') return void res.end(vllmPage());
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] }));
      });
    };
    let server = http.createServer(serve);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    const extra = `plugins:
- type: utilization-detector
  parameters: { metricsStalenessThreshold: 60s }
flowControl:
  defaultRequestTTL: 20s
`;
    const gw = await gatewayFor(fleetConfig([{ name: 'a', port }], extra));
    try {
      await waitForMetrics(gw);
      assert.equal((await post(gw)).status, 200);
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      // The request under way finds the server gone: its 502 is the connection failure's.
      const first = await post(gw);
      assert.equal(first.status, 502, first.text);
      refusedFirst = true;
      // The next one waits in the queue rather than being sent to a server known to refuse.
      const second = post(gw);
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="default-flow"') ?? 0) === 1, 3000, 'the next request waits');
      assert.equal(gauge(await metricsText(gw), 'llm_d_epp_flow_control_stale_endpoints', 'detector='), 1);
      const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { stale: boolean; connectFailure: string | null }[] };
      assert.equal(pool.endpoints[0]!.stale, true);
      assert.match(pool.endpoints[0]!.connectFailure ?? '', /could not connect: .*ECONNREFUSED/);
      // The server comes back: a scrape begun after the refusal reads it, and the request goes.
      server = http.createServer(serve);
      await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
      const r = await second;
      assert.equal(r.status, 200, r.text);
    } finally {
      assert.ok(refusedFirst);
      await gw.close();
      server.closeAllConnections();
      server.close();
    }
  });

  test('a /metrics that flaps between failing and good logs one failure and one recovery per 30 s, not one per flap', async () => {
    const a = await startFakeBackend();
    const { logger, lines } = captureLogger('info');
    const gw = await gatewayFor(fleetConfig([{ name: 'a', port: a.port }]), { logger });
    const errors = async () => gauge(await metricsText(gw), 'llm_d_epp_datalayer_poll_errors_total', 'endpoint_name="a"') ?? 0;
    const count = (msg: string) => lines().filter((l) => l.msg === msg && l.endpoint === 'a').length;
    try {
      await waitForMetrics(gw);
      for (let flap = 1; flap <= 3; flap++) {
        const before = await errors();
        a.metrics = 500;
        await until(async () => (await errors()) > before, 3000, `flap ${flap}: a failed scrape`);
        const at = gw.pool.endpoints[0]!.metricsAt;
        a.metrics = vllmPage();
        await until(() => gw.pool.endpoints[0]!.metricsAt > at, 3000, `flap ${flap}: a good scrape again`);
      }
      assert.equal(count('metrics scrape failed'), 1);
      assert.equal(count('metrics scrape recovered'), 1);
    } finally {
      await closeAll(gw, a);
    }
  });

  test('/debug/requests lists what is in flight, oldest first: the one held at the model server, then the queued one', async () => {
    const { backend, gw, release, first } = await oneSlotTaken({ firstHeaders: { 'x-request-id': 'held-1', 'x-llm-d-inference-fairness-id': 'tenant-a' } });
    try {
      const queued = post(gw, { 'x-request-id': 'queued-1' }, 'second');
      const snapshot = async () => (await (await request(`${gw.metricsUrl}/debug/requests`)).body.json()) as { total: number; requests: Record<string, unknown>[] };
      await until(async () => (await snapshot()).total === 2, 3000, 'both in flight');
      const { requests } = await snapshot();
      assert.deepEqual(
        requests.map((r) => [r.requestId, r.state, r.endpoint, r.fairnessId, r.attempts]),
        [
          ['held-1', 'waiting_first_byte', 'b', 'tenant-a', 1],
          ['queued-1', 'queued', null, 'default-flow', 0],
        ],
      );
      for (const r of requests) assert.ok(typeof r.ageMs === 'number' && r.ageMs >= 0 && Number(r.queuedMs) <= Number(r.ageMs), JSON.stringify(r));
      release();
      assert.equal((await first).status, 200);
      assert.equal((await queued).status, 200);
      await until(async () => (await snapshot()).total === 0, 3000, 'nothing in flight');
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('priority: high-priority requests queued after low-priority ones go first when capacity returns', async () => {
    const { backend, gw, release, first } = await oneSlotTaken({ top: 'objectives:\n- { name: high, priority: 10 }\n- { name: low, priority: 1 }\n' });
    try {
      const lows = [1, 2, 3].map((i) => post(gw, { 'x-llm-d-inference-objective': 'low' }, `low-${i}`));
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'priority="1"') ?? 0) === 3);
      // The GIE header name works as well.
      const highs = [1, 2].map((i) => post(gw, { 'x-gateway-inference-objective': 'high' }, `high-${i}`));
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'priority="10"') ?? 0) === 2);
      release();
      for (const r of await Promise.all([first, ...lows, ...highs])) assert.equal(r.status, 200);
      const order = backend.received.map((r) => JSON.parse(r.body).messages[0].content as string);
      assert.deepEqual(order, ['first', 'high-1', 'high-2', 'low-1', 'low-2', 'low-3']);
      assert.equal(backend.maxActive, 1, 'concurrency detector caps in-flight requests at 1');
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('slo-deadline ordering: queued requests go out earliest TTFT deadline first; no SLO last', async () => {
    const { backend, gw, release, first } = await oneSlotTaken({
      plugins: '- type: slo-deadline-ordering-policy\n',
      flowControl: '  defaultPriorityBand: { orderingPolicyRef: slo-deadline-ordering-policy }\n',
    });
    try {
      const queued: Promise<{ status: number }>[] = [];
      const sends: [Record<string, string>, string][] = [
        [{}, 'none'],
        [{ 'x-llm-d-slo-ttft-ms': '60000' }, 'slo-60s'],
        [{ 'x-slo-ttft-ms': '100' }, 'slo-100ms'], // the GIE's older name
        [{ 'x-llm-d-slo-ttft-ms': 'soon' }, 'invalid'],
        [{ 'x-llm-d-slo-ttft-ms': '5000' }, 'slo-5s'],
      ];
      for (const [headers, content] of sends) {
        queued.push(post(gw, headers, content));
        const n = queued.length;
        await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="default-flow"') ?? 0) === n);
      }
      release();
      for (const r of await Promise.all([first, ...queued])) assert.equal(r.status, 200);
      const order = backend.received.slice(1).map((r) => JSON.parse(r.body).messages[0].content as string);
      assert.deepEqual(order, ['slo-100ms', 'slo-5s', 'slo-60s', 'none', 'invalid']);
      for (const r of backend.received) {
        assert.equal(r.headers['x-llm-d-slo-ttft-ms'], undefined, 'stripped');
        assert.equal(r.headers['x-slo-ttft-ms'], undefined, 'stripped');
      }
    } finally {
      await closeAll(gw, backend);
    }
  });

  test("x-llm-d-inference-ttl: a client's shorter queue TTL ends its wait 429 rejected-ttl-expired; the others wait on; never forwarded", async () => {
    const { backend, gw, release, first } = await oneSlotTaken({ flowControl: '  defaultRequestTTL: 60s\n' });
    try {
      const hurried = post(gw, { 'x-llm-d-inference-ttl': '300ms' }, 'hurried');
      const patient = post(gw, { 'x-llm-d-inference-ttl': '2h' }, 'patient'); // cannot extend the 60 s
      const r = await hurried;
      assert.equal(r.status, 429);
      assert.equal(r.headers['x-llm-d-request-dropped-reason'], 'rejected-ttl-expired');
      const fc = (await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { totals: { requests: number } };
      assert.equal(fc.totals.requests, 1, 'the other one still waits');
      release();
      for (const done of await Promise.all([first, patient])) assert.equal(done.status, 200);
      assert.deepEqual(
        backend.received.map((q) => [JSON.parse(q.body).messages[0].content, q.headers['x-llm-d-inference-ttl']]),
        [
          ['first', undefined],
          ['patient', undefined],
        ],
      );
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('objective and fairness id in UTF-8 (as llm-d reads them): the objective matches its name, the flow keeps its text', async () => {
    const { gw, release, first, backend } = await oneSlotTaken({ top: 'objectives:\n- { name: "équipe-α", priority: 7 }\n' });
    try {
      // The bytes of the UTF-8 text on the wire (undici writes a header one byte per character).
      const wire = (text: string) => Buffer.from(text, 'utf8').toString('latin1');
      const queued = post(gw, { 'x-llm-d-inference-objective': wire('équipe-α'), 'x-llm-d-inference-fairness-id': wire('租户-1') });
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'priority="7"') ?? 0) === 1);
      const fc = (await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { bands: { priority: number; flows: { fairnessId: string }[] }[] };
      assert.deepEqual(fc.bands.find((b) => b.priority === 7)?.flows.map((f) => f.fairnessId), ['租户-1']);
      assert.match(await metricsText(gw), /llm_d_epp_flow_control_queue_size\{[^}]*fairness_id="租户-1"[^}]*priority="7"/);
      release();
      assert.equal((await queued).status, 200);
      await first;
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('round-robin fairness alternates between flows of one band', async () => {
    const { backend, gw, release, first } = await oneSlotTaken({
      plugins: '- type: round-robin-fairness-policy\n',
      flowControl: '  defaultPriorityBand: { fairnessPolicyRef: round-robin-fairness-policy }\n',
      firstHeaders: { 'x-llm-d-inference-fairness-id': 'z' },
    });
    try {
      const a = [1, 2, 3].map((i) => post(gw, { 'x-llm-d-inference-fairness-id': 'tenant-a' }, `a${i}`));
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="tenant-a"') ?? 0) === 3);
      const b = [1, 2, 3].map((i) => post(gw, { 'x-gateway-inference-fairness-id': 'tenant-b' }, `b${i}`)); // the GIE name
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="tenant-b"') ?? 0) === 3);
      release();
      for (const r of await Promise.all([first, ...a, ...b])) assert.equal(r.status, 200);
      const order = backend.received.slice(1).map((r) => JSON.parse(r.body).messages[0].content as string);
      assert.deepEqual(order, ['a1', 'b1', 'a2', 'b2', 'a3', 'b3']);
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('band capacity overflow → 429 rejected-saturated at once; a client that gives up is never sent upstream', async () => {
    const backend = await startFakeBackend();
    const extra = `plugins:
${DETECTOR}flowControl:
  defaultPriorityBand: { maxRequests: 1 }
`;
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], extra));
    try {
      await waitForMetrics(gw);
      backend.metrics = vllmPage(50);
      await until(() => gw.pool.endpoints[0]!.metrics?.waiting === 50);
      const ac = new AbortController();
      const queued = post(gw, {}, 'queued', ac.signal).catch((e: Error) => e);
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="default-flow"') ?? 0) === 1);
      const t0 = Date.now();
      const over = await post(gw, {}, 'over');
      assert.equal(over.status, 429);
      assert.equal(over.headers['x-llm-d-request-dropped-reason'], 'rejected-saturated');
      assert.ok(Date.now() - t0 < 1000, 'rejected at once, not after a TTL');
      assert.equal(over.headers['x-should-retry'], undefined, 'a full queue is what a retry is for');
      assert.equal(over.headers['retry-after'], '1', 'soon: LangChain retries no 429 without it');
      ac.abort();
      assert.ok((await queued) instanceof Error);
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_requests_total', 'outcome="EvictedContextCancelled"') ?? 0) === 1);
      backend.metrics = vllmPage(0);
      assert.equal((await post(gw, {}, 'after')).status, 200);
      assert.deepEqual(
        backend.received.map((r) => JSON.parse(r.body).messages[0].content),
        ['after'],
        'the cancelled request never reached the model server',
      );
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('a body larger than its band may ever hold: 429 saying so on an idle pool, and the openai client does not retry it', async () => {
    const backend = await startFakeBackend();
    const extra = `flowControl:
  priorityBands: [{ priority: 0, maxBytes: 500 }]
`;
    await withGateway(backend, fleetConfig([{ name: 'b', port: backend.port }], extra), async (gw) => {
      const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 2 });
      const err = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(800) }] }).catch((e: unknown) => e);
      assert.ok(err instanceof OpenAI.RateLimitError, String(err));
      assert.match(err.message, /request body is larger than its priority band's maxBytes .*a retry cannot help/);
      assert.equal(err.headers?.get('x-llm-d-request-dropped-reason'), 'rejected-saturated');
      assert.equal(err.headers?.get('retry-after'), null);
      assert.equal(gauge(await metricsText(gw), 'llm_d_epp_flow_control_requests_total', 'outcome="RejectedCapacity"'), 1, 'sent once: x-should-retry: false');
      assert.equal((await post(gw)).status, 200, 'a body that fits goes');
      assert.equal(backend.received.length, 1);
    });
  });

  test('empty pool → 503 rejected-no-endpoints after noEndpointRequestTTL', async () => {
    const gw = await gatewayFor(fleetConfig([], 'flowControl:\n  noEndpointRequestTTL: 200ms\n'));
    try {
      const r = await post(gw);
      assert.equal(r.status, 503);
      assert.equal(r.headers['x-llm-d-request-dropped-reason'], 'rejected-no-endpoints');
    } finally {
      await gw.close();
    }
  });

  test('flow control off: only sheddable requests are refused while saturated', async () => {
    const backend = await startFakeBackend();
    const extra = `featureGates: ["flowControl=false"]
objectives:
- { name: batch, priority: -1 }
`;
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], extra));
    try {
      await waitForMetrics(gw);
      backend.metrics = vllmPage(50);
      await until(() => gw.pool.endpoints[0]!.metrics?.waiting === 50);
      const shed = await post(gw, { 'x-llm-d-inference-objective': 'batch' });
      assert.equal(shed.status, 429);
      assert.equal(shed.headers['x-llm-d-request-dropped-reason'], 'rejected-saturated');
      assert.equal((await post(gw)).status, 200, 'non-sheddable traffic goes straight through');
      const fc = (await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { enabled: boolean };
      assert.equal(fc.enabled, false);
    } finally {
      await closeAll(gw, backend);
    }
  });

  test('/debug/flowcontrol shows bands, flows and ceilings', async () => {
    const backend = await startFakeBackend();
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], 'objectives:\n- { name: high, priority: 10 }\n'));
    try {
      await waitForMetrics(gw);
      backend.metrics = vllmPage(50);
      await until(() => gw.pool.endpoints[0]!.metrics?.waiting === 50);
      const ac = new AbortController();
      const queued = post(gw, { 'x-llm-d-inference-fairness-id': 'team-x' }, 'q', ac.signal).catch(() => undefined);
      await until(async () => (gauge(await metricsText(gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="team-x"') ?? 0) === 1);
      const dbg = (await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as {
        enabled: boolean;
        bands: { priority: number; requests: number; flows: { fairnessId: string; requests: number }[] }[];
      };
      assert.equal(dbg.enabled, true);
      assert.deepEqual(
        dbg.bands.map((b) => b.priority),
        [10, 0],
      );
      const band0 = dbg.bands.find((b) => b.priority === 0)!;
      assert.equal(band0.requests, 1);
      assert.equal(band0.flows[0]!.fairnessId, 'team-x');
      ac.abort();
      await queued;
    } finally {
      await closeAll(gw, backend);
    }
  });
});

describe('flow control releases a burst by what the server can take (the reckoned queue)', () => {
  /**
   * One backend that holds every request until released; scrapes far apart (5 s) so that between
   * the first scrape and the end of the test only Sluice's own dispatches and completions move the
   * reading.
   */
  async function setup(page: string, detectorParams = '') {
    const backend = await startFakeBackend();
    backend.metrics = page;
    const held: (() => void)[] = [];
    backend.behave = (r, res) => void held.push(() => okJson(r, res));
    const extra = `plugins:
- type: queue-scorer
- type: utilization-detector
  parameters: { queueDepthThreshold: 5, metricsStalenessThreshold: 30s${detectorParams} }
schedulingProfiles:
- name: default
  plugins: [ { pluginRef: queue-scorer } ]
`;
    const config = fleetConfig([{ name: 'only', port: backend.port }], extra).replace('interval: 20ms', 'interval: 5s');
    const gw = await gatewayFor(config);
    await waitForMetrics(gw);
    return { backend, held, gw };
  }

  const burst = (gw: Gateway, n: number) => Array.from({ length: n }, (_, i) => post(gw, {}, `burst ${i}`));

  test('a server seen full with 3 waiting takes 2 more, then one per request that finishes', async () => {
    const { backend, held, gw } = await setup(vllmPage(3, 8, 0.1)); // 8 slots learned from the queue
    try {
      const answers = burst(gw, 6);
      await until(() => backend.received.length === 2, 3000, 'two dispatched');
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(backend.received.length, 2, '3 + 2 = 5 waiting: the gate closed');
      held.shift()!(); // one finishes: a waiting request took its slot, so one more fits
      await until(() => backend.received.length === 3, 3000, 'one more after a completion');
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(backend.received.length, 3);
      backend.behave = okJson;
      for (const release of held.splice(0)) release();
      // The rest drain as their predecessors finish.
      const statuses = (await Promise.all(answers)).map((a) => a.status);
      assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200]);
    } finally {
      await closeAll(gw, backend);
    }
  });

  /** All six reach the backend before any is answered: nothing held them back. */
  async function expectWholeBurstAtOnce(page: string, detectorParams = ''): Promise<void> {
    const { backend, held, gw } = await setup(page, detectorParams);
    try {
      const answers = burst(gw, 6);
      await until(() => backend.received.length === 6, 3000, 'all six dispatched');
      for (const release of held.splice(0)) release();
      assert.deepEqual((await Promise.all(answers)).map((a) => a.status), [200, 200, 200, 200, 200, 200]);
    } finally {
      await closeAll(gw, backend);
    }
  }

  test('a server never seen with a queue takes the whole burst at once (its slot count is unknown)', () =>
    expectWholeBurstAtOnce(vllmPage(0, 2, 0.1)));

  test('countRecentDispatches: false releases the whole burst against the scraped queue (llm-d)', () =>
    expectWholeBurstAtOnce(vllmPage(3, 8, 0.1), ', countRecentDispatches: false'));
});

describe('flow control: affinity look-ahead, end to end', () => {
  /**
   * A and B each seen with 8 running and a queue (A 3, B 4), so each takes exactly as many more as
   * keeps its reckoned queue under 5; scrapes 5 s apart, so only Sluice's own dispatches and
   * completions move the reading. Every request is held until the test releases it.
   * Profile: prefix ×3, active-request ×1 (Sluice's own in-flight count), kv ×0.5 (A 0.0, B 0.2:
   * the very first request goes to A).
   */
  async function setup(lookahead: number) {
    const [a, b] = [await startFakeBackend(), await startFakeBackend()];
    a.metrics = vllmPage(3, 8, 0);
    b.metrics = vllmPage(4, 8, 0.2);
    const held = new Map<string, () => void>();
    for (const backend of [a, b]) {
      backend.behave = (r, res) => {
        const content = (JSON.parse(r.body) as { messages: { content: string }[] }).messages[0]!.content;
        held.set(content, () => {
          held.delete(content);
          okJson(r, res);
        });
      };
    }
    const releaseAll = () => [...held.values()].forEach((release) => release());
    const extra = `plugins:
- type: prefix-cache-scorer
- type: active-request-scorer
- type: kv-cache-utilization-scorer
- type: utilization-detector
  parameters: { queueDepthThreshold: 5, metricsStalenessThreshold: 30s }
schedulingProfiles:
- name: default
  plugins: [ { pluginRef: prefix-cache-scorer, weight: 3 }, { pluginRef: active-request-scorer, weight: 1 }, { pluginRef: kv-cache-utilization-scorer, weight: 0.5 } ]
flowControl:
  affinityLookahead: ${lookahead}
`;
    const config = fleetConfig([{ name: 'a', port: a.port }, { name: 'b', port: b.port }], extra).replace('interval: 20ms', 'interval: 5s');
    const gw = await gatewayFor(config);
    await waitForMetrics(gw);
    const contents = (backend: FakeBackend) => backend.received.map((r) => (JSON.parse(r.body) as { messages: { content: string }[] }).messages[0]!.content);
    // A failed step closes the gateway under the requests still open: their rejections are the
    // step's consequence, not the error to report.
    const send = (content: string) => {
      const answer = post(gw, {}, content);
      answer.catch(() => {});
      return answer;
    };
    const queued = async () => ((await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { totals: { requests: number } }).totals.requests;
    return { a, b, gw, held, releaseAll, contents, send, queued };
  }

  const P = (n: number) => `${'cached system prompt '.repeat(20)}${n}`;

  /**
   * Fills A with two requests of prompt P (A learns P; its queue reads 5) and B with one filler
   * (5), then queues P3 and, behind it, an unrelated Q; B finishes its filler and has room for one.
   */
  async function saturateThenFreeB(lookahead: number) {
    const s = await setup(lookahead);
    const answers = [s.send(P(1))];
    await until(() => s.a.received.length === 1, 3000, 'P1 on a');
    answers.push(s.send(P(2)));
    await until(() => s.a.received.length === 2, 3000, 'P2 on a (its prompt is cached there)');
    answers.push(s.send('filler'));
    await until(() => s.b.received.length === 1, 3000, 'filler on b (a is saturated)');
    answers.push(s.send(P(3)));
    await until(async () => (await s.queued()) === 1, 3000, 'P3 queued');
    answers.push(s.send('unrelated question'));
    await until(async () => (await s.queued()) === 2, 3000, 'Q queued behind P3');
    s.held.get('filler')!();
    await until(() => s.b.received.length === 2, 3000, 'b takes one request');
    return { ...s, answers };
  }

  test('the request whose favourite is saturated lets the next one take the free place, then goes to its favourite', async () => {
    const s = await saturateThenFreeB(8);
    try {
      assert.deepEqual(s.contents(s.b), ['filler', 'unrelated question'], 'Q overtook P3');
      assert.equal(await s.queued(), 1, 'P3 still waits');
      assert.match(await metricsText(s.gw), /^sluice_flow_control_affinity_overtakes_total 1$/m);
      s.held.get(P(1))!(); // a frees a place
      await until(() => s.a.received.length === 3, 3000, 'P3 on a');
      assert.deepEqual(s.contents(s.a), [P(1), P(2), P(3)]);
      s.releaseAll();
      assert.deepEqual((await Promise.all(s.answers)).map((x) => x.status), [200, 200, 200, 200, 200]);
    } finally {
      await closeAll(s.gw, s.a, s.b);
    }
  });

  test('affinityLookahead 0 keeps arrival order (llm-d): P3 takes the free place on b', async () => {
    const s = await saturateThenFreeB(0);
    try {
      assert.deepEqual(s.contents(s.b), ['filler', P(3)]);
      assert.match(await metricsText(s.gw), /^sluice_flow_control_affinity_overtakes_total 0$/m);
      await until(() => (s.releaseAll(), s.a.received.length + s.b.received.length === 5), 3000, 'all dispatched');
      s.releaseAll();
      assert.deepEqual((await Promise.all(s.answers)).map((x) => x.status), [200, 200, 200, 200, 200]);
    } finally {
      await closeAll(s.gw, s.a, s.b);
    }
  });
});

test('slow start: requests answered 2xx with every assumed slot outstanding grow it, failed ones do not', async () => {
  for (const status of [200, 500]) {
    // A server that fails (or answers) ten requests at once while its page says 0 running, 0 waiting.
    const held: { url: string; res: http.ServerResponse }[] = [];
    const backend = await startFakeBackend((r, res) => {
      held.push({ url: r.url, res });
      if (held.length < 10) return;
      for (const h of held.splice(0)) {
        if (status === 200) okJson({ ...r, url: h.url }, h.res);
        else h.res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom"}}');
      }
    });
    await withGateway(backend, fleetConfig([{ name: 'e0', port: backend.port }]), async (gw) => {
      const answers = await Promise.all(Array.from({ length: 10 }, () => post(gw)));
      assert.deepEqual([...new Set(answers.map((a) => a.status))], [status]);
      const slots = gw.pool.byName('e0')!.slowStartSlots();
      if (status === 200) assert.ok(slots > 8, `answered at 10 and 9 outstanding: ${slots}`);
      else assert.equal(slots, 8, 'a failure proves no slot');
    });
  }
});
