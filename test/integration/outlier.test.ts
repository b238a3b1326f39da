/**
 * Outlier detection against real servers: a model server whose engine is dead answers every request
 * at once with a 500 while its /metrics looks idle and healthy — the shortest queue in the pool.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { request } from 'undici';
import { alwaysDisaggProfiles, captureLogger, fleetConfig, nothingInFlight, waitForMetrics, withGateway, type FleetEndpoint } from '../helpers/fleet.js';
import { okJson, startFakeBackend, vllmPage, type Behaviour, type FakeBackend } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';
import type { Gateway } from '../../src/app.js';

const engineDead: Behaviour = (_r, res) => {
  res.writeHead(500, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message: 'EngineDeadError: the engine loop has stopped', type: 'InternalServerError', code: 500 } }));
};

/** Answers 200, begins the body, and cuts the connection. */
const breaksOff: Behaviour = (_r, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.write('{"id":"cmpl-1","object":');
  setImmediate(() => res.socket?.destroy());
};

/** The value of `name{endpoint_name="broken"...}` on the gateway's /metrics. */
async function brokenSample(gw: Gateway, name: string): Promise<number> {
  const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
  const m = new RegExp(`^${name}\\{endpoint_name="broken"[^}]*\\} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

/** Prefill/decode with the nixlv2 connector, every request disaggregated. */
const PD_PROFILES = alwaysDisaggProfiles('nixlv2');

/** Closes every server (withGateway's backend). */
const closeAll = (servers: FakeBackend[]) => ({ close: async () => void (await Promise.all(servers.map((s) => s.close()))) });

/** Sends `n` chat completions, `concurrency` at a time; returns the statuses (200 or the error's). */
async function send(gw: Gateway, n: number, concurrency: number): Promise<number[]> {
  const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
  const statuses: number[] = [];
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < n) {
      next++;
      try {
        await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
        statuses.push(200);
      } catch (err) {
        statuses.push((err as { status?: number }).status ?? -1);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return statuses;
}

async function fleet(): Promise<{ healthy: FakeBackend[]; broken: FakeBackend; all: FakeBackend[] }> {
  const healthy = [await startFakeBackend(okJson), await startFakeBackend(okJson)];
  // The healthy servers look a little busier than the dead one: every scorer prefers the dead one.
  for (const b of healthy) b.metrics = vllmPage(0, 2, 0.3);
  const broken = await startFakeBackend(engineDead);
  broken.metrics = vllmPage(0, 0, 0.0);
  return { healthy, broken, all: [...healthy, broken] };
}

/** Without the saturation filter, the profile itself does not drop endpoints it reads as stale. */
const NO_SATURATION_FILTER = `plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
schedulingProfiles:
  - name: default
    saturationFilter: false
    plugins: [{ pluginRef: queue-scorer }, { pluginRef: kv-cache-utilization-scorer }]
`;

/** A fleet config with `server.upstream.outlierDetection` set to `outlier` (YAML flow mapping). */
function outlierConfig(endpoints: FleetEndpoint[], outlier: string, extra = ''): string {
  return fleetConfig(endpoints, extra, `\n  upstream: { connectTimeout: 1s, retries: 2, outlierDetection: ${outlier} }`).replace('  upstream: { connectTimeout: 1s, retries: 2 }\n', '');
}

function configFor(b: { healthy: FakeBackend[]; broken: FakeBackend }, outlier: string, extra = ''): string {
  return outlierConfig(
    [
      { name: 'a', port: b.healthy[0]!.port },
      { name: 'b', port: b.healthy[1]!.port },
      { name: 'broken', port: b.broken.port },
    ],
    outlier,
    extra,
  );
}

describe('outlier detection (real servers)', () => {
  for (const [profile, extra] of [['the default profile', ''], ['a profile without the saturation filter', NO_SATURATION_FILTER]]) {
    test(`a server failing every request at once is ejected after 5 failures; the rest of the burst is served (${profile})`, async () => {
      const b = await fleet();
      const log = captureLogger();
      await withGateway(closeAll(b.all), configFor(b, '{}', extra), async (gw) => {
        const statuses = await send(gw, 60, 4);
        const failed = statuses.filter((s) => s !== 200);
        // Five in a row eject it; the requests of the other three clients already on their way there fail too.
        assert.ok(b.broken.received.length >= 5 && b.broken.received.length <= 8, `the dead server got ${b.broken.received.length} requests`);
        assert.deepEqual(failed, Array(b.broken.received.length).fill(500), 'its 500s are relayed, nothing else fails');
        assert.equal(await brokenSample(gw, 'sluice_endpoint_ejections_total'), 1);
        assert.equal(await brokenSample(gw, 'sluice_endpoint_ejected'), 1);
        const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as {
          endpoints: { name: string; stale: boolean; ejections: number; ejected: { reason: string; secondsLeft: number } | null }[];
        };
        const dead = pool.endpoints.find((e) => e.name === 'broken')!;
        assert.equal(dead.stale, false, 'its metrics are fresh: it is ejected, not stale');
        assert.match(dead.ejected?.reason ?? '', /^\d+ failed requests in a row, the last: http_5xx$/);
        assert.equal(dead.ejections, 1);
        assert.ok(dead.ejected!.secondsLeft > 0 && dead.ejected!.secondsLeft <= 5);
        const warned = log.lines().find((l) => l['msg']?.toString().startsWith('endpoint ejected'));
        assert.equal(warned?.['endpoint'], 'broken');
        assert.equal(warned?.['ejectedForMs'], 5000);
      }, { logger: log.logger });
    });
  }

  test('with outlier detection off the same server draws most of the burst (what the test above guards against)', async () => {
    const b = await fleet();
    await withGateway(closeAll(b.all), configFor(b, '{ consecutiveFailures: 0 }'), async (gw) => {
      const statuses = await send(gw, 60, 4);
      assert.ok(b.broken.received.length > 40, `the dead server got only ${b.broken.received.length} of 60`);
      assert.equal(statuses.filter((s) => s === 500).length, b.broken.received.length);
      assert.equal(await brokenSample(gw, 'sluice_endpoint_ejections_total'), 0);
    });
  });

  test('a server whose answers begin (200) and then break off is ejected too: a cut answer is no success', async () => {
    const b = await fleet();
    b.broken.behave = breaksOff;
    await withGateway(closeAll(b.all), configFor(b, '{ consecutiveFailures: 3 }'), async (gw) => {
      const statuses = await send(gw, 20, 1);
      assert.equal(b.broken.received.length, 3);
      assert.equal(statuses.filter((s) => s === 200).length, 17);
      assert.equal(await brokenSample(gw, 'sluice_endpoint_ejections_total'), 1);
    });
  });

  test('a server failing every request is logged once in full, then summed up: no warn line per request', async () => {
    const b = await fleet();
    b.broken.behave = breaksOff;
    // The healthy servers look busy, so the broken one gets every request (outlier detection off).
    for (const h of b.healthy) h.metrics = vllmPage(5, 8, 0.9);
    const log = captureLogger();
    let failed = 0;
    await withGateway(closeAll(b.all), configFor(b, '{ consecutiveFailures: 0 }'), async (gw) => {
      failed = (await send(gw, 12, 1)).filter((s) => s !== 200).length;
    }, { logger: log.logger });
    // (The gateway is closed now: its last window's sums are logged.)
    assert.equal(failed, b.broken.received.length);
    assert.ok(failed >= 10, `only ${failed} requests reached the broken server`);
    const lines = log.lines();
    const full = lines.filter((l) => l['msg'] === 'upstream failed mid-response');
    assert.deepEqual(full.map((l) => l['endpoint']), ['broken'], 'one line in full');
    assert.equal(typeof full[0]!['requestId'], 'string');
    const sum = lines.find((l) => String(l['msg']).startsWith('requests failed at model servers in the last window'));
    assert.deepEqual(sum?.['failures'], { 'broken: upstream failed mid-response': failed - 1 }, 'the rest summed up (at shutdown here)');
  });

  test('back after its ejection, one more failure ejects it again for twice as long; once it answers, it serves again', async () => {
    const b = await fleet();
    const log = captureLogger();
    await withGateway(closeAll(b.all), configFor(b, '{ consecutiveFailures: 2, baseEjectionTime: 300ms }'), async (gw) => {
      await send(gw, 10, 1);
      assert.equal(b.broken.received.length, 2);
      // Keep traffic going until the ejection runs out and it fails one more (the half-open probe).
      await until(async () => (await send(gw, 2, 1), b.broken.received.length === 3), 5000, 'a probe request after the ejection');
      assert.equal(await brokenSample(gw, 'sluice_endpoint_ejections_total'), 2);
      const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { name: string; probation: boolean }[] };
      assert.equal(pool.endpoints.find((e) => e.name === 'broken')?.probation, true, 'ejected twice, no success since');
      const ejected = log.lines().filter((l) => l['msg']?.toString().startsWith('endpoint ejected'));
      assert.deepEqual(ejected.map((l) => l['ejectedForMs']), [300, 600]);
      assert.ok(log.lines().some((l) => l['endpoint'] === 'broken' && l['msg']?.toString().startsWith('endpoint back from ejection')));
      // The engine is restarted: the next request it gets after the ejection is answered, and it stays in.
      b.broken.behave = okJson;
      await until(async () => (await send(gw, 2, 1), b.broken.received.length >= 5), 5000, 'the repaired server serving again');
      assert.equal(await brokenSample(gw, 'sluice_endpoint_ejected'), 0);
      assert.equal(gw.pool.byName('broken')?.failureStreak, 0);
    }, { logger: log.logger });
  });

  /** A hung engine: requests never answered; its page, served by a process that still works, frozen with one running. */
  async function hungFleet(): Promise<{ healthy: FakeBackend[]; broken: FakeBackend; all: FakeBackend[] }> {
    const b = await fleet();
    b.broken.behave = () => undefined;
    b.broken.metrics = `${vllmPage(0, 1, 0.0)}vllm:generation_tokens_total 1000\n`;
    return b;
  }

  test('a hung engine (requests running, token counters frozen) is set aside after stallTimeout, and back once they move', async () => {
    const b = await hungFleet();
    const log = captureLogger();
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 300ms }'), async (gw) => {
      await until(() => gw.pool.byName('broken')?.stalledFor !== undefined, 5000, 'the stall noticed');
      const statuses = await send(gw, 20, 2);
      assert.deepEqual(statuses, Array(20).fill(200));
      assert.equal(b.broken.received.length, 0, 'no request went to the hung server');
      assert.equal(await brokenSample(gw, 'sluice_endpoint_ejected'), 1);
      const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { name: string; stalled: string | null }[] };
      const hung = pool.endpoints.find((e) => e.name === 'broken')!;
      assert.match(hung.stalled ?? "", /^1 running, and its metrics page unchanged for \d+ms$/);
      const warned = log.lines().find((l) => l['msg']?.toString().startsWith('endpoint stalled'));
      assert.equal(warned?.['endpoint'], 'broken');
      // The engine computes again (and answers).
      b.broken.behave = okJson;
      b.broken.metrics = `${vllmPage(0, 1, 0.0)}vllm:generation_tokens_total 1001\n`;
      await until(() => gw.pool.byName('broken')?.stalledFor === undefined, 5000, 'progress noticed');
      await send(gw, 10, 1);
      assert.ok(b.broken.received.length > 0, 'it serves again');
      assert.ok(log.lines().some((l) => l['endpoint'] === 'broken' && l['msg']?.toString().startsWith('endpoint no longer stalled')));
    }, { logger: log.logger });
  });

  test('a hung engine whose page froze idle is set aside once requests to it go unanswered for stallTimeout', async () => {
    const b = await fleet();
    b.broken.behave = () => undefined;
    b.broken.metrics = `${vllmPage(0, 0, 0.0)}vllm:generation_tokens_total 1000\n`;
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 300ms }'), async (gw) => {
      // It looks the idlest: the first requests go there and hang (until the gateway closes).
      const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
      const hanging = [0, 1].map(() =>
        request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }).then(
          (r) => r.body.text(),
          () => undefined,
        ),
      );
      await until(() => gw.pool.byName('broken')?.stalledFor !== undefined, 5000, 'the stall noticed');
      assert.match(gw.pool.byName('broken')!.stalledFor!, /^requests sent and not answered, and its metrics page unchanged for \d+ms$/);
      const before = b.broken.received.length;
      assert.ok(before >= 1);
      assert.deepEqual(await send(gw, 10, 2), Array(10).fill(200));
      assert.equal(b.broken.received.length, before, 'no new request went to the hung server');
      void hanging;
    });
  });

  test('a prefill leg whose 5xx answer then breaks off is one failure, not two', async () => {
    const cut500: Behaviour = (_r, res) => {
      res.writeHead(500, { 'content-type': 'application/json', 'content-length': '1000' });
      res.write('{"error":');
      setTimeout(() => res.socket?.destroy(), 20);
    };
    const prefill = [await startFakeBackend(cut500)];
    const decode = [await startFakeBackend(okJson)];
    const endpoints = [
      { name: 'prefill-0', port: prefill[0]!.port, labels: { 'llm-d.ai/role': 'prefill' } },
      { name: 'decode-0', port: decode[0]!.port, labels: { 'llm-d.ai/role': 'decode' } },
    ];
    await withGateway(closeAll([...prefill, ...decode]), outlierConfig(endpoints, '{ consecutiveFailures: 50 }', PD_PROFILES), async (gw) => {
      assert.deepEqual(await send(gw, 1, 1), [200], 'served decode-only');
      await until(() => gw.pool.endpoints.every((e) => e.inFlight === 0), 3000, 'released');
      assert.equal(gw.pool.byName('prefill-0')!.failureStreak, 1);
    });
  });

  test('sidecar P/D: an idle prefill endpoint is not stalled while the decode server generates a non-streamed answer', async () => {
    // The sidecar ran the prefill leg long ago, out of Sluice's sight: the prefill server is idle, its page rightly unchanged.
    const prefill = await startFakeBackend(okJson);
    prefill.metrics = `${vllmPage(0, 0, 0.0)}vllm:generation_tokens_total 1000\n`;
    // The decode server answers a non-streamed request when it is whole: 1.5 s of decoding, its page moving.
    const decode = await startFakeBackend((r, res) => void setTimeout(() => okJson(r, res), 1500));
    let tokens = 0;
    const tick = setInterval(() => (decode.metrics = `${vllmPage(0, 1, 0.1)}vllm:generation_tokens_total ${++tokens}\n`), 20);
    const endpoints = [
      { name: 'prefill-0', port: prefill.port, labels: { 'llm-d.ai/role': 'prefill' } },
      { name: 'decode-0', port: decode.port, labels: { 'llm-d.ai/role': 'decode' } },
    ];
    const log = captureLogger();
    try {
      await withGateway(closeAll([prefill, decode]), outlierConfig(endpoints, '{ stallTimeout: 300ms }', alwaysDisaggProfiles('sidecar')), async (gw) => {
        assert.deepEqual(await send(gw, 1, 1), [200]);
        assert.equal(prefill.received.length, 0, 'the sidecar ran the prefill leg (the gateway sends none)');
        assert.deepEqual(log.lines().filter((l) => l['msg']?.toString().startsWith('endpoint stalled')).map((l) => l['endpoint']), []);
      }, { logger: log.logger });
    } finally {
      clearInterval(tick);
    }
  });

  test('with stallTimeout 0 the hung engine keeps drawing requests (what the test above guards against)', async () => {
    const b = await hungFleet();
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 0s }'), async (gw) => {
      await new Promise((r) => setTimeout(r, 500));
      const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0, timeout: 300 });
      const settled = await Promise.allSettled(Array.from({ length: 4 }, () => client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })));
      assert.ok(b.broken.received.length >= 1, 'the hung server got none');
      assert.equal(settled.filter((r) => r.status === 'rejected').length, b.broken.received.length, 'each request it got hung');
    });
  });

  test('a pool whose every endpoint is ejected (maxEjectionPercent 100) still serves: once the server is healthy, its next request is answered at once', async () => {
    const only = await startFakeBackend(engineDead);
    const config = outlierConfig([{ name: 'only', port: only.port }], '{ consecutiveFailures: 3, baseEjectionTime: 1m, maxEjectionPercent: 100 }');
    await withGateway(only, config, async (gw) => {
      const gwOnly = gw.pool.byName('only')!;
      assert.deepEqual(await send(gw, 3, 1), [500, 500, 500]);
      assert.ok(gwOnly.ejectedUntil > Date.now(), 'ejected');
      only.behave = okJson;
      // Read over the endpoints that may take requests (all of them here), the gate stays open: the
      // ejected server is not read as saturated for the minute of its ejection.
      const started = Date.now();
      assert.deepEqual(await send(gw, 2, 1), [200, 200]);
      assert.ok(Date.now() - started < 3000, `answered after ${Date.now() - started} ms`);
      assert.equal(gwOnly.failureStreak, 0);
    });
  });

  test('P/D: a prefill tier that fails every leg and is all ejected does not hold the decode-only fallback back', async () => {
    const prefill = [await startFakeBackend(engineDead), await startFakeBackend(engineDead)];
    const decode = [await startFakeBackend(okJson), await startFakeBackend(okJson)];
    const all = [...prefill, ...decode];
    const endpoints = [
      ...prefill.map((b, i) => ({ name: `prefill-${i}`, port: b.port, labels: { 'llm-d.ai/role': 'prefill' } })),
      ...decode.map((b, i) => ({ name: `decode-${i}`, port: b.port, labels: { 'llm-d.ai/role': 'decode' } })),
    ];
    const config = outlierConfig(endpoints, '{ consecutiveFailures: 2, baseEjectionTime: 1m, maxEjectionPercent: 100 }', PD_PROFILES);
    await withGateway(closeAll(all), config, async (gw) => {
      for (let i = 0; i < 8; i++) {
        const started = Date.now();
        assert.deepEqual(await send(gw, 1, 1), [200], `request ${i}`);
        assert.ok(Date.now() - started < 3000, `request ${i} answered after ${Date.now() - started} ms`);
      }
      assert.ok(prefill.every((_, i) => gw.pool.byName(`prefill-${i}`)!.ejections >= 1), 'both prefill endpoints were ejected');
      assert.equal(decode.reduce((n, b) => n + b.received.length, 0), 8, 'every request served decode-only');
    });
  });

  test('a client that leaves after a 2xx status line neither clears the run of failures nor counts one', async () => {
    const only = await startFakeBackend(engineDead);
    await withGateway(only, fleetConfig([{ name: 'only', port: only.port }]), async (gw) => {
      assert.deepEqual(await send(gw, 3, 1), [500, 500, 500]);
      only.behave = (_r, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
      };
      const ac = new AbortController();
      const r = await request(`${gw.apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
        signal: ac.signal,
      });
      assert.equal(r.statusCode, 200);
      ac.abort();
      await r.body.text().catch(() => undefined);
      await until(() => gw.pool.byName('only')!.inFlight === 0, 5000, 'the request released');
      assert.equal(gw.pool.byName('only')!.failureStreak, 3);
    });
  });
});

/**
 * POSTs a chat completion (streamed or not) with undici; resolves with the status and the whole body.
 * Gives up after `timeoutMs` (a request left with a hung server fails the test rather than hang it).
 */
async function chat(gw: Gateway, stream = false, timeoutMs = 10_000): Promise<{ status: number; text: string; headers: Record<string, unknown> }> {
  const signal = AbortSignal.timeout(timeoutMs);
  const r = await request(`${gw.apiUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: 'hi' }] }),
    signal,
  });
  return { status: r.statusCode, text: await r.body.text(), headers: r.headers };
}

describe('requests in flight on a stuck server (outlierDetection.rescueInFlight)', () => {
  /** A fleet whose idlest-looking server takes requests and never answers, its page frozen idle. */
  async function stuckFleet(): Promise<{ healthy: FakeBackend[]; broken: FakeBackend; all: FakeBackend[] }> {
    const b = await fleet();
    b.broken.behave = () => undefined;
    b.broken.metrics = `${vllmPage(0, 0, 0.0)}vllm:generation_tokens_total 1000\n`;
    return b;
  }

  test('a request held by a hung engine is sent to another server once the engine reads as stalled; the stall holds a while after', async () => {
    const b = await stuckFleet();
    const log = captureLogger();
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 1s }'), async (gw) => {
      await waitForMetrics(gw);
      // The first request goes to the idlest-looking server, which hangs.
      const first = chat(gw);
      await until(() => b.broken.received.length === 1, 3000, 'the hung server got the request');
      const r = await first;
      assert.equal(r.status, 200, r.text);
      assert.equal(b.healthy[0]!.received.length + b.healthy[1]!.received.length, 1, 'answered by a healthy server');
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(text, /^sluice_endpoint_upstream_errors_total\{endpoint_name="broken",error="abandoned"[^}]*\} 1$/m);
      assert.match(text, /^llm_d_epp_upstream_retries_total\{endpoint_name="broken"[^}]*\} 1$/m);
      const warned = log.lines().find((l) => l['msg']?.toString().startsWith('model server stuck'));
      assert.equal(warned?.['endpoint'], 'broken');
      assert.match(String(warned?.['err']), /^stalled \(requests sent and not answered, and its metrics page unchanged for [\d.]+m?s\)$/);
      // It owes nothing now (its request went elsewhere), yet stays set aside for one more
      // stallTimeout (or until its page moves): the next requests do not wait as long again.
      assert.notEqual(gw.pool.byName('broken')!.stalledFor, undefined, 'still stalled');
      assert.deepEqual(await send(gw, 6, 2), Array(6).fill(200));
      assert.equal(b.broken.received.length, 1, 'no new request went to it');
      // Its engine works again: the stall ends.
      b.broken.behave = okJson;
      b.broken.metrics = `${vllmPage(0, 0, 0.0)}vllm:generation_tokens_total 1001\n`;
      await until(() => gw.pool.byName('broken')!.stalledFor === undefined, 3000, 'the stall ended');
      await nothingInFlight(gw);
    }, { logger: log.logger });
  });

  test('with rescueInFlight false the request stays with the hung engine (what the test above guards against)', async () => {
    const b = await stuckFleet();
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 300ms, rescueInFlight: false }'), async (gw) => {
      await waitForMetrics(gw);
      const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0, timeout: 1500 });
      await assert.rejects(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }), /timed out/i);
      assert.equal(b.broken.received.length, 1);
      assert.notEqual(gw.pool.byName('broken')!.stalledFor, undefined, 'it was read as stalled');
    });
  });

  test('a stream whose status line went out is ended with a 504 error event, not held until upstream.bodyTimeout', async () => {
    const b = await stuckFleet();
    b.broken.behave = (_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
    };
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 300ms }'), async (gw) => {
      await waitForMetrics(gw);
      const r = await chat(gw, true);
      assert.equal(r.status, 200);
      assert.equal(b.broken.received.length, 1);
      assert.match(r.text, /^data: \{"error":\{"message":"upstream broken stopped answering: stalled \([^"]*\)","type":"[^"]+","param":null,"code":504\}\}\n\n/);
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(text, /^sluice_endpoint_upstream_errors_total\{endpoint_name="broken",error="abandoned"[^}]*\} 1$/m);
    });
  });

  test('a non-streamed request whose status line came and no body is sent to another server (nothing of it reached the client)', async () => {
    const b = await stuckFleet();
    b.broken.behave = (_r, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
    };
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 300ms }'), async (gw) => {
      await waitForMetrics(gw);
      const r = await chat(gw);
      assert.equal(r.status, 200, r.text);
      assert.equal(JSON.parse(r.text).object, 'chat.completion');
      assert.equal(b.broken.received.length, 1);
      assert.equal(b.healthy[0]!.received.length + b.healthy[1]!.received.length, 1, 'answered by a healthy server');
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(text, /^sluice_endpoint_upstream_errors_total\{endpoint_name="broken",error="abandoned"[^}]*\} 1$/m);
      await nothingInFlight(gw);
    });
  });

  test('a request held by a server that went silent (its scrapes get no answer for the silence window, 5 s) is sent to another server', async () => {
    const b = await stuckFleet();
    await withGateway(closeAll(b.all), configFor(b, '{ stallTimeout: 0s }'), async (gw) => {
      await waitForMetrics(gw);
      const started = Date.now();
      const first = chat(gw, false, 20_000);
      await until(() => b.broken.received.length === 1, 3000, 'the silent-to-be server got the request');
      // Cut off from the gateway: its scrapes get no answer from now on (an HTTP error would be one).
      b.broken.metricsSilent = true;
      const r = await first;
      assert.equal(r.status, 200, r.text);
      const took = Date.now() - started;
      assert.ok(took >= 4500 && took < 20_000, `rescued after ${took} ms`);
      const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { name: string; unansweredSeconds: number | null }[] };
      assert.ok((pool.endpoints.find((e) => e.name === 'broken')!.unansweredSeconds ?? 0) >= 5, 'shown in /debug/pool');
      assert.equal(pool.endpoints.find((e) => e.name === 'a')!.unansweredSeconds, null);
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(text, /^sluice_endpoint_upstream_errors_total\{endpoint_name="broken",error="abandoned"[^}]*\} 1$/m);
    });
  });

  test('with no other server to go to, the client gets a 504 that names the stall', async () => {
    const only = await startFakeBackend(() => undefined);
    only.metrics = `${vllmPage(0, 0, 0.0)}vllm:generation_tokens_total 1000\n`;
    await withGateway(only, outlierConfig([{ name: 'only', port: only.port }], '{ stallTimeout: 300ms }'), async (gw) => {
      await waitForMetrics(gw);
      const r = await chat(gw);
      assert.equal(r.status, 504, r.text);
      assert.equal(r.headers['x-should-retry'], 'false', 'it may have run');
      assert.match(JSON.parse(r.text).error.message, /^upstream stopped answering and no other endpoint is eligible: only: stalled \(requests sent and not answered, and its metrics page unchanged for \d+ms\)$/);
      await nothingInFlight(gw);
    });
  });

  test('P/D: a prefill leg held by a hung prefill server is given up on, and the request served decode-only', async () => {
    const prefill = await startFakeBackend(() => undefined);
    prefill.metrics = `${vllmPage(0, 0, 0.0)}vllm:generation_tokens_total 1000\n`;
    const decode = await startFakeBackend(okJson);
    const endpoints = [
      { name: 'prefill-0', port: prefill.port, labels: { 'llm-d.ai/role': 'prefill' } },
      { name: 'decode-0', port: decode.port, labels: { 'llm-d.ai/role': 'decode' } },
    ];
    const log = captureLogger();
    await withGateway(closeAll([prefill, decode]), outlierConfig(endpoints, '{ stallTimeout: 300ms }', PD_PROFILES), async (gw) => {
      await waitForMetrics(gw);
      const r = await chat(gw);
      assert.equal(r.status, 200, r.text);
      assert.equal(prefill.received.length, 1);
      assert.equal(decode.received.length, 1);
      const degraded = log.lines().find((l) => l['msg'] === 'P/D degraded');
      assert.match(String(degraded?.['reason']), /stalled \(requests sent and not answered/);
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(text, /^sluice_endpoint_upstream_errors_total\{endpoint_name="prefill-0",error="abandoned"[^}]*\} 1$/m);
      await nothingInFlight(gw);
    }, { logger: log.logger });
  });

  test('sidecar P/D: a decode server generating a non-streamed answer is left alone when its prefill server goes silent after the leg', async () => {
    // The sidecar ran the prefill leg at once, out of Sluice's sight; then the prefill server froze.
    const prefill = await startFakeBackend(okJson);
    // Decoding takes longer than the silence window (5 s): the answer's first byte comes when it is whole.
    const decode = await startFakeBackend((r, res) => void setTimeout(() => okJson(r, res), 8000));
    const endpoints = [
      { name: 'prefill-0', port: prefill.port, labels: { 'llm-d.ai/role': 'prefill' } },
      { name: 'decode-0', port: decode.port, labels: { 'llm-d.ai/role': 'decode' } },
    ];
    await withGateway(closeAll([prefill, decode]), outlierConfig(endpoints, '{}', alwaysDisaggProfiles('sidecar')), async (gw) => {
      await waitForMetrics(gw);
      const pending = chat(gw, false, 20_000);
      await until(() => decode.received.length === 1, 3000, 'the decode request sent');
      assert.notEqual(decode.received[0]!.headers['x-prefiller-host-port'], undefined);
      prefill.metricsSilent = true;
      const r = await pending;
      assert.equal(r.status, 200, r.text);
      assert.equal(decode.received.length, 1, 'not sent again');
      const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { name: string; unansweredSeconds: number | null }[] };
      assert.ok((pool.endpoints.find((e) => e.name === 'prefill-0')!.unansweredSeconds ?? 0) >= 5, 'the prefill server read as silent meanwhile');
      const text = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.doesNotMatch(text, /^sluice_endpoint_upstream_errors_total\{[^}]*error="abandoned"[^}]*\} [1-9]/m);
      await nothingInFlight(gw);
    });
  });
});

