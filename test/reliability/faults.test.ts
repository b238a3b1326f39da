/**
 * Model servers that misbehave: lying, hanging, huge or broken /metrics pages, resets before the
 * headers, an endpoint that flaps. The gateway keeps serving through the healthy endpoints, counts
 * what went wrong, and its in-flight counters and queue return to exactly zero.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import { fleetConfig, gatewayFor } from '../helpers/fleet.js';
import { okJson, startFakeBackend, vllmPage, type FakeBackend } from '../helpers/fake-backend.js';

async function hangingMetricsServer(): Promise<{ port: number; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    if (req.url === '/metrics') return; // never answers
    okJson({ method: 'POST', url: req.url ?? '', headers: req.headers, body: '' }, res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

test('healthy endpoints keep serving while the others lie, hang, flood, break or flap', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (r: unknown) => unhandled.push(r);
  process.on('unhandledRejection', onUnhandled);

  const healthy = await startFakeBackend();
  const liar = await startFakeBackend();
  liar.metrics = 'vllm:num_requests_waiting -3\nvllm:num_requests_running NaN\nvllm:kv_cache_usage_perc 0.1\n';
  const garbage = await startFakeBackend();
  garbage.metrics = '<html>oops</html>';
  const huge = await startFakeBackend();
  huge.metrics = vllmPage() + `# ${'x'.repeat(10 * 1024 * 1024)}\n`;
  const erroring = await startFakeBackend();
  erroring.metrics = 500;
  const resetter = await startFakeBackend((_r, res) => res.socket?.destroy()); // good metrics, resets every request
  const flapper = await startFakeBackend();
  const hanging = await hangingMetricsServer();
  const backends: FakeBackend[] = [healthy, liar, garbage, huge, erroring, resetter, flapper];

  const gw = await gatewayFor(
    fleetConfig(
      [
        { name: 'healthy', port: healthy.port },
        { name: 'liar', port: liar.port },
        { name: 'garbage', port: garbage.port },
        { name: 'huge', port: huge.port },
        { name: 'erroring', port: erroring.port },
        { name: 'resetter', port: resetter.port },
        { name: 'flapper', port: flapper.port },
        { name: 'hanging', port: hanging.port },
      ],
      'plugins:\n- type: utilization-detector\n  parameters: { metricsStalenessThreshold: 300ms }\n',
    ).replace('timeout: 500ms', 'timeout: 200ms'),
  );
  let flapping = true;
  const flap = (async () => {
    for (let i = 0; flapping; i++) {
      flapper.metrics = i % 2 === 0 ? 503 : vllmPage();
      await new Promise((r) => setTimeout(r, 40));
    }
  })();
  try {
    const until = Date.now() + 5000;
    const ready = () =>
      gw.pool.byName('healthy')!.metricsAt > 0 &&
      gw.pool.byName('resetter')!.metricsAt > 0 &&
      ['liar', 'garbage', 'huge', 'erroring', 'hanging'].every((n) => gw.pool.byName(n)!.lastError !== undefined);
    while (Date.now() < until && !ready()) {
      await new Promise((r) => setTimeout(r, 10));
    }
    const statuses = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        request(`${gw.apiUrl}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `q${i}` }] }),
        }).then(async (r) => {
          await r.body.dump();
          return r.statusCode;
        }),
      ),
    );
    assert.deepEqual([...new Set(statuses)], [200], 'every request served');
    assert.ok(healthy.received.length >= 1);
    for (const b of [liar, garbage, huge, erroring]) assert.equal(b.received.length, 0, 'endpoints with unusable metrics get no traffic');

    const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as {
      endpoints: { name: string; stale: boolean; lastScrapeError: string | null }[];
    };
    const byName = new Map(pool.endpoints.map((e) => [e.name, e]));
    for (const name of ['liar', 'garbage', 'huge', 'erroring', 'hanging']) {
      assert.equal(byName.get(name)?.stale, true, `${name} is stale`);
      assert.ok(byName.get(name)?.lastScrapeError, `${name} has its scrape error recorded`);
    }
    assert.match(String(byName.get('liar')?.lastScrapeError), /invalid value -3/);
    assert.match(String(byName.get('hanging')?.lastScrapeError), /timed out/);

    const m = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
    for (const name of ['liar', 'garbage', 'huge', 'erroring', 'hanging']) {
      assert.match(m, new RegExp(`llm_d_epp_datalayer_poll_errors_total\\{endpoint_name="${name}"\\} [1-9]`));
    }
    if (resetter.received.length > 0) assert.match(m, /llm_d_epp_upstream_retries_total\{endpoint_name="resetter"\} [1-9]/);
    for (const ep of gw.pool.endpoints) assert.deepEqual([ep.inFlight, ep.inFlightTokens], [0, 0], `${ep.name} in flight (requests, prompt tokens)`);
    assert.match(m, /llm_d_epp_request_running\{model_name="m"\} 0/);
    assert.deepEqual(unhandled, []);
  } finally {
    flapping = false;
    await flap;
    process.off('unhandledRejection', onUnhandled);
    await gw.close();
    await Promise.all([...backends.map((b) => b.close()), hanging.close()]);
  }
});
