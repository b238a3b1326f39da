/**
 * Exactly-once accounting under chaos: random client cancels, TTL expiries, failing and dead
 * backends. Every request that entered ends in exactly one flow-control outcome, the client saw a
 * response or gave up, and every counter and gauge returns to exactly zero.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import { captureLogger, fleetConfig, gatewayFor } from '../helpers/fleet.js';
import { okJson, startFakeBackend, type Behaviour } from '../helpers/fake-backend.js';
import { seededRandom } from '../../src/util/clock.js';

const N = 240;

function sample(metrics: string, name: string, labels = ''): number[] {
  return metrics
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) && labels.split(',').every((kv) => l.includes(kv)))
    .map((l) => Number(l.slice(l.lastIndexOf(' ') + 1)));
}
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

test('every request ends exactly once, with a reason, and nothing stays in flight', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (r: unknown) => unhandled.push(r);
  process.on('unhandledRejection', onUnhandled);

  const rnd = seededRandom(42);
  const flaky: Behaviour = (r, res) => {
    const x = rnd();
    if (x < 0.15) return res.socket?.destroy(); // reset before headers
    if (x < 0.3) {
      res.writeHead(500, { 'content-type': 'application/json' });
      return res.end('{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}');
    }
    if (x < 0.4 && JSON.parse(r.body).stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
      return setTimeout(() => res.socket?.destroy(), 5); // reset mid-stream
    }
    setTimeout(() => okJson(r, res), 5 + rnd() * 20);
  };
  const good = await startFakeBackend((r, res) => setTimeout(() => okJson(r, res), 10 + rnd() * 30));
  const bad = await startFakeBackend(flaky);
  // Dead: every connection reset at once (a closed port could be taken by a parallel test's server).
  const deadServer = net.createServer((socket) => socket.resetAndDestroy());
  await new Promise<void>((r) => deadServer.listen(0, '127.0.0.1', r));
  const deadPort = (deadServer.address() as AddressInfo).port;

  const extra = `plugins:
- type: concurrency-detector
  parameters: { maxConcurrency: 1 }
- type: queue-scorer
flowControl:
  saturationDetector: { pluginRef: concurrency-detector }
  defaultRequestTTL: 60ms
`;
  const log = captureLogger('debug');
  const gw = await gatewayFor(
    fleetConfig(
      [
        { name: 'good', port: good.port },
        { name: 'flaky', port: bad.port },
        { name: 'dead', port: deadPort },
      ],
      extra,
    ),
    { logger: log.logger },
  );
  try {
    // The dead endpoint never gets metrics; wait for the two live ones.
    const live = Date.now() + 5000;
    while (Date.now() < live && gw.pool.endpoints.filter((e) => e.metricsAt > 0).length < 2) await new Promise((r) => setTimeout(r, 10));
    const results: (number | 'aborted' | 'error')[] = [];
    await Promise.all(
      Array.from({ length: N }, async (_, i) => {
        const ac = new AbortController();
        const abortAfter = rnd() < 0.15 ? rnd() * 100 : -1;
        if (abortAfter >= 0) setTimeout(() => ac.abort(), abortAfter);
        const stream = rnd() < 0.4;
        try {
          const r = await request(`${gw.apiUrl}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-request-id': `q${i}` },
            body: JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: `q${i}` }] }),
            signal: ac.signal,
          });
          await r.body.text();
          results[i] = r.statusCode;
        } catch (err) {
          results[i] = ac.signal.aborted ? 'aborted' : 'error';
        }
      }),
    );

    // Settle: nothing queued, nothing in flight.
    const end = Date.now() + 5000;
    while (Date.now() < end && gw.pool.endpoints.some((e) => e.inFlight !== 0)) await new Promise((r) => setTimeout(r, 10));
    const m = await (await request(`${gw.metricsUrl}/metrics`)).body.text();

    // A client that aborts before its body arrived never entered: the gateway counts what it accepted.
    const accepted = sum(sample(m, 'llm_d_epp_request_total'));
    const notAborted = results.filter((r) => r !== 'aborted').length;
    assert.ok(accepted >= notAborted && accepted <= N, `accepted ${accepted}, answered ${notAborted}`);
    const outcomes = sample(m, 'llm_d_epp_flow_control_requests_total');
    assert.equal(sum(outcomes), accepted, 'one flow-control outcome per accepted request');
    const ttlEvicted = sum(sample(m, 'llm_d_epp_flow_control_requests_total', 'outcome="EvictedTTL"'));
    const cancelled = sum(sample(m, 'llm_d_epp_flow_control_requests_total', 'outcome="EvictedContextCancelled"'));
    const dispatched = sum(sample(m, 'llm_d_epp_flow_control_requests_total', 'outcome="Dispatched"'));
    assert.equal(dispatched + ttlEvicted + cancelled, accepted, 'no other outcome in this scenario');
    assert.ok(ttlEvicted > 0 && cancelled > 0 && dispatched > 0, `a real mix: ${dispatched}/${ttlEvicted}/${cancelled}`);

    const seen = (s: number) => results.filter((r) => r === s).length;
    const aborted = results.filter((r) => r === 'aborted').length;
    assert.equal(results.filter((r) => r === undefined).length, 0);
    assert.ok(seen(429) >= ttlEvicted, 'every TTL eviction reached its client as a 429 (some 429s may come from elsewhere)');
    assert.ok(cancelled <= aborted, 'a cancel is only counted for a client that gave up');
    for (const r of results) assert.ok(r === 'aborted' || r === 'error' || typeof r === 'number');
    // Clients that did not abort always got an answer; a stream cut mid-way is a status 200 with an error event.
    assert.equal(results.filter((r) => r === 'error').length, 0, 'no client was left with a broken connection');

    for (const ep of gw.pool.endpoints) assert.deepEqual([ep.inFlight, ep.inFlightTokens], [0, 0], `${ep.name} in flight (requests, prompt tokens)`);
    assert.equal(sum(sample(m, 'llm_d_epp_request_running')), 0, 'request_running back to 0');
    assert.equal(sum(sample(m, 'llm_d_epp_flow_control_queue_size')), 0, 'queue empty');
    assert.equal(sum(sample(m, 'llm_d_epp_endpoint_inflight_requests')), 0);
    assert.equal(gw.pool.releaseUnderflows, 0, 'no double release');
    assert.deepEqual(unhandled, []);

    // At debug level each request that reached the handler logged one `request done` line: what the
    // client got (a stream cut mid-way: 502, though its status line said 200), and why.
    const done = log.lines().filter((l) => l.msg === 'request done') as { requestId: string; status: number; droppedReason?: string; endpoint?: string }[];
    const byId = new Map(done.map((d) => [d.requestId, d]));
    assert.equal(byId.size, done.length, 'one line per request');
    assert.ok(done.length >= accepted, `${done.length} lines for ${accepted} accepted`);
    results.forEach((r, i) => {
      const d = byId.get(`q${i}`);
      if (r === 'aborted') return; // the gateway may have answered before the abort reached it
      assert.ok(d !== undefined, `q${i} (${r}) logged`);
      assert.ok(d.status === r || (r === 200 && d.status === 502), `q${i}: client ${r}, log ${d.status}`);
    });
    assert.equal(done.filter((d) => d.droppedReason === 'rejected-ttl-expired').length, ttlEvicted, 'TTL evictions say so');
    assert.ok(done.filter((d) => d.status === 200).every((d) => d.endpoint === 'good' || d.endpoint === 'flaky'));
    assert.ok(done.filter((d) => d.status === 0).length >= cancelled, 'client cancels logged as status 0');

    // Every accepted request is counted once in Prometheus: answered, an error, or a client cancel.
    const clientCancels = sum(sample(m, 'sluice_request_cancelled_total'));
    const answered = done.filter((d) => d.status >= 200 && d.status < 400).length;
    assert.equal(clientCancels, done.filter((d) => d.status === 0).length, 'one cancel per request whose client went away');
    assert.equal(answered + sum(sample(m, 'llm_d_epp_request_error_total')) + clientCancels, accepted, 'answered + errors + cancels = request_total');
    assert.ok(sum(sample(m, 'sluice_request_cancelled_total', 'stage="queued"')) >= cancelled, 'cancels in the queue are among them');
  } finally {
    process.off('unhandledRejection', onUnhandled);
    await gw.close();
    await good.close();
    await bad.close();
    deadServer.close();
  }
});
