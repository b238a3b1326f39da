/**
 * A pool whose servers serve different models: each request goes only to the servers of its model
 * (their metrics pages' model_name), so a client that lists the models and picks one is never sent
 * to a server that would answer 404. Real simulators on loopback, the openai client.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { request } from 'undici';
import { startSimulator } from '../../src/sim/server.js';
import { startFakeBackend } from '../helpers/fake-backend.js';
import { captureLogger, fleetConfig, gatewayFor, waitForMetrics } from '../helpers/fleet.js';

test('two models in one pool: every request reaches a server of its model; the mix is logged and shown', async () => {
  const sims = await Promise.all([
    startSimulator({ name: 'a-0', model: 'model-a', ttftOverheadMs: 1, itlMs: 1, prefillMsPerToken: 0 }),
    startSimulator({ name: 'a-1', model: 'model-a', ttftOverheadMs: 1, itlMs: 1, prefillMsPerToken: 0 }),
    startSimulator({ name: 'b-0', model: 'model-b', ttftOverheadMs: 1, itlMs: 1, prefillMsPerToken: 0 }),
  ]);
  const { logger, lines } = captureLogger('warn');
  const gw = await gatewayFor(fleetConfig(sims.map((s) => ({ name: s.name, port: s.port }))), { logger });
  try {
    await waitForMetrics(gw);
    const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
    const listed = (await client.models.list()).data.map((m) => m.id).sort();
    assert.deepEqual(listed, ['model-a', 'model-b']);
    const servedBy: Record<string, Set<string>> = { 'model-a': new Set(), 'model-b': new Set() };
    // Four at a time: the servers of one model get busy, the other model's idle server looks best.
    for (let round = 0; round < 6; round++) {
      await Promise.all(
        listed.flatMap((model) =>
          [0, 1].map(async (k) => {
            const { data, response } = await client.chat.completions
              .create({ model, messages: [{ role: 'user', content: `round ${round} request ${k}` }], max_tokens: 4 })
              .withResponse();
            assert.equal(data.model, model);
            servedBy[model]!.add(String(response.headers.get('x-inference-pod')));
          }),
        ),
      );
    }
    assert.deepEqual([...servedBy['model-a']!].sort(), ['a-0', 'a-1']);
    assert.deepEqual([...servedBy['model-b']!], ['b-0']);
    const warned = lines().filter((l) => String(l.msg).startsWith("the pool's servers serve several models"));
    assert.equal(warned.length, 1);
    assert.deepEqual(warned[0]!.models, { 'model-a': ['a-0', 'a-1'], 'model-b': ['b-0'] });
    const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { name: string; model: string | null }[] };
    assert.deepEqual(
      pool.endpoints.map((e) => `${e.name}=${e.model}`),
      ['a-0=model-a', 'a-1=model-a', 'b-0=model-b'],
    );
  } finally {
    await gw.close();
    await Promise.all(sims.map((s) => s.close()));
  }
});

test('a page that flips between models (a Service in front of two deployments) is logged once, not at every flip', async () => {
  const page = (model: string) =>
    `vllm:num_requests_waiting{model_name="${model}"} 0\nvllm:num_requests_running{model_name="${model}"} 0\nvllm:kv_cache_usage_perc{model_name="${model}"} 0.1\n`;
  const backends = await Promise.all([0, 1, 2].map(() => startFakeBackend()));
  backends[0]!.metrics = page('A');
  backends[1]!.metrics = page('A');
  let flips = 0;
  const flip = setInterval(() => (backends[2]!.metrics = page(++flips % 2 ? 'A' : 'B')), 25);
  const { logger, lines } = captureLogger('warn');
  const gw = await gatewayFor(fleetConfig(backends.map((b, i) => ({ name: `e${i}`, port: b.port }))), { logger });
  try {
    await waitForMetrics(gw);
    await new Promise((r) => setTimeout(r, 800));
    assert.ok(flips > 10);
    const warned = lines().filter((l) => String(l.msg).startsWith("the pool's servers serve several models"));
    assert.equal(warned.length, 1, JSON.stringify(warned));
  } finally {
    clearInterval(flip);
    await gw.close();
    await Promise.all(backends.map((b) => b.close()));
  }
});
