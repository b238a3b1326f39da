/**
 * Saturation clears → request sent upstream: how long queued requests wait in the gateway once the
 * scrape that shows free capacity has been recorded (issue target: under 1 ms, plus one scrape
 * interval for the scrape itself to happen).
 *
 * A real gateway (flow control on, utilization detector) in front of a fake model server whose
 * /metrics first report a full queue. N requests are queued; then the fake reports an empty queue.
 * We stamp (a) the moment the pool records the first unsaturated scrape and (b) the moment each
 * queued request reaches the fake server, and print the distribution of (b) − (a), and of
 * (b) − (the moment the fake changed its answer), which includes waiting for the next scrape.
 *
 *   npx tsx bench/release-latency.ts [--quick]
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { startGateway } from '../src/app.js';
import { loadConfigText } from '../src/config/load.js';
import { builtinRegistry } from '../src/plugins/builtin.js';

const QUICK = process.argv.includes('--quick');
const ROUNDS = QUICK ? 5 : 20;
const QUEUED = 20;
const INTERVAL_MS = 50;

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

async function main() {
  let waiting = 50;
  const arrivals: number[] = [];
  const server = http.createServer((req, res) => {
    if (req.url === '/metrics') {
      res.end(`vllm:num_requests_waiting ${waiting}\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n`);
      return;
    }
    arrivals.push(performance.now());
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const registry = builtinRegistry();
  const cfg = `server: { port: 0, metricsPort: 0 }
pool:
  metrics: { interval: ${INTERVAL_MS}ms, timeout: 1s }
  endpoints: [ { name: fake, address: 127.0.0.1, port: ${port} } ]
plugins:
- type: utilization-detector
  parameters: { metricsStalenessThreshold: 2s }
`;
  const gw = await startGateway(loadConfigText(cfg, 'bench.yaml', registry), { registry, host: '127.0.0.1' });
  let recordedAt = 0;
  gw.pool.onChange((reason, ep) => {
    if (reason === 'metrics' && recordedAt === 0 && ep?.metrics?.waiting === 0) recordedAt = performance.now();
  });
  const afterScrape: number[] = [];
  const afterChange: number[] = [];
  const firstAfterScrape: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    waiting = 50;
    await new Promise((r) => setTimeout(r, INTERVAL_MS * 3));
    arrivals.length = 0;
    recordedAt = 0;
    const pending = Array.from({ length: QUEUED }, () =>
      request(`${gw.apiUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"model":"m","messages":[{"role":"user","content":"hi"}]}',
      }).then((r) => r.body.dump()),
    );
    await new Promise((r) => setTimeout(r, INTERVAL_MS * 2 + Math.random() * INTERVAL_MS));
    if (arrivals.length > 0) throw new Error('requests were not held while saturated');
    const changedAt = performance.now();
    waiting = 0;
    await Promise.all(pending);
    firstAfterScrape.push(Math.min(...arrivals) - recordedAt);
    for (const t of arrivals) {
      afterScrape.push(t - recordedAt);
      afterChange.push(t - changedAt);
    }
  }
  await gw.close();
  server.close();

  const row = (name: string, xs: number[]) =>
    `${name.padEnd(44)} p50 ${pct(xs, 50).toFixed(3).padStart(8)} ms   p99 ${pct(xs, 99).toFixed(3).padStart(8)} ms   max ${Math.max(...xs).toFixed(3).padStart(8)} ms`;
  console.log(`release latency: ${ROUNDS} rounds × ${QUEUED} queued requests, scrape interval ${INTERVAL_MS} ms`);
  console.log(row('scrape recorded → FIRST request at upstream', firstAfterScrape));
  console.log(row('unsaturated scrape recorded → sent upstream', afterScrape));
  console.log(row('server reports free capacity → sent upstream', afterChange));
  const met = pct(afterChange, 99) < INTERVAL_MS + 1;
  console.log(`target (free capacity → sent upstream < 1 ms + one scrape interval = ${INTERVAL_MS + 1} ms at p99): ${met ? 'met' : 'NOT met'}`);
  const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'release-latency.json');
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(
    out,
    JSON.stringify({ rounds: ROUNDS, queued: QUEUED, intervalMs: INTERVAL_MS, met, firstAfterScrapeMs: { p50: pct(firstAfterScrape, 50), p99: pct(firstAfterScrape, 99) }, afterScrapeMs: { p50: pct(afterScrape, 50), p99: pct(afterScrape, 99) }, afterChangeMs: { p50: pct(afterChange, 50), p99: pct(afterChange, 99) } }, null, 2),
  );
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
