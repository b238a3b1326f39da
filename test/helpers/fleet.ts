/** Real loopback fleets for integration tests: simulators (or custom servers) + a gateway in front. */
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino, { type Logger } from 'pino';
import { startGateway, type Gateway, type GatewayOptions } from '../../src/app.js';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { startSimulator, type RunningSimulator, type SimOptions } from '../../src/sim/server.js';
import { until } from './wait.js';

export interface FleetEndpoint {
  name: string;
  port: number;
  labels?: Record<string, string>;
}

/** Builds a config text for endpoints on 127.0.0.1 with fast scraping; `extra` is appended YAML. */
export function fleetConfig(endpoints: FleetEndpoint[], extra = '', server = ''): string {
  const eps = endpoints
    .map((e) => {
      const labels = e.labels ? `\n    labels: ${JSON.stringify(e.labels)}` : '';
      return `  - name: ${e.name}\n    address: 127.0.0.1\n    port: ${e.port}${labels}`;
    })
    .join('\n');
  return `server:
  port: 0
  metricsPort: 0
  shutdownGracePeriod: 2s
  upstream: { connectTimeout: 1s, retries: 2 }${server}
pool:
  name: test-pool
  metrics: { interval: 20ms, timeout: 500ms }
  endpoints:${endpoints.length ? '\n' + eps : ' []'}
${extra}`;
}

/** Prefill and decode profiles (`queue-scorer` each), every request disaggregated with `connector`: a fleet's `extra`. */
export const alwaysDisaggProfiles = (connector: 'sidecar' | 'nixlv2' | 'shared-storage'): string => `plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters: { deciders: { prefill: always-disagg-pd-decider }, connector: ${connector} }
schedulingProfiles:
- name: decode
  plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer } ]
- name: prefill
  plugins: [ { pluginRef: prefill-filter }, { pluginRef: queue-scorer } ]
`;

export async function gatewayFor(configText: string, opts: GatewayOptions = {}): Promise<Gateway> {
  const registry = builtinRegistry();
  const loaded = loadConfigText(configText, 'test.yaml', registry);
  return startGateway(loaded, { registry, host: '127.0.0.1', ...opts });
}

/** A pino logger whose JSON lines land in `lines` (to assert on what operators would see). */
export function captureLogger(level = 'info'): { logger: Logger; lines: () => Record<string, unknown>[] } {
  const out: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      out.push(...chunk.toString().split('\n').filter((l) => l.length > 0));
      cb();
    },
  });
  return { logger: pino({ level }, stream), lines: () => out.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

/**
 * Runs `run` against a gateway started from `configText` in front of `backend` (once its metrics
 * are scraped, unless `waitMetrics` is false); closes both afterwards, whatever `run` throws.
 */
export async function withGateway(
  backend: { close(): Promise<void> },
  configText: string,
  run: (gw: Gateway) => Promise<void>,
  opts: GatewayOptions & { waitMetrics?: boolean } = {},
): Promise<void> {
  let gw: Gateway | undefined;
  try {
    gw = await gatewayFor(configText, opts);
    if (opts.waitMetrics !== false) await waitForMetrics(gw);
    await run(gw);
  } finally {
    await gw?.close();
    await backend.close();
  }
}

/** Waits until every endpoint of the gateway has metrics (or throws after `ms`). */
export async function waitForMetrics(gw: Gateway, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (gw.pool.endpoints.every((e) => e.metricsAt > 0)) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('endpoints never got metrics');
}

export interface Fleet {
  sims: RunningSimulator[];
  gw: Gateway;
  close(): Promise<void>;
}

export async function startFleet(
  n: number,
  simOpts: SimOptions = {},
  extra = '',
  labels?: (i: number) => Record<string, string> | undefined,
): Promise<Fleet> {
  const sims = await Promise.all(
    Array.from({ length: n }, (_, i) => startSimulator({ name: `sim-${i}`, ttftOverheadMs: 1, itlMs: 1, prefillMsPerToken: 0, ...simOpts })),
  );
  const gw = await gatewayFor(fleetConfig(sims.map((s, i) => ({ name: s.name, port: s.port, labels: labels?.(i) })), extra));
  await waitForMetrics(gw);
  return {
    sims,
    gw,
    async close() {
      await gw.close();
      await Promise.all(sims.map((s) => s.close()));
    },
  };
}

/** Waits until no endpoint counts a request or prompt tokens in flight; a failure names what is left. */
export async function nothingInFlight(gw: Gateway, ms = 3000): Promise<void> {
  const left = () => gw.pool.endpoints.filter((e) => e.inFlight !== 0 || e.inFlightTokens !== 0).map((e) => `${e.name}=${e.inFlight}/${e.inFlightTokens}`);
  try {
    await until(() => left().length === 0, ms, 'nothing left in flight');
  } catch {
    assert.fail(`still in flight (requests/prompt tokens): ${left().join(' ')}`);
  }
}
