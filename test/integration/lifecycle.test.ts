/** Live reload (SPEC §3.7) and graceful drain (SPEC §1), against real servers on loopback. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { startGateway, type Gateway } from '../../src/app.js';
import { loadConfigFile } from '../../src/config/load.js';
import { ConfigReloader } from '../../src/config/reload.js';
import { effectiveConfigDigest } from '../../src/config/print.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { captureLogger, waitForMetrics } from '../helpers/fleet.js';
import { okJson, slowJson, startFakeBackend, vllmPage, type Behaviour, type FakeBackend } from '../helpers/fake-backend.js';
import { startSimulator } from '../../src/sim/server.js';
import { exitCodeAfter, until } from '../helpers/wait.js';
import { spawnCli } from '../helpers/cli-process.js';

const dir = mkdtempSync(join(tmpdir(), 'sluice-lifecycle-'));

/** One slot (concurrency detector, max 1) so a second request is held in the queue. */
function config(endpoints: { name: string; port: number }[], extra = ''): string {
  return `server: { port: 0, metricsPort: 0, shutdownGracePeriod: 3s }
pool:
  metrics: { interval: 20ms, timeout: 500ms }
  endpoints:
${endpoints.map((e) => `  - { name: ${e.name}, address: 127.0.0.1, port: ${e.port} }`).join('\n')}
plugins:
- type: concurrency-detector
  parameters: { maxConcurrency: 1 }
flowControl:
  saturationDetector: { pluginRef: concurrency-detector }
${extra}`;
}

const post = (gw: Gateway, content: string, headers: Record<string, string> = {}) =>
  request(`${gw.apiUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }),
  }).then(async (r) => ({ status: r.statusCode, headers: r.headers, text: await r.body.text() }));


/**
 * A gateway started from `text` (written to `name`) and a reloader of that file. Without
 * `pollIntervalMs` it does not poll: tests call reloadNow. `close` stops both, then the backends.
 */
async function reloadableGateway(name: string, text: string, opts: { pollIntervalMs?: number; port?: number; metricsPort?: number } = {}) {
  const file = join(dir, name);
  writeFileSync(file, text);
  const registry = builtinRegistry();
  const { logger, lines } = captureLogger();
  const gw = await startGateway(loadConfigFile(file, registry), { registry, logger, host: '127.0.0.1', port: opts.port, metricsPort: opts.metricsPort });
  const pollIntervalMs = opts.pollIntervalMs ?? 0;
  const reloader = new ConfigReloader({ file, registry, target: gw, logger, pollIntervalMs, onResult: (result) => gw.metrics.configReload(result) });
  if (pollIntervalMs > 0) reloader.start();
  const close = async (...backends: { close(): Promise<void> }[]) => {
    reloader.stop();
    await gw.close();
    for (const b of backends) await b.close();
  };
  return { file, gw, reloader, lines, close };
}

/** One request in flight at `a` (the only slot: concurrency 1) and one held in the queue behind it. */
async function inFlightAndQueued(gw: Gateway, a: FakeBackend) {
  const inFlight = post(gw, 'in-flight');
  await until(() => a.received.length === 1, 3000, 'first request at a');
  const queued = post(gw, 'queued');
  await until(() => gw.pool.endpoints[0]!.inFlight === 1 && a.received.length === 1);
  await new Promise((r) => setTimeout(r, 30)); // the second one is held, not sent
  return { inFlight, queued };
}

describe('live reload', () => {
  test('a valid new file is applied without dropping the in-flight or the queued request', async () => {
    const a = await startFakeBackend(slowJson(300));
    const b = await startFakeBackend();
    const { file, gw, reloader, close } = await reloadableGateway('reload.yaml', config([{ name: 'a', port: a.port }]));
    try {
      await waitForMetrics(gw);
      const { inFlight, queued } = await inFlightAndQueued(gw, a);
      assert.equal(a.received.length, 1);

      writeFileSync(file, config([{ name: 'b', port: b.port }], 'objectives:\n- { name: gold, priority: 5 }\n'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.deepEqual(
        gw.pool.endpoints.map((e) => e.name),
        ['b'],
      );
      const [r1, r2] = await Promise.all([inFlight, queued]);
      assert.equal(r1.status, 200, 'the in-flight request to the removed endpoint finished');
      assert.equal(r2.status, 200, 'the queued request was kept and served');
      assert.deepEqual(
        b.received.map((r) => JSON.parse(r.body).messages[0].content),
        ['queued'],
      );
      assert.equal(gw.config.objectives[0]?.name, 'gold');
      const m = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(m, /sluice_config_reloads_total\{result="success"\} 1/);
      assert.match(m, /sluice_config_last_reload_successful 1/);
      // The removed endpoint's counters are exposed once more with their last values, then dropped.
      assert.match(m, /llm_d_epp_scheduler_attempts_total\{status="success",endpoint_name="a"\} 1/);
      assert.match(m, /sluice_endpoint_first_byte_seconds_count\{endpoint_name="a"\} 1/);
      const next = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.doesNotMatch(next, /endpoint_name="a"/);
      assert.match(next, /llm_d_epp_scheduler_attempts_total\{status="success",endpoint_name="b"\} 1/);
    } finally {
      await close(a, b);
    }
  });

  test('a reload that changes only an endpoint\'s labels keeps its in-flight count: a concurrency limit of 1 holds', async () => {
    const a = await startFakeBackend(slowJson(300));
    const labelled = (labels: string) => config([{ name: 'a', port: a.port }]).replace(`port: ${a.port} }`, `port: ${a.port}, labels: ${labels} }`);
    const { file, gw, reloader, close } = await reloadableGateway('relabel.yaml', labelled('{}'));
    try {
      await waitForMetrics(gw);
      const first = post(gw, 'first');
      await until(() => a.received.length === 1, 3000, 'first request at a');
      const second = post(gw, 'second');
      await new Promise((r) => setTimeout(r, 50)); // held: the only slot is taken
      writeFileSync(file, labelled('{ zone: x }'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.equal(gw.pool.endpoints[0]!.labels['zone'], 'x');
      assert.equal(gw.pool.endpoints[0]!.inFlight, 1, 'the request in flight still counts');
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(a.received.length, 1, 'the queued request is still held');
      const [r1, r2] = await Promise.all([first, second]);
      assert.deepEqual([r1.status, r2.status], [200, 200]);
      assert.equal(a.maxActive, 1, 'never two at once');
    } finally {
      await close(a);
    }
  });

  test('a reload keeps what the prefix-cache scorer learned: prompts stay with the endpoint that caches them', async () => {
    const [a, b] = [await startFakeBackend(), await startFakeBackend()];
    const text = (extra = '') => `server: { port: 0, metricsPort: 0 }
pool:
  metrics: { interval: 20ms }
  endpoints:
  - { name: a, address: 127.0.0.1, port: ${a.port} }
  - { name: b, address: 127.0.0.1, port: ${b.port} }
featureGates: ["flowControl=false"]
plugins:
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins: [ { pluginRef: prefix-cache-scorer } ]
  saturationFilter: false
${extra}`;
    const { file, gw, reloader, close } = await reloadableGateway('prefix.yaml', text());
    const prompts = Array.from({ length: 12 }, (_, i) => `prompt ${i} ${'x'.repeat(400)}`);
    const servedBy = async () => {
      const where: string[] = [];
      for (const p of prompts) {
        const before = a.received.length;
        assert.equal((await post(gw, p)).status, 200);
        where.push(a.received.length > before ? 'a' : 'b');
      }
      return where;
    };
    try {
      await waitForMetrics(gw);
      const first = await servedBy();
      assert.deepEqual(await servedBy(), first, 'affinity before the reload');
      writeFileSync(file, text('objectives:\n- { name: gold, priority: 5 }\n'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.deepEqual(await servedBy(), first, 'affinity after the reload');
    } finally {
      await close(a, b);
    }
  });

  test('objectives and profiles from a reload govern the requests that follow', async () => {
    const [a, b] = [await startFakeBackend(), await startFakeBackend()];
    a.metrics = b.metrics = vllmPage(10); // saturated: 10 waiting
    const text = (extra = '') => `server: { port: 0, metricsPort: 0 }
pool:
  metrics: { interval: 20ms }
  endpoints:
  - { name: a, address: 127.0.0.1, port: ${a.port}, labels: { tier: x } }
  - { name: b, address: 127.0.0.1, port: ${b.port}, labels: { tier: y } }
featureGates: ["flowControl=false"]
${extra}`;
    const { file, gw, reloader, close } = await reloadableGateway('effects.yaml', text());
    try {
      await waitForMetrics(gw);
      assert.equal((await post(gw, 'hi', { 'x-llm-d-inference-objective': 'batch' })).status, 200, 'unknown objective: priority 0');
      writeFileSync(file, text('objectives:\n- { name: batch, priority: -1 }\nplugins:\n- type: label-selector-filter\n  parameters: { matchLabels: { tier: y } }\n- type: queue-scorer\n'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.equal((await post(gw, 'hi', { 'x-llm-d-inference-objective': 'batch' })).status, 429, 'now sheddable, and the pool is saturated');
      const before = b.received.length;
      for (let i = 0; i < 6; i++) assert.equal((await post(gw, `hi ${i}`)).status, 200);
      assert.equal(b.received.length - before, 6, 'the new profile sends everything to tier y');
    } finally {
      await close(a, b);
    }
  });

  test('a queued request whose objective a reload renumbered keeps a band of its own priority, not band 0', async () => {
    const a = await startFakeBackend(slowJson(300));
    const text = (priority: number) => config([{ name: 'a', port: a.port }], `objectives:\n- { name: batch, priority: ${priority} }\n`);
    const { file, gw, reloader, close } = await reloadableGateway('renumber.yaml', text(-1));
    const bandsWithRequests = async () => {
      const fc = (await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { bands: { priority: number; requests: number }[] };
      return fc.bands.filter((b) => b.requests > 0).map((b) => b.priority);
    };
    try {
      await waitForMetrics(gw);
      const first = post(gw, 'first');
      await until(() => a.received.length === 1, 3000, 'first request at a');
      const queued = post(gw, 'batch', { 'x-llm-d-inference-objective': 'batch' });
      await until(async () => (await bandsWithRequests()).length === 1, 3000, 'queued');
      assert.deepEqual(await bandsWithRequests(), [-1]);
      writeFileSync(file, text(-2));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.deepEqual(await bandsWithRequests(), [-1], 'still in a band of priority -1');
      assert.deepEqual([(await first).status, (await queued).status], [200, 200]);
    } finally {
      await close(a);
    }
  });

  test('a request still sending its body when a reload lands is served under the new configuration', async () => {
    const a = await startFakeBackend();
    const { file, gw, reloader, close } = await reloadableGateway('mid-body.yaml', config([{ name: 'a', port: a.port }]));
    try {
      await waitForMetrics(gw);
      const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'slow upload' }] });
      const answer = new Promise<{ status: number; text: string }>((resolve, reject) => {
        const req = http.request(
          { host: '127.0.0.1', port: gw.apiPort, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
          (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
          },
        );
        req.on('error', reject);
        req.write(body.slice(0, 10));
        // The rest after the reload (the gateway has the headers and is reading the body by then).
        setTimeout(() => {
          writeFileSync(file, config([{ name: 'a', port: a.port }], 'objectives:\n- { name: gold, priority: 5 }\n'));
          void reloader.reloadNow('test').then(() => req.end(body.slice(10)), reject);
        }, 100);
      });
      const r = await answer;
      assert.equal(r.status, 200, r.text);
      assert.equal(gw.config.objectives[0]?.name, 'gold', 'the reload was applied');
      assert.equal(a.received.length, 1);
    } finally {
      await close(a);
    }
  });

  test('changed upstream time-outs apply to endpoints that stay', async () => {
    const a = await startFakeBackend();
    const withTimeout = (t: string) => config([{ name: 'a', port: a.port }]).replace('shutdownGracePeriod: 3s }', `shutdownGracePeriod: 3s, upstream: { headersTimeout: ${t} } }`);
    const { file, gw, reloader, close } = await reloadableGateway('upstream.yaml', withTimeout('10s'));
    try {
      await waitForMetrics(gw);
      assert.equal((await post(gw, 'before')).status, 200); // the endpoint's connection pool exists
      writeFileSync(file, withTimeout('300ms'));
      assert.equal(await reloader.reloadNow('test'), true);
      a.behave = slowJson(1500); // within the old time-out, past the new one
      const r = await post(gw, 'after');
      assert.equal(r.status, 504, r.text);
    } finally {
      await close(a);
    }
  });

  test('a queued request the reload hands to a new endpoint goes out under the reload\'s upstream settings', async () => {
    const a = await startFakeBackend(slowJson(300));
    const b = await startFakeBackend(slowJson(1500)); // within the old headersTimeout, past the new one
    const { file, gw, reloader, close } = await reloadableGateway('handover-upstream.yaml', config([{ name: 'a', port: a.port }]));
    try {
      await waitForMetrics(gw);
      const { inFlight, queued } = await inFlightAndQueued(gw, a);
      writeFileSync(file, config([{ name: 'b', port: b.port }]).replace('shutdownGracePeriod: 3s }', 'shutdownGracePeriod: 3s, upstream: { headersTimeout: 300ms } }'));
      assert.equal(await reloader.reloadNow('test'), true);
      const [r1, r2] = await Promise.all([inFlight, queued]);
      assert.equal(r1.status, 200, r1.text);
      assert.equal(b.received.length, 1, 'the queued request went to b when the reload handed it over');
      assert.equal(r2.status, 504, `b's answer took longer than the new headersTimeout: ${r2.text}`);
    } finally {
      await close(a, b);
    }
  });

  test('a retry after a reload chooses among the endpoints as they are now', async () => {
    // a drops the connection before any answer byte: a failure that is retried elsewhere.
    const a = await startFakeBackend((_r, res) => void setTimeout(() => res.socket?.destroy(), 300));
    const c = await startFakeBackend(slowJson(1000));
    const d = await startFakeBackend();
    const { file, gw, reloader, close } = await reloadableGateway('retry-after-reload.yaml', config([{ name: 'c', port: c.port }]));
    try {
      await waitForMetrics(gw);
      const busy = post(gw, 'busy'); // c's only slot
      await until(() => c.received.length === 1, 3000, 'first request at c');
      writeFileSync(file, config([{ name: 'a', port: a.port }, { name: 'c', port: c.port }]));
      assert.equal(await reloader.reloadNow('test'), true);
      await waitForMetrics(gw);
      const retried = post(gw, 'retried'); // to a, the only one with room
      await until(() => a.received.length === 1, 3000, 'the request at a');
      // While a works on it, a reload replaces c by d.
      writeFileSync(file, config([{ name: 'a', port: a.port }, { name: 'd', port: d.port }]));
      assert.equal(await reloader.reloadNow('test'), true);
      const [r1, r2] = await Promise.all([busy, retried]);
      assert.equal(r1.status, 200, r1.text);
      assert.equal(r2.status, 200, r2.text);
      assert.deepEqual(
        d.received.map((r) => JSON.parse(r.body).messages[0].content),
        ['retried'],
        'retried on d, not on c, which the reload removed',
      );
      assert.equal(c.received.length, 1);
    } finally {
      await close(a, c, d);
    }
  });

  test('an endpoint a reload moved starts its scrape-failure log afresh', async () => {
    const [first, second] = [await startFakeBackend(), await startFakeBackend()];
    first.metrics = 500;
    second.metrics = 500;
    const { file, gw, reloader, lines, close } = await reloadableGateway('moved-failing.yaml', config([{ name: 'a', port: first.port }]));
    const failures = () => lines().filter((l) => l.msg === 'metrics scrape failed' && l.endpoint === 'a').length;
    try {
      await until(() => failures() === 1, 3000, 'the first failure logged');
      writeFileSync(file, config([{ name: 'a', port: second.port }]));
      assert.equal(await reloader.reloadNow('test'), true);
      // Another server under the same name: its failure is news, though within 30 s of the last line.
      await until(() => failures() === 2, 3000, "the moved endpoint's failure logged");
    } finally {
      await close(first, second);
    }
  });

  test('a reload that changes ports or request time-outs says they need a restart, and applies the rest', async () => {
    const a = await startFakeBackend();
    const { file, gw, reloader, lines, close } = await reloadableGateway('restart-only.yaml', config([{ name: 'a', port: a.port }]));
    try {
      await waitForMetrics(gw);
      const apiPort = gw.apiPort;
      writeFileSync(
        file,
        config([{ name: 'a', port: a.port }], 'objectives:\n- { name: gold, priority: 5 }\n').replace(
          'server: { port: 0, metricsPort: 0,',
          'server: { port: 0, metricsPort: 9, requestTimeout: 1m,',
        ),
      );
      assert.equal(await reloader.reloadNow('test'), true);
      const warning = lines().find((l) => l.msg === 'config reload: these settings need a restart; the rest is applied');
      assert.deepEqual(warning?.keys, ['server.metricsPort', 'server.requestTimeout']);
      assert.equal(gw.config.objectives[0]?.name, 'gold', 'the rest applied');
      assert.equal(gw.apiPort, apiPort);
      assert.equal((await post(gw, 'still on the old ports')).status, 200);
      // A later reload that changes something else says again what still awaits a restart.
      const warnings = () => lines().filter((l) => l.msg === 'config reload: these settings need a restart; the rest is applied');
      writeFileSync(file, readFileSync(file, 'utf8').replace('priority: 5', 'priority: 7'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.equal(gw.config.objectives[0]?.priority, 7);
      assert.equal(warnings().length, 2);
      assert.deepEqual(warnings()[1]?.keys, ['server.metricsPort', 'server.requestTimeout']);
      const pending = async () => /^sluice_config_restart_pending 1$/m.test(await (await request(`${gw.metricsUrl}/metrics`)).body.text());
      assert.equal(await pending(), true);
      // Back to what it started with: nothing awaits a restart any more.
      writeFileSync(file, config([{ name: 'a', port: a.port }], 'objectives:\n- { name: gold, priority: 7 }\n'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.equal(warnings().length, 2);
      assert.equal(await pending(), false);
    } finally {
      await close(a);
    }
  });

  test('ports set on the command line (--port, --metrics-port): a reload changing the file\'s ports awaits no restart', async () => {
    const a = await startFakeBackend();
    const { file, gw, reloader, lines, close } = await reloadableGateway('ports-flagged.yaml', config([{ name: 'a', port: a.port }]), { port: 0, metricsPort: 0 });
    try {
      await waitForMetrics(gw);
      writeFileSync(file, config([{ name: 'a', port: a.port }]).replace('server: { port: 0, metricsPort: 0,', 'server: { port: 8, metricsPort: 9,'));
      assert.equal(await reloader.reloadNow('test'), true);
      assert.equal(gw.config.server.port, 8, 'applied as far as it goes: the file says 8');
      assert.equal(lines().find((l) => l.msg === 'config reload: these settings need a restart; the rest is applied'), undefined);
      assert.match(await (await request(`${gw.metricsUrl}/metrics`)).body.text(), /^sluice_config_restart_pending 0$/m);
    } finally {
      await close(a);
    }
  });

  test('flow control turned off by a reload: queued requests go on at once, a sheddable one is refused while saturated', async () => {
    let release: (() => void) | undefined;
    const a = await startFakeBackend((r, res) => {
      if (release === undefined) release = () => okJson(r, res);
      else okJson(r, res);
    });
    const objectives = 'objectives:\n- { name: batch, priority: -1 }\n';
    const { file, gw, reloader, close } = await reloadableGateway('fc-off.yaml', config([{ name: 'a', port: a.port }], objectives));
    try {
      await waitForMetrics(gw);
      const first = post(gw, 'holds the only slot');
      await until(() => a.received.length === 1);
      const normal = post(gw, 'normal');
      const batch = post(gw, 'batch', { 'x-llm-d-inference-objective': 'batch' });
      await until(async () => ((await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { totals: { requests: number } }).totals.requests === 2);
      writeFileSync(file, config([{ name: 'a', port: a.port }], `${objectives}featureGates: ["flowControl=false"]\n`));
      assert.equal(await reloader.reloadNow('test'), true);
      const shed = await batch;
      assert.equal(shed.status, 429, shed.text);
      assert.equal(shed.headers['x-llm-d-request-dropped-reason'], 'rejected-saturated');
      assert.equal((await normal).status, 200, 'sent on at once, though the slot is taken');
      // The refused one left the queue without going on: not counted Dispatched.
      const outcomes = (await gw.metrics.flowControlRequestsTotal.get()).values.filter((v) => v.value > 0).map((v) => [v.labels.outcome, v.labels.priority, v.value]);
      assert.deepEqual(outcomes.sort(), [['Dispatched', '0', 2], ['EvictedOther', '-1', 1]]);
      release!();
      assert.equal((await first).status, 200);
      assert.deepEqual(
        a.received.map((r) => JSON.parse(r.body).messages[0].content),
        ['holds the only slot', 'normal'],
      );
    } finally {
      await close(a);
    }
  });

  test('a shutdown while a reload restarts the scraper leaves no scraper running', async () => {
    const a = await startFakeBackend();
    let scrapes = 0;
    const page = a.metrics;
    Object.defineProperty(a, 'metrics', { get: () => (scrapes++, page) });
    const { file, gw, reloader, close } = await reloadableGateway('scraper-race.yaml', config([{ name: 'a', port: a.port }]));
    try {
      await waitForMetrics(gw);
      writeFileSync(file, config([{ name: 'a', port: a.port }]).replace('interval: 20ms', 'interval: 30ms'));
      const reloading = reloader.reloadNow('test');
      await Promise.all([reloading, gw.close()]);
      const after = scrapes;
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(scrapes, after, 'no scrape after the gateway stopped');
    } finally {
      await close(a);
    }
  });

  test('a second trigger for the same file (an edit, then SIGHUP) applies and counts it once', async () => {
    const a = await startFakeBackend();
    const { file, gw, reloader, lines, close } = await reloadableGateway('twice.yaml', config([{ name: 'a', port: a.port }]));
    try {
      // Both result series exist from the start, at 0.
      const before = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(before, /sluice_config_reloads_total\{result="failure"\} 0/);
      assert.match(before, /sluice_config_restart_pending 0/);
      const applied = () => lines().filter((l) => l.msg === 'config reloaded').length;
      const unchanged = () => lines().filter((l) => l.msg === 'config reload: the file gives the configuration in force; nothing to apply').length;
      assert.equal(await reloader.reloadNow('SIGHUP'), true, 'the file as started');
      assert.deepEqual([applied(), unchanged()], [0, 1]);
      writeFileSync(file, config([{ name: 'a', port: a.port }], 'objectives:\n- { name: gold, priority: 5 }\n'));
      assert.equal(await reloader.reloadNow('file change'), true);
      assert.equal(await reloader.reloadNow('SIGHUP'), true);
      assert.deepEqual([applied(), unchanged()], [1, 2]);
      // The log line names the configuration in force as sluice_config_info does.
      const info = /sluice_config_info\{digest="([^"]+)"\} 1/.exec(await (await request(`${gw.metricsUrl}/metrics`)).body.text());
      assert.equal(lines().find((l) => l.msg === 'config reloaded')?.digest, info?.[1]);
      // Comments and key order change nothing in force either.
      writeFileSync(file, `# edited\n${readFileSync(file, 'utf8')}`);
      assert.equal(await reloader.reloadNow('file change'), true);
      assert.deepEqual([applied(), unchanged()], [1, 3]);
      // The same invalid file twice: its problems are logged and counted once.
      writeFileSync(file, 'server:\n  prot: 8080\npool:\n  endpoints: []\n');
      assert.equal(await reloader.reloadNow('file change'), false);
      assert.equal(await reloader.reloadNow('SIGHUP'), false);
      assert.equal(lines().filter((l) => l.msg === 'config reload rejected').length, 1);
      const m = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(m, /sluice_config_reloads_total\{result="success"\} 1/);
      assert.match(m, /sluice_config_reloads_total\{result="failure"\} 1/);
      assert.match(m, /sluice_config_last_reload_successful 0/);
      assert.equal(gw.config.objectives[0]?.name, 'gold', 'still in force');
      // The bad edit reverted: nothing to apply, not counted, but the file is valid and in force again.
      writeFileSync(file, config([{ name: 'a', port: a.port }], 'objectives:\n- { name: gold, priority: 5 }\n'));
      assert.equal(await reloader.reloadNow('file change'), true);
      const reverted = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(reverted, /sluice_config_last_reload_successful 1/);
      assert.match(reverted, /sluice_config_reloads_total\{result="success"\} 1/);
      assert.deepEqual([applied(), unchanged()], [1, 4]);
      // The digest of the configuration in force, as `sluice validate` prints it for the file.
      const digest = /^sluice_config_info\{digest="([0-9a-f]{12})"\} 1$/m.exec(await (await request(`${gw.metricsUrl}/metrics`)).body.text())?.[1];
      assert.equal(digest, effectiveConfigDigest(gw.config));
      assert.notEqual(digest, /^sluice_config_info\{digest="([0-9a-f]{12})"\} 1$/m.exec(before)?.[1], 'changed by the reload');
    } finally {
      await close(a);
    }
  });

  test('an invalid new file is rejected with its errors logged; the old config keeps serving', async () => {
    const a = await startFakeBackend();
    const { file, gw, lines, close } = await reloadableGateway('invalid.yaml', config([{ name: 'a', port: a.port }]), { pollIntervalMs: 20 });
    try {
      await waitForMetrics(gw);
      writeFileSync(file, 'server:\n  prot: 8080\npool:\n  endpoints: []\n');
      await until(() => lines().some((l) => l.msg === 'config reload rejected: the previous configuration keeps serving'), 5000, 'file change noticed');
      const problem = lines().find((l) => l.msg === 'config reload rejected');
      assert.match(String(problem?.problem), /invalid\.yaml:2:3: server\.prot: unknown key "prot" \(did you mean "port"\?\)/);
      assert.deepEqual(
        gw.pool.endpoints.map((e) => e.name),
        ['a'],
      );
      assert.equal((await post(gw, 'still served')).status, 200);
      const m = await (await request(`${gw.metricsUrl}/metrics`)).body.text();
      assert.match(m, /sluice_config_reloads_total\{result="failure"\} 1/);
      assert.match(m, /sluice_config_last_reload_successful 0/);
    } finally {
      await close(a);
    }
  });

  test('a file that sets nothing (a write caught half-way, a template emptied it) is not applied on a reload: the endpoints stay', async () => {
    const a = await startFakeBackend();
    const { file, gw, reloader, lines, close } = await reloadableGateway('empty.yaml', config([{ name: 'a', port: a.port }]));
    try {
      await waitForMetrics(gw);
      for (const text of ['', '\n  \n# only a comment\n', '---\n# emptied by a templating step\n', '~\n', '{}\n']) {
        writeFileSync(file, text);
        assert.equal(await reloader.reloadNow('test'), false);
        assert.deepEqual(gw.pool.endpoints.map((e) => e.name), ['a']);
      }
      assert.match(String(lines().find((l) => l.msg === 'config reload rejected')?.problem), /empty\.yaml:1:1: the file sets nothing \(empty, only comments, or an empty document\): not applied on a reload/);
      assert.equal(lines().filter((l) => l.msg === 'config reload rejected: the previous configuration keeps serving').length + lines().filter((l) => /same problems/.test(String(l.msg))).length, 5);
      assert.equal((await post(gw, 'still served')).status, 200);
    } finally {
      await close(a);
    }
  });

  test('editing the watched file adds an endpoint, and it receives traffic', async () => {
    const a = await startFakeBackend();
    const b = await startFakeBackend();
    const plain = (eps: { name: string; port: number }[]) =>
      `server: { port: 0, metricsPort: 0 }\npool:\n  metrics: { interval: 20ms }\n  endpoints:\n${eps.map((e) => `  - { name: ${e.name}, address: 127.0.0.1, port: ${e.port} }`).join('\n')}\n`;
    const { file, gw, close } = await reloadableGateway('watched.yaml', plain([{ name: 'a', port: a.port }]), { pollIntervalMs: 20 });
    try {
      await waitForMetrics(gw);
      writeFileSync(file, plain([{ name: 'a', port: a.port }, { name: 'b', port: b.port }]));
      await until(() => gw.pool.endpoints.length === 2 && gw.pool.endpoints.every((e) => e.metricsAt > 0), 5000, 'b added');
      for (let i = 0; i < 20 && b.received.length === 0; i++) assert.equal((await post(gw, `spread ${i} ${'x'.repeat(i)}`)).status, 200);
      assert.ok(b.received.length > 0, 'the new endpoint receives traffic');
    } finally {
      await close(a, b);
    }
  });

  test('a throw nothing catches (a bug) ends serve with exit 2 (runtime failure, not 1) and a fatal JSON log line', async () => {
    const a = await startFakeBackend();
    const file = join(dir, 'crash.yaml');
    writeFileSync(file, config([{ name: 'a', port: a.port }]));
    const bug = join(dir, 'bug.mjs');
    // Thrown from a timer once serve has installed its handler (start-up takes long on a busy machine).
    writeFileSync(bug, "const t = setInterval(() => { if (process.listenerCount('uncaughtException') > 0) { clearInterval(t); throw new Error('a bug in a timer'); } }, 20);\n");
    const { p, stdout } = spawnCli(['serve', '--config', file, '--log-level', 'info'], [bug]);
    try {
      const code = await new Promise<number | null>((resolve) => p.once('close', (c) => resolve(c)));
      const out = stdout();
      assert.equal(code, 2, out);
      const fatal = out.split('\n').filter((l) => l.includes('"level":60')).map((l) => JSON.parse(l) as { msg: string; err: { message: string } });
      assert.deepEqual(fatal.map((l) => [l.msg, l.err.message]), [['uncaught exception: exiting', 'a bug in a timer']]);
    } finally {
      p.kill('SIGKILL');
      await a.close();
    }
  });

  test('SIGHUP reloads the running process', async () => {
    const a = await startFakeBackend();
    const b = await startFakeBackend();
    const file = join(dir, 'sighup.yaml');
    writeFileSync(file, config([{ name: 'a', port: a.port }]));
    const gateway = spawnCli(['serve', '--config', file, '--log-level', 'info']);
    const { p } = gateway;
    try {
      const { metricsPort } = await gateway.listening<{ metricsPort: number }>();
      writeFileSync(file, config([{ name: 'b', port: b.port }]));
      p.kill('SIGHUP');
      await until(
        async () => {
          const pool = (await (await request(`http://127.0.0.1:${metricsPort}/debug/pool`)).body.json()) as { endpoints: { name: string }[] };
          return pool.endpoints.length === 1 && pool.endpoints[0]!.name === 'b';
        },
        5000,
        'new endpoint set',
      );
      const code = await exitCodeAfter(p, 'SIGTERM');
      assert.equal(code, 0);
    } finally {
      p.kill('SIGKILL');
      await a.close();
      await b.close();
    }
  });
});

describe('graceful drain of the real process', () => {
  test('SIGTERM with a slow streaming request in flight: the client gets its whole answer, exit 0', async () => {
    const sim = await startSimulator({ name: 'slow', itlMs: 40, ttftOverheadMs: 1 });
    const file = join(dir, 'drain-process.yaml');
    writeFileSync(
      file,
      `server: { port: 0, metricsPort: 0, shutdownGracePeriod: 10s }\npool:\n  metrics: { interval: 20ms }\n  endpoints:\n  - { name: slow, address: 127.0.0.1, port: ${sim.port} }\n`,
    );
    const gateway = spawnCli(['serve', '--config', file, '--log-level', 'info']);
    const { p } = gateway;
    try {
      const { apiPort, metricsPort } = await gateway.listening<{ apiPort: number; metricsPort: number }>();
      await until(async () => (await request(`http://127.0.0.1:${metricsPort}/ready`)).statusCode === 200, 5000, 'ready');
      const r = await request(`http://127.0.0.1:${apiPort}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sim-model', stream: true, max_tokens: 20, messages: [{ role: 'user', content: 'slow' }] }),
      });
      const it = r.body[Symbol.asyncIterator]();
      let text = String((await it.next()).value ?? '');
      const exited = exitCodeAfter(p, 'SIGTERM');
      for (;;) {
        const next = await it.next();
        if (next.done) break;
        text += String(next.value);
      }
      assert.ok(text.trimEnd().endsWith('data: [DONE]'), 'the whole stream arrived');
      assert.equal(text.split('\n').filter((l) => l.startsWith('data: {')).length, 21); // the role-only chunk (as vLLM) + 20 tokens
      assert.equal(await exited, 0);
    } finally {
      p.kill('SIGKILL');
      await sim.close();
    }
  });
});

describe('graceful drain', () => {
  test('a connection to the metrics port that never sends a request does not hold the shutdown', async () => {
    const a = await startFakeBackend();
    const registry = builtinRegistry();
    const file = join(dir, 'drain-metrics.yaml');
    writeFileSync(file, config([{ name: 'a', port: a.port }]));
    const gw = await startGateway(loadConfigFile(file, registry), { registry, host: '127.0.0.1' });
    const silent = net.connect(gw.metricsPort, '127.0.0.1');
    const half = net.connect(gw.metricsPort, '127.0.0.1', () => half.write('GET /metrics HTTP/1.1\r\nHost: x\r\n'));
    try {
      for (const s of [silent, half]) s.on('error', () => undefined);
      await Promise.all([silent, half].map((s) => new Promise((r) => s.once('connect', r))));
      // Nothing in flight: the shutdown is done at once, not when these clients give up.
      const closed = await Promise.race([gw.close().then(() => 'closed'), new Promise((r) => setTimeout(() => r('still waiting after 5 s'), 5000))]);
      assert.equal(closed, 'closed');
    } finally {
      silent.destroy();
      half.destroy();
      await a.close();
    }
  });

  test('readiness turns 503, queued requests get 503 rejected-shutting-down, in-flight ones finish; answers close their connections', async () => {
    const a = await startFakeBackend(slowJson(400));
    const registry = builtinRegistry();
    const file = join(dir, 'drain.yaml');
    writeFileSync(file, config([{ name: 'a', port: a.port }]));
    const gw = await startGateway(loadConfigFile(file, registry), { registry, host: '127.0.0.1' });
    try {
      await waitForMetrics(gw);
      const inFlight = post(gw, 'in-flight');
      await until(() => a.received.length === 1);
      const queued = post(gw, 'queued');
      await until(async () => {
        const fc = (await (await request(`${gw.metricsUrl}/debug/flowcontrol`)).body.json()) as { totals?: { requests: number } };
        return fc.totals?.requests === 1;
      });
      const closing = gw.close();
      const ready = await request(`${gw.metricsUrl}/ready`);
      await ready.body.dump();
      assert.equal(ready.statusCode, 503, 'readiness turns 503 first');
      const q = await queued;
      assert.equal(q.status, 503);
      assert.equal(q.headers['x-llm-d-request-dropped-reason'], 'rejected-shutting-down');
      const done = await inFlight;
      assert.equal(done.status, 200, 'the in-flight request finished');
      // Answers during the drain close their connections: no client sends its next request on one
      // that the end of the drain would cut.
      assert.equal(done.headers['connection'], 'close');
      assert.equal(q.headers['connection'], 'close');
      await closing;
      await assert.rejects(post(gw, 'after'), /ECONNREFUSED/);
      assert.equal(a.received.length, 1, 'the queued request never reached the model server');
    } finally {
      await gw.close();
      await a.close();
    }
  });

  test('requests still running at the end of shutdownGracePeriod end with a 503 reason (a stream: an error event), and the gateway stops', async () => {
    // Never answers a JSON request; starts a stream and never ends it. Two servers of one slot each.
    const stall: Behaviour = (r, res) => {
      if (!JSON.parse(r.body).stream) return;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
    };
    const [a, b] = [await startFakeBackend(stall), await startFakeBackend(stall)];
    const registry = builtinRegistry();
    const file = join(dir, 'drain-cut.yaml');
    writeFileSync(file, config([{ name: 'a', port: a.port }, { name: 'b', port: b.port }]).replace('shutdownGracePeriod: 3s', 'shutdownGracePeriod: 200ms'));
    const { logger, lines } = captureLogger('debug');
    const gw = await startGateway(loadConfigFile(file, registry), { registry, host: '127.0.0.1', logger });
    try {
      await waitForMetrics(gw);
      const stuck = post(gw, 'stuck');
      const streaming = request(`${gw.apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'stream' }] }),
      }).then(async (r) => ({ status: r.statusCode, text: await r.body.text() }));
      await until(() => a.received.length + b.received.length === 2);
      const metricsBefore = gw.metrics;
      await gw.close(); // returns after the grace period: it does not wait for them
      const json = await stuck;
      assert.equal(json.status, 503);
      assert.match(JSON.parse(json.text).error.message, /shutting down and its shutdown grace period is over/);
      const sse = await streaming;
      assert.equal(sse.status, 200);
      assert.match(sse.text, /^data: \{"choices".*\n\ndata: \{"error":\{"message":"the gateway is shutting down and its shutdown grace period is over".*"code":503\}\}\n\ndata: \[DONE\]\n\n$/s);
      assert.ok(lines().some((l) => l.msg === 'shutdown grace period over: requests still in flight were ended with 503' && l.requests === 2));
      // Each request's own line says why, the stream's too (its answer had begun: no error response was sent).
      const done = lines().filter((l) => l.msg === 'request done');
      assert.deepEqual(done.map((l) => [l.status, l.error]), Array(2).fill([503, 'the gateway is shutting down and its shutdown grace period is over']));
      const m = await metricsBefore.text();
      assert.match(m, /llm_d_epp_request_error_total\{model_name="m",target_model_name="m",error_code="503"\} 2/);
      assert.doesNotMatch(m, /sluice_request_cancelled_total\{.*\} [1-9]/, 'not counted as clients that went away');
      await assert.rejects(post(gw, 'after'), /ECONNREFUSED/);
    } finally {
      await gw.close();
      await a.close();
      await b.close();
    }
  });

  test('a stream ended at the end of the grace period behind unread data: its error event still reaches a client that reads on', async () => {
    // 4 MB of events at once, then nothing more: the client, not reading, holds the gateway back.
    const flood: Behaviour = (_r, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const event = `data: {"choices":[{"delta":{"content":"${'x'.repeat(4000)}"}}]}\n\n`;
      let i = 0;
      const pump = (): void => {
        while (i++ < 1000) if (!res.write(event)) return void res.once('drain', pump);
      };
      pump();
    };
    const a = await startFakeBackend(flood);
    const registry = builtinRegistry();
    const file = join(dir, 'drain-backpressure.yaml');
    writeFileSync(file, config([{ name: 'a', port: a.port }]).replace('shutdownGracePeriod: 3s', 'shutdownGracePeriod: 200ms'));
    const gw = await startGateway(loadConfigFile(file, registry), { registry, host: '127.0.0.1' });
    try {
      await waitForMetrics(gw);
      const body = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'flood' }] });
      const s = net.connect(gw.apiPort, '127.0.0.1');
      s.on('error', () => undefined);
      let text = '';
      s.on('data', (c: Buffer) => (text += c.toString('latin1')));
      const closed = new Promise<void>((r) => s.on('close', () => r()));
      s.pause();
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
      await until(() => a.received.length === 1, 3000, 'streaming');
      await new Promise((r) => setTimeout(r, 300)); // the gateway's buffers fill
      const closing = gw.close();
      await new Promise((r) => setTimeout(r, 400)); // the grace period is over: the error event waits behind what is unread
      s.resume();
      await closing;
      await closed;
      // The last chunk of the (chunked) answer is the error event and `[DONE]`, then the answer's end.
      assert.match(text.slice(-400), /data: \{"error":\{"message":"the gateway is shutting down and its shutdown grace period is over"[^\n]*\n\ndata: \[DONE\]\n\n\r\n0\r\n\r\n$/);
    } finally {
      await gw.close();
      await a.close();
    }
  });
});
