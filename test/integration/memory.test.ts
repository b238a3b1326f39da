/**
 * What a request keeps while it waits in the queue and while its answer streams: its bytes, not
 * their decoded text or parsed JSON (src/proxy/scheduling-request.ts). Gateway and backends run in
 * this process; the clients send Buffers, so the V8 heap's growth is the gateway's copies.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { request } from 'undici';
import { fleetConfig, gatewayFor, waitForMetrics } from '../helpers/fleet.js';
import { startFakeBackend, vllmPage } from '../helpers/fake-backend.js';
import { heapAfterGc } from '../helpers/heap.js';
import { until } from '../helpers/wait.js';


const N = 8;
/** N distinct chat bodies of 512 KiB each. */
const bodies = (stream: boolean) =>
  Array.from({ length: N }, (_, i) =>
    Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `${i} ${'a long prompt '.repeat(37_450)}` }], stream })),
  );

const send = (url: string, body: Buffer) =>
  request(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });

/** Kept as text and parsed JSON, each body would add twice its size to the heap (seen: 8.5–8.9 MiB); without, 0.5–0.6 MiB. */
function assertHeapHoldsNoCopies(grown: number, sent: Buffer[], what: string): void {
  const size = sent[0]!.length;
  assert.ok(grown < (N * size) / 2, `heap grew ${(grown / 2 ** 20).toFixed(1)} MiB for ${N} ${what} bodies of ${(size / 2 ** 20).toFixed(2)} MiB`);
}

const queued = async (metricsUrl: string) =>
  ((await (await request(`${metricsUrl}/debug/flowcontrol`)).body.json()) as { totals: { requests: number } }).totals.requests;

const DETECTOR = `plugins:
- type: utilization-detector
  parameters: { queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 300ms }
`;

describe('memory held per request', () => {
  test('a queued request keeps its bytes only, and is forwarded intact', async () => {
    const backend = await startFakeBackend();
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }], DETECTOR));
    try {
      await waitForMetrics(gw);
      backend.metrics = vllmPage(10); // saturated: everything queues
      await until(() => gw.pool.endpoints[0]!.metrics?.waiting === 10);
      const sent = bodies(false);
      const heapBefore = heapAfterGc();
      const answers = sent.map((b) => send(gw.apiUrl, b).then(async (r) => ({ status: r.statusCode, text: await r.body.text() })));
      await until(async () => (await queued(gw.metricsUrl)) === N, 5000, 'all queued');
      assertHeapHoldsNoCopies(heapAfterGc() - heapBefore, sent, 'queued');
      backend.metrics = vllmPage(0);
      for (const r of await Promise.all(answers)) assert.equal(r.status, 200, r.text);
      assert.deepEqual(
        backend.received.map((r) => r.body).sort(),
        sent.map((b) => b.toString()).sort(),
      );
    } finally {
      await gw.close();
      await backend.close();
    }
  });

  test('a request at a model server that has not answered yet keeps its bytes only (a prompt of token ids too)', async () => {
    const held: ServerResponse[] = [];
    const backend = await startFakeBackend((_r, res) => void held.push(res));
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }]));
    try {
      await waitForMetrics(gw);
      // Parsed, 512 KiB of token ids is an array several times that size.
      const sent = Array.from({ length: N }, (_, i) =>
        Buffer.from(JSON.stringify({ model: 'm', prompt: Array.from({ length: 87_000 }, (_, j) => 10_000 + ((i * 7 + j) % 89_999)) })),
      );
      const heapBefore = heapAfterGc();
      const answers = sent.map((b) => request(`${gw.apiUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: b }));
      await until(() => held.length === N, 5000, 'all at the model server');
      backend.received.length = 0; // the backend's copies are not the gateway's
      assertHeapHoldsNoCopies(heapAfterGc() - heapBefore, sent, 'in-flight token-id');
      for (const res of held) res.end('{"choices":[]}');
      for (const r of await Promise.all(answers)) {
        assert.equal(r.statusCode, 200);
        await r.body.dump();
      }
    } finally {
      await gw.close();
      await backend.close();
    }
  });

  test('a request whose answer is streaming keeps its bytes only', async () => {
    const streams: ServerResponse[] = [];
    const backend = await startFakeBackend((_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n');
      streams.push(res);
    });
    const gw = await gatewayFor(fleetConfig([{ name: 'b', port: backend.port }]));
    try {
      await waitForMetrics(gw);
      const sent = bodies(true);
      const heapBefore = heapAfterGc();
      const answers = await Promise.all(sent.map((b) => send(gw.apiUrl, b)));
      await until(() => streams.length === N, 5000, 'all streaming');
      backend.received.length = 0; // the backend's copies are not the gateway's
      assertHeapHoldsNoCopies(heapAfterGc() - heapBefore, sent, 'streaming');
      for (const res of streams) res.end('data: [DONE]\n\n');
      for (const r of answers) {
        assert.equal(r.statusCode, 200);
        assert.match(await r.body.text(), /"hi"[\s\S]*\[DONE\]/);
      }
    } finally {
      await gw.close();
      await backend.close();
    }
  });
});
