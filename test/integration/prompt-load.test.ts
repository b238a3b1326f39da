/**
 * Prompt tokens in flight, end to end: the gateway counts a request's uncached prompt tokens on the
 * endpoint that computes them from dispatch to the answer's first byte; the llm-d plugins that read
 * them (token-load-scorer, prefix-cache-affinity-filter) run in a real gateway, and the filter's
 * decisions reach /metrics. Real gateway, real model servers on loopback.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { request } from 'undici';
import OpenAI from 'openai';
import { fleetConfig, gatewayFor, waitForMetrics } from '../helpers/fleet.js';
import { okJson, startFakeBackend, type Received } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';

const MODEL = 'm';
/** 768 characters of completions prompt: 192 prompt tokens (4 characters each), 12 whole 16-token blocks. */
const PROMPT = 'The quick brown fox jumps over the lazy dog. '.repeat(18).slice(0, 768);
const body = (prompt: string, stream: boolean) => JSON.stringify({ model: MODEL, prompt, max_tokens: 2, stream });

/** A model server that holds each request until the test lets it start its answer, then finish it. */
async function heldBackend() {
  const held: { req: Received; res: ServerResponse }[] = [];
  const backend = await startFakeBackend((req, res) => void held.push({ req, res }));
  return { backend, held };
}

describe('prompt tokens in flight', () => {
  test('counted on the endpoint from dispatch to the first byte of the answer; a cached prompt brings none', async () => {
    const { backend, held } = await heldBackend();
    const gw = await gatewayFor(fleetConfig([{ name: 'only', port: backend.port }]));
    try {
      await waitForMetrics(gw);
      const ep = gw.pool.endpoints[0]!;
      const promptTokens = PROMPT.length / 4;
      const answer = request(`${gw.apiUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(PROMPT, true) });
      await until(() => held.length === 1, 5000, 'the request reached the server');
      assert.equal(ep.inFlightTokens, promptTokens, 'the whole prompt is uncached');
      const pool = (await (await request(`${gw.metricsUrl}/debug/pool`)).body.json()) as { endpoints: { inFlight: number; inFlightTokens: number }[] };
      assert.deepEqual([pool.endpoints[0]!.inFlight, pool.endpoints[0]!.inFlightTokens], [1, promptTokens], '/debug/pool shows both');
      const { res } = held[0]!;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(ep.inFlightTokens, promptTokens, 'response headers are not the first byte');
      res.write('data: {"choices":[{"index":0,"text":"hi"}]}\n\n');
      await until(() => ep.inFlightTokens === 0, 5000, 'the first byte released the prompt tokens');
      res.end('data: [DONE]\n\n');
      const r = await answer;
      assert.equal(r.statusCode, 200);
      await r.body.text();
      assert.equal(ep.inFlight, 0);

      // The same prompt again: the prefix index says this server caches it, so it brings no prompt work.
      const again = request(`${gw.apiUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(PROMPT, false) });
      await until(() => held.length === 2, 5000, 'the second request reached the server');
      assert.equal(ep.inFlightTokens, 0);
      okJson(held[1]!.req, held[1]!.res);
      assert.equal((await again).statusCode, 200);

      // A client that leaves before the first byte takes its prompt tokens with it.
      const ac = new AbortController();
      const gone = request(`${gw.apiUrl}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: body(`${'A new prompt of its own. '.repeat(16)}`, false),
        signal: ac.signal,
      }).catch(() => undefined);
      await until(() => held.length === 3, 5000, 'the third request reached the server');
      assert.equal(ep.inFlightTokens, 100);
      ac.abort();
      await gone;
      await until(() => ep.inFlightTokens === 0 && ep.inFlight === 0, 5000, 'released when the client left');
    } finally {
      for (const { res } of held) res.destroy();
      await gw.close();
      await backend.close();
    }
  });

  test("llm-d's optimized baseline (affinity filter + token-load scorer, index kept by the producer) keeps a prompt on its cache until it is busy", async () => {
    const servers = [await heldBackend(), await heldBackend()];
    const extra = `plugins:
- type: approx-prefix-cache-producer
- type: inflight-load-producer
- type: prefix-cache-affinity-filter
  parameters: { peakPrefillThroughput: 1000, maxTTFTPenaltyMs: 150 }
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
`;
    const gw = await gatewayFor(fleetConfig(servers.map((s, i) => ({ name: `s${i}`, port: s.backend.port })), extra));
    const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
    const served = () => servers.map((s) => s.held.length);
    const answerAll = () => {
      for (const s of servers) for (const h of s.held.splice(0)) okJson(h.req, h.res);
    };
    try {
      await waitForMetrics(gw);
      // First: no endpoint caches it (no_match); the token-load scorer picks either; it learns there.
      const first = client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 2 });
      await until(() => served()[0]! + served()[1]! === 1, 5000, 'first request sent');
      const home = served()[0] === 1 ? 0 : 1;
      answerAll();
      await first;
      // Its home caches it and has no prompt work ahead: it stays there.
      const second = client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 2 });
      await until(() => servers[home]!.held.length === 1, 5000, 'second request went home');
      const third = client.completions.create({ model: MODEL, prompt: `${PROMPT} and more`, max_tokens: 2 });
      await until(() => served()[0]! + served()[1]! === 2, 5000, 'third request sent');
      assert.equal(servers[home]!.held.length, 2, 'a cached prompt stays with its cache while that is not much slower');
      // Make home busy: 400 more prompt tokens in flight there (another client's long prompt): 402 ms of
      // prompt work ahead of the request there, none on the other, more than 150 ms: the gate opens and
      // the token-load scorer sends it to the other (402 tokens of load against its 192 uncached).
      gw.pool.endpoints[home]!.inFlightTokens += 400;
      const fourth = client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 2 });
      await until(() => servers[1 - home]!.held.length === 1, 5000, 'fourth request left its busy home');
      gw.pool.endpoints[home]!.inFlightTokens -= 400;
      answerAll();
      await Promise.all([second, third, fourth]);
      const metrics = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      const decisions = (outcome: string) =>
        Number(metrics.match(new RegExp(`^llm_d_epp_prefix_cache_affinity_filter_decisions_total\\{plugin_name="prefix-cache-affinity-filter",outcome="${outcome}"\\} (\\d+)$`, 'm'))?.[1] ?? 0);
      assert.deepEqual([decisions('no_match'), decisions('sticky'), decisions('load_override')], [1, 2, 1]);
    } finally {
      for (const s of servers) for (const { res } of s.held) res.destroy();
      await gw.close();
      await Promise.all(servers.map((s) => s.backend.close()));
    }
  });
});
