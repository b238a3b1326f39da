/**
 * SPEC §9 against a running gateway: P/D over stage-labelled simulators, an endpoint whose scrapes
 * fail and whose connections reset, objectives and a held queue, so that every SPEC metric has
 * series. Each must have the SPEC's type and exactly its label set: an llm-d dashboard or alert
 * that selects by them keeps working.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import { startSimulator } from '../../src/sim/server.js';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { startFakeBackend } from '../helpers/fake-backend.js';
import { fleetConfig, gatewayFor, waitForMetrics, withGateway } from '../helpers/fleet.js';
import { SPEC_METRICS } from '../helpers/spec-metrics.js';
import { until } from '../helpers/wait.js';

interface Sample {
  name: string;
  labels: Record<string, string>;
}

function parseExposition(text: string): { types: Map<string, string>; samples: Sample[] } {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) types.set(type[1]!, type[2]!);
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$/.exec(line);
    assert.ok(m, `unparsable line ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    samples.push({ name: m[1]!, labels });
  }
  return { types, samples };
}

test('every SPEC §9 metric has series of the SPEC type with exactly the SPEC labels', async () => {
  const roles = ['prefill', 'decode', 'both', undefined];
  const sims = await Promise.all(roles.map((_, i) => startSimulator({ name: `s${i}`, ttftOverheadMs: 1, itlMs: 1, prefillMsPerToken: 0 })));
  // Every other scrape fails (poll errors); every request's connection is reset (a retry elsewhere).
  let scrapes = 0;
  const flaky = createServer((req, res) => {
    if (req.url !== '/metrics') return req.socket.destroy();
    if (++scrapes % 2 === 0) return res.writeHead(500).end();
    res.writeHead(200, { 'content-type': 'text/plain' }).end('vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n');
  });
  await new Promise<void>((r) => flaky.listen(0, '127.0.0.1', () => r()));
  const endpoints = sims.map((s, i) => ({ name: s.name, port: s.port, labels: roles[i] ? { 'llm-d.ai/role': roles[i]! } : undefined }));
  endpoints.push({ name: 'flaky', port: (flaky.address() as AddressInfo).port, labels: { 'llm-d.ai/role': 'decode' } });
  const gw = await gatewayFor(
    fleetConfig(
      endpoints,
      `objectives:
- { name: hi, priority: 10 }
plugins:
- type: decode-filter
- type: prefill-filter
- type: queue-scorer
- type: prefix-cache-scorer
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters: { deciders: { prefill: always-disagg-pd-decider }, connector: nixlv2 }
schedulingProfiles:
- name: decode
  plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer }, { pluginRef: prefix-cache-scorer } ]
- name: prefill
  plugins: [ { pluginRef: prefill-filter }, { pluginRef: queue-scorer } ]
`,
    ),
  );
  const post = async (content: string, stream: boolean, headers: Record<string, string> = {}, model = 'sim-model') => {
    const body = { model, messages: [{ role: 'user', content }], ...(stream ? { stream, stream_options: { include_usage: true } } : {}) };
    const r = await request(`${gw.apiUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
    await r.body.text();
    return r.statusCode;
  };
  const headers = { 'x-llm-d-inference-objective': 'hi', 'x-llm-d-inference-fairness-id': 'tenant-a' };
  let held: Promise<number>[] = [];
  try {
    await waitForMetrics(gw);
    for (let i = 0; i < 8; i++) {
      await post(`hello ${i} `.repeat(50), true, headers);
      await post('x', false);
    }
    assert.equal(await post('x', false, {}, 'no-such-model'), 404, 'an error answer (the simulator serves one model)');
    // Saturated: every simulator reports 50 waiting, so two more requests stay in the queue.
    for (const s of sims) await (await request(`${s.url}/admin/config`, { method: 'POST', body: JSON.stringify({ pin: { waiting: 50 } }) })).body.text();
    await until(() => sims.every((s) => gw.pool.byName(s.name)?.metrics?.waiting === 50), 3000, 'the pinned queues scraped');
    held = [0, 1].map(() => post('q', false, headers));
    await until(async () => /llm_d_epp_flow_control_queue_size\{[^}]*\} 2/.test(await (await request(`${gw.metricsUrl}/metrics`)).body.text()), 3000, 'two requests queued');

    const { types, samples } = parseExposition(await (await request(`${gw.metricsUrl}/metrics`)).body.text());
    const problems: string[] = [];
    for (const [name, type, labels] of SPEC_METRICS) {
      if (types.get(name) !== type) problems.push(`${name}: TYPE ${types.get(name)}, SPEC ${type}`);
      const own = samples.filter((s) => s.name === name || s.name === `${name}_bucket` || s.name === `${name}_sum` || s.name === `${name}_count`);
      if (own.length === 0) problems.push(`${name}: no series`);
      for (const s of own) {
        const keys = Object.keys(s.labels).filter((k) => k !== 'le').sort();
        if (keys.join() !== [...labels].sort().join()) problems.push(`${s.name}: labels ${keys.join()}, SPEC ${[...labels].sort().join()}`);
      }
    }
    assert.deepEqual(problems, []);
  } finally {
    for (const s of sims) await (await request(`${s.url}/admin/config`, { method: 'POST', body: JSON.stringify({ pin: { waiting: null } }) })).body.text();
    await Promise.all(held);
    await gw.close();
    await Promise.all(sims.map((s) => s.close()));
    flaky.closeAllConnections();
    flaky.close();
  }
});

test("flow control's outcomes read 0 for every configured priority before its first request, a band added by a reload too; the pool gauges", async () => {
  const backend = await startFakeBackend();
  const text = (objectives: string) => fleetConfig([{ name: 'b', port: backend.port }], `objectives:\n${objectives}`);
  await withGateway(backend, text('- { name: batch, priority: -1 }\n'), async (gw) => {
    const exposition = async () => (await request(`${gw.metricsUrl}/metrics`)).body.text();
    const zeroBands = (m: string) =>
      [...m.matchAll(/^llm_d_epp_flow_control_requests_total\{outcome="EvictedTTL",priority="(-?\d+)",inference_pool="test-pool"\} 0$/gm)].map((x) => x[1]).sort();
    const m = await exposition();
    assert.deepEqual(zeroBands(m), ['-1', '0']);
    // llm-d's pool gauges, over the endpoint with fresh metrics (the gateway's readiness window).
    assert.match(m, /^llm_d_epp_ready_endpoints\{name="test-pool"\} 1$/m);
    assert.match(m, /^llm_d_epp_average_kv_cache_utilization\{name="test-pool"\} 0\.1$/m);
    await gw.reload(loadConfigText(text('- { name: batch, priority: -1 }\n- { name: hi, priority: 10 }\n'), 'test.yaml', builtinRegistry()));
    assert.deepEqual(zeroBands(await exposition()), ['-1', '0', '10']);
  });
});
