/**
 * A plugin that throws costs the request it was deciding a 500 — counted, logged as a 500 — never a
 * hang, a lost request, the process or the /metrics page.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'undici';
import { startGateway, type Gateway } from '../../src/app.js';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { concurrencyDetectorDefinition } from '../../src/saturation/concurrency-detector.js';
import type { SaturationDetector } from '../../src/saturation/detector.js';
import { queueScorerDefinition } from '../../src/scheduling/plugins/queue-scorer.js';
import { captureLogger } from '../helpers/fleet.js';
import { okJson, startFakeBackend } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';

const post = (gw: Gateway, content: string, headers: Record<string, string> = {}) =>
  request(`${gw.apiUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }),
  }).then(async (r) => ({ status: r.statusCode, text: await r.body.text() }));

const metricLines = async (gw: Gateway, name: string) => (await gw.metrics.text()).split('\n').filter((l) => l.startsWith(`${name}{`));

const config = (port: number, extra: string) => `server: { port: 0, metricsPort: 0, shutdownGracePeriod: 1s }
pool:
  metrics: { interval: 20ms, timeout: 500ms }
  endpoints:
  - { name: a, address: 127.0.0.1, port: ${port} }
${extra}`;

describe('plugins that throw', () => {
  for (const flowControl of [true, false]) {
    test(`a scorer that throws: 500, counted and logged as one, nothing left running (flow control ${flowControl ? 'on' : 'off'})`, async () => {
      const registry = builtinRegistry();
      const broken: typeof queueScorerDefinition = {
        ...queueScorerDefinition,
        type: 'broken-scorer',
        create: (name) => ({ name, type: 'broken-scorer', score: () => { throw new Error('scorer bug'); } }) as unknown as ReturnType<typeof queueScorerDefinition.create>,
      };
      registry.register(broken);
      const backend = await startFakeBackend();
      const { logger, lines } = captureLogger('debug');
      const extra = `plugins:\n- { type: broken-scorer }\n${flowControl ? '' : 'featureGates: ["flowControl=false"]\n'}`;
      const gw = await startGateway(loadConfigText(config(backend.port, extra), 't.yaml', registry), { registry, logger, host: '127.0.0.1' });
      try {
        await until(() => gw.pool.endpoints[0]!.metricsAt > 0);
        const r = await post(gw, 'x', { 'x-request-id': 'broken-1' });
        assert.equal(r.status, 500, r.text);
        assert.equal(JSON.parse(r.text).error.type, 'InternalServerError');
        const errors = (await metricLines(gw, 'llm_d_epp_request_error_total')).filter((l) => !l.endsWith(' 0')); // (the gateway's own codes exist from 0)
        assert.deepEqual(errors, ['llm_d_epp_request_error_total{model_name="m",target_model_name="m",error_code="500"} 1']);
        assert.deepEqual(await metricLines(gw, 'llm_d_epp_request_running'), ['llm_d_epp_request_running{model_name="m"} 0']);
        assert.equal(lines().find((l) => l.msg === 'request done' && l.requestId === 'broken-1')?.status, 500);
        assert.ok(lines().some((l) => l.msg === 'unexpected error handling request' && l.requestId === 'broken-1'));
        assert.equal(backend.received.length, 0);
      } finally {
        await gw.close();
        await backend.close();
      }
    });
  }

  test('a saturation detector that throws: /metrics still answers; a request it was deciding gets a 500, not a hang', async () => {
    let broken = false;
    const registry = builtinRegistry();
    registry.register({
      ...concurrencyDetectorDefinition,
      type: 'flaky-detector',
      create(name, params, deps) {
        const d = concurrencyDetectorDefinition.create(name, params, deps) as SaturationDetector;
        const saturation = d.saturation.bind(d);
        d.saturation = (now, endpoints) => {
          if (broken) throw new Error('detector bug');
          return saturation(now, endpoints);
        };
        return d;
      },
    } as typeof concurrencyDetectorDefinition);
    let release: (() => void) | undefined;
    const backend = await startFakeBackend((r, res) => {
      if (release === undefined) release = () => okJson(r, res);
      else okJson(r, res);
    });
    const extra = (more = '') => `plugins:
- type: flaky-detector
  parameters: { maxConcurrency: 1 }
flowControl:
  saturationDetector: { pluginRef: flaky-detector }
objectives:
- { name: batch, priority: -1 }
${more}`;
    const { logger } = captureLogger();
    const gw = await startGateway(loadConfigText(config(backend.port, extra()), 't.yaml', registry), { registry, logger, host: '127.0.0.1' });
    try {
      await until(() => gw.pool.endpoints[0]!.metricsAt > 0);
      const first = post(gw, 'holds the only slot');
      await until(() => backend.received.length === 1);
      const batch = post(gw, 'batch', { 'x-llm-d-inference-objective': 'batch' });
      await until(async () => (await metricLines(gw, 'llm_d_epp_flow_control_queue_size')).some((l) => l.endsWith(' 1')), 3000, 'batch queued');
      broken = true;
      const page = await request(`${gw.metricsUrl}/metrics`);
      const text = await page.body.text();
      assert.equal(page.statusCode, 200);
      assert.doesNotMatch(text, /^llm_d_epp_flow_control_pool_saturation\{/m, 'its gauges are left out');
      // Flow control turned off: the queued sheddable request meets the rule without it, which asks the detector.
      await gw.reload(loadConfigText(config(backend.port, extra('featureGates: ["flowControl=false"]')), 't.yaml', registry));
      const shed = await batch;
      assert.equal(shed.status, 500, shed.text);
      release!();
      assert.equal((await first).status, 200);
      broken = false;
      assert.deepEqual(await metricLines(gw, 'llm_d_epp_request_running'), ['llm_d_epp_request_running{model_name="m"} 0']);
    } finally {
      await gw.close();
      await backend.close();
    }
  });

  for (const stream of [false, true]) {
    test(`a response hook that throws (${stream ? 'a stream' : 'a JSON answer'}): a 500 the gateway owns — logged as its own error, the model server charged nothing, never ejected`, async () => {
      const registry = builtinRegistry();
      registry.register({
        ...queueScorerDefinition,
        type: 'broken-hook-scorer',
        create(name, params, deps) {
          const scorer = queueScorerDefinition.create(name, params, deps);
          return Object.assign(scorer, { onResponseHeaders: () => { throw new Error('hook bug'); } });
        },
      } as typeof queueScorerDefinition);
      const backend = await startFakeBackend((_r, res) => {
        if (!stream) return okJson(_r, res);
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end('data: {"choices":[]}\n\ndata: [DONE]\n\n');
      });
      const { logger, lines } = captureLogger();
      const gw = await startGateway(loadConfigText(config(backend.port, 'plugins:\n- { type: broken-hook-scorer }\n'), 't.yaml', registry), { registry, logger, host: '127.0.0.1' });
      try {
        await until(() => gw.pool.endpoints[0]!.metricsAt > 0);
        // More than outlier detection's 5 in a row: a gateway bug must not set a healthy server aside.
        for (let i = 0; i < 6; i++) {
          const r = await request(`${gw.apiUrl}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: `x${i}` }] }),
          });
          assert.equal(r.statusCode, 500);
          assert.match(await r.body.text(), /internal gateway error relaying the answer of a/);
        }
        const ep = gw.pool.endpoints[0]!;
        assert.deepEqual([ep.failureStreak, ep.ejectedFor], [0, undefined]);
        assert.deepEqual((await metricLines(gw, 'sluice_endpoint_upstream_errors_total')).filter((l) => !l.endsWith(' 0')), []);
        const logged = lines().filter((l) => l.msg === 'the gateway failed relaying an answer (not the model server): 500');
        assert.equal(logged.length, 6);
        assert.equal((logged[0]!.err as { message: string }).message, 'hook bug');
        assert.deepEqual(await metricLines(gw, 'llm_d_epp_request_running'), ['llm_d_epp_request_running{model_name="m"} 0']);
      } finally {
        await gw.close();
        await backend.close();
      }
    });
  }
});
