/**
 * Soak (issue 8, item 4; minutes, not part of `npm test`): Sluice as its own process in front of
 * three simulators and one flapping simulator, under open-loop mixed streaming / non-streaming load
 * with random client aborts. Reports the gateway's RSS over time, its event-loop delay, and — once
 * the load stopped and everything settled — its counters: every request accounted for, every
 * in-flight counter and queue gauge back to zero.
 *
 *   npx tsx bench/soak.ts [--minutes 3] [--rps 150] [--seed 1] [--keep-tmp]
 *   npx tsx bench/soak.ts --minutes 0.5          # quick
 *
 * Processes (all children in their own process groups, stopped on exit, error and Ctrl-C; registered in
 * lib/soak-proc.ts, not in the shared pid file of lib/proc.ts that `npm run bench` reaps at start-up):
 *   - gateway:  node --import tsx src/cli.ts serve --config <tmp>/soak.yaml --log-level warn (plus the bench
 *               preloads lib/orphan-guard.ts and lib/mem-probe.ts with --expose-gc: nothing added to src/)
 *   - sim-0..2: node --import tsx src/cli.ts sim (15 ms TTFT overhead, 3 ms ITL, 8–64 output tokens)
 *   - flapper:  the same simulator on a fixed port, cycling: 5 s healthy → 5 s failureRate 0.2
 *               (POST /admin/config) → killed (SIGKILL and SIGTERM in turn) → 2 s down → restarted.
 * Traffic goes to 127.0.0.1 only. Arrivals stop at the deadline; at most 1000 requests are open at a
 * time; every request is cut after 30 s; the whole run has a hard deadline (duration + 3 min).
 *
 * Measurements:
 *   - RSS: VmRSS of the gateway process (/proc/<pid>/status) every 5 s; start = just before the load
 *     (after a 2 s warm-up), end = after quiescence. To tell a leak from allocator slack, the heap is also
 *     read after a forced full GC (mem-probe, SIGUSR2) before and after the load.
 *   - Event-loop delay, two ways: prom-client's `nodejs_eventloop_lag_max_seconds` /
 *     `_p99_seconds` from the gateway's /metrics (a perf_hooks histogram with a 10 ms sampling timer,
 *     reset at every scrape; we are the only scraper, every 5 s — so the max of the windows is the max
 *     of the run; a value is the gap between two 10 ms ticks, so an idle loop reads ≈ 10 ms); and the
 *     round-trip of GET /health on the API port every 250 ms on its own connection — an UPPER BOUND
 *     (it also holds the loopback network and the bench's own event loop, whose delay is reported too).
 *   - Counters at the end from /metrics (and /debug/pool): requests accepted, flow-control outcomes,
 *     errors by code, upstream retries, scrape errors, in-flight gauges, queue, request_running.
 *
 * Prints PASS/FAIL for "all back to zero" and "every request accounted for" (exit code 1 if either
 * fails) and writes bench/results/soak.json.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { seededRandom } from '../src/util/clock.js';
import {
  BENCH_DIR,
  HOST,
  MEM_PROBE,
  REPO_ROOT,
  exited,
  cpuSeconds,
  freePort,
  logTail,
  memSnapshot,
  rssBytes,
  sleep,
  waitForOk,
  type Managed,
  type MemSnapshot,
} from './lib/proc.js';
import { startHealthProbe, startLoad, type ClientTally, type Outcome } from './lib/soak-load.js';
import { PromPage } from './lib/soak-prom.js';
import { installSoakCleanup, onSoakExit, startSoakNode, stopAllSoak, stopSoakProcess } from './lib/soak-proc.js';
import { fmt, summarize } from './lib/stats.js';

const CLI = join(REPO_ROOT, 'src', 'cli.ts');
const MODEL = 'sim-model';
const SAMPLE_EVERY_MS = 5000;
const HEALTH_EVERY_MS = 250;
const FLAP = { healthyMs: 5000, failingMs: 5000, failureRate: 0.2, downMs: 2000 };
const SIM_ARGS = [
  '--model', MODEL,
  '--max-num-seqs', '16',
  '--ttft-overhead-ms', '15',
  '--prefill-ms-per-token', '0.05',
  '--itl-ms', '3',
  '--max-output-tokens', '256',
];

const MB = (bytes: number) => bytes / (1024 * 1024);

interface Sample {
  /** Seconds since the load started (negative: before). */
  t: number;
  phase: 'baseline' | 'load' | 'drain' | 'end';
  gatewayRssMB: number;
  benchRssMB: number;
  gatewayHeapUsedMB: number | null;
  /** prom-client window max / p99 since the previous scrape, ms (includes the 10 ms sampling tick). */
  eventLoopMaxMs: number | null;
  eventLoopP99Ms: number | null;
  /** /health round-trips in the window, ms. */
  healthMaxMs: number | null;
  healthP99Ms: number | null;
  healthFailures: number;
  /** The bench's own event-loop delay max in the window, ms: when it spikes with the gateway's, the machine was busy. */
  benchLoopMaxMs: number;
  /** Gateway CPU use in the window, % of one core. */
  gatewayCpuPct: number;
  sent: number;
  clientInFlight: number;
  requestRunning: number | null;
  endpointInFlight: number | null;
  queueSize: number | null;
  flapperUp: boolean;
  /** Machine load average (1 min) — the event-loop figures mean little on a busy machine. */
  loadAvg1: number;
}

interface FlapEvent {
  t: number;
  event: 'failing' | 'down' | 'up' | 'restart-failed';
  detail?: string;
}

async function getText(url: string, timeoutMs = 5000): Promise<string> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return text;
}

function positive(raw: string, what: string): number {
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${what} must be a positive number, got '${raw}'`);
  return n;
}

function gatewayConfig(port: number, metricsPort: number, endpoints: { name: string; port: number }[]): string {
  return `# generated by bench/soak.ts
server:
  host: ${HOST}
  port: ${port}
  metricsPort: ${metricsPort}
  shutdownGracePeriod: 2s
  upstream: { connectTimeout: 1s, retries: 2 }
pool:
  name: soak-pool
  metrics: { interval: 50ms, timeout: 500ms }
  endpoints:
${endpoints.map((e) => `  - name: ${e.name}\n    address: ${HOST}\n    port: ${e.port}`).join('\n')}
objectives:
- { name: interactive, priority: 10 }
- { name: batch, priority: -1 }
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: utilization-detector
  parameters: { queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 250ms, headroom: 0 }
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: queue-scorer, weight: 2 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
flowControl:
  saturationDetector: { pluginRef: utilization-detector }
  defaultRequestTTL: 30s
`;
}

async function startSim(dir: string, name: string, port: number): Promise<Managed> {
  const proc = startSoakNode(name, CLI, ['sim', '--port', String(port), '--name', name, ...SIM_ARGS], join(dir, `${name}.log`));
  const ready = await waitForOk(`http://${HOST}:${port}/health`, 30_000, proc);
  if (!ready.ok) {
    await stopSoakProcess(proc);
    throw new Error(`${name}: ${ready.reason}\n${logTail(proc.logFile)}`);
  }
  return proc;
}

/** Gateway log lines (pino JSON) at warn and above, counted by message. */
function gatewayLogSummary(file: string): { byMessage: Record<string, number>; errors: number; fatal: number; suspicious: string[] } {
  const byMessage: Record<string, number> = {};
  let errors = 0;
  let fatal = 0;
  const suspicious: string[] = [];
  let text = '';
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return { byMessage, errors, fatal, suspicious };
  }
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    let rec: { level?: number; msg?: string } | undefined;
    try {
      rec = JSON.parse(line) as { level?: number; msg?: string };
    } catch {
      rec = undefined;
    }
    const msg = rec?.msg ?? line.slice(0, 120);
    byMessage[msg] = (byMessage[msg] ?? 0) + 1;
    if ((rec?.level ?? 0) >= 50) errors++;
    if ((rec?.level ?? 0) >= 60) fatal++;
    if (/unhandled|uncaught|without a matching acquire|invariant/i.test(line) && suspicious.length < 20) suspicious.push(line.slice(0, 300));
  }
  return { byMessage, errors, fatal, suspicious };
}

let keepDir = true;

/** Child processes that went away without the soak asking them to. */
const unexpectedExits: { t: number; name: string; code: number | null; signal: string | null }[] = [];
let finishing = false;

function watchExit(m: Managed, now: () => number, expected: () => boolean = () => false): void {
  m.child.once('exit', (code, signal) => {
    if (finishing || expected()) return;
    unexpectedExits.push({ t: now(), name: m.name, code, signal });
    console.log(`  !! ${m.name} (pid ${m.child.pid}) exited unexpectedly: code ${code} signal ${signal}\n${logTail(m.logFile, 15)}`);
  });
}

interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      minutes: { type: 'string', default: '3' },
      rps: { type: 'string', default: '150' },
      seed: { type: 'string', default: '1' },
      'keep-tmp': { type: 'boolean', default: false },
    },
    strict: true,
  });
  const minutes = positive(values.minutes ?? '3', 'minutes');
  const rps = positive(values.rps ?? '150', 'rps');
  const seed = Math.round(Number(values.seed ?? '1'));
  const durationMs = Math.round(minutes * 60_000);
  installSoakCleanup();
  const hardDeadline = setTimeout(() => {
    console.error(`soak: hard deadline (${fmt(durationMs / 60_000 + 3, 1)} min) passed; stopping everything`);
    void stopAllSoak().finally(() => process.exit(1));
  }, durationMs + 180_000);
  hardDeadline.unref();

  const dir = mkdtempSync(join(tmpdir(), 'sluice-soak-'));
  // The temp dir (logs, config, final /metrics) is removed after a passing run unless --keep-tmp.
  onSoakExit(() => {
    if (!keepDir) rmSync(dir, { recursive: true, force: true });
    else console.log(`kept ${dir} (logs, config, final metrics)`);
  });
  const log = (l: string) => console.log(l);
  log(`soak: ${fmt(minutes, 2)} min at ${rps} req/s (Poisson), 50% streaming, 10% client aborts, seed ${seed}; tmp ${dir}`);

  // --- fleet: 3 steady simulators + 1 flapper on a fixed port
  const simPorts = [await freePort(), await freePort(), await freePort()];
  const sims = await Promise.all(simPorts.map((p, i) => startSim(dir, `sim-${i}`, p)));
  const flapPort = await freePort();
  let flapper: Managed | undefined = await startSim(dir, 'flapper', flapPort);

  // --- gateway as its own process
  const [apiPort, metricsPort] = [await freePort(), await freePort()];
  const configFile = join(dir, 'soak.yaml');
  writeFileSync(
    configFile,
    gatewayConfig(apiPort, metricsPort, [...simPorts.map((port, i) => ({ name: `sim-${i}`, port })), { name: 'flapper', port: flapPort }]),
  );
  // mem-probe (bench-only preload): on SIGUSR2 a full GC and a memory snapshot, used once before and once after the load.
  const memFile = join(dir, 'gateway.mem.json');
  const gw = startSoakNode('gateway', CLI, ['serve', '--config', configFile, '--log-level', 'warn'], join(dir, 'gateway.log'), ['--expose-gc'], [MEM_PROBE], {
    BENCH_MEM_FILE: memFile,
  });
  const apiUrl = `http://${HOST}:${apiPort}`;
  const metricsUrl = `http://${HOST}:${metricsPort}`;
  const ready = await waitForOk(`${metricsUrl}/ready`, 30_000, gw);
  if (!ready.ok) throw new Error(`gateway did not become ready: ${ready.reason}\n${logTail(gw.logFile)}`);
  const everyoneScraped = Date.now() + 10_000;
  for (;;) {
    const pool = JSON.parse(await getText(`${metricsUrl}/debug/pool`)) as { endpoints: { name: string; metricsAgeSeconds: number | null }[] };
    if (pool.endpoints.every((e) => e.metricsAgeSeconds !== null)) break;
    if (Date.now() > everyoneScraped) throw new Error('the gateway never scraped every endpoint');
    await sleep(100);
  }
  const gwPid = gw.child.pid;
  log(`gateway pid ${gwPid} on ${apiUrl} (metrics ${metricsUrl}); sims ${simPorts.join(', ')}; flapper ${flapPort}`);

  // Warm the gateway's code paths briefly so "RSS start" is the process as it serves, not as it booted.
  const warm = startLoad({
    apiUrl, model: MODEL, rps: Math.min(rps, 50), durationMs: 2000, random: seededRandom(seed + 1000),
    streamShare: 0.5, abortShare: 0, maxAbortDelayMs: 1, requestTimeoutMs: 10_000, maxOutstanding: 100, sheddableShare: 0, tenants: 4,
  });
  const warmTally = await warm.done;
  await warm.close();
  await sleep(500);
  const rssStart = rssBytes(gwPid);
  const gcStart: MemSnapshot | undefined = await memSnapshot(gw, memFile);
  await sleep(200);

  // --- baseline (this scrape also resets prom-client's event-loop histogram)
  const t0 = performance.now();
  const tNow = () => (performance.now() - t0) / 1000;
  for (const m of [gw, ...sims]) watchExit(m, tNow);
  let flapperStopping = false;
  if (flapper) watchExit(flapper, tNow, () => flapperStopping);
  const samples: Sample[] = [];
  const flapEvents: FlapEvent[] = [];
  let flapperUp = true;
  const baselinePage = new PromPage(await getText(`${metricsUrl}/metrics`));
  const baselineAccepted = baselinePage.sum('llm_d_epp_request_total');
  const baselineOutcomes = baselinePage.sum('llm_d_epp_flow_control_requests_total');
  const baselineErrors = baselinePage.by('llm_d_epp_request_error_total', 'error_code');
  const loadAvgStart = loadavg();
  const heapStart = baselinePage.value('nodejs_heap_size_used_bytes');
  if (!baselinePage.has('nodejs_eventloop_lag_max_seconds')) log('note: the gateway exposes no nodejs_eventloop_lag_max_seconds; only the /health bound is reported');

  const probe = startHealthProbe(apiUrl, '/health', HEALTH_EVERY_MS, 10_000);
  const load = startLoad({
    apiUrl, model: MODEL, rps, durationMs, random: seededRandom(seed),
    streamShare: 0.5, abortShare: 0.1, maxAbortDelayMs: 300, requestTimeoutMs: 30_000, maxOutstanding: 1000, sheddableShare: 0.1, tenants: 4,
  });
  let phase: Sample['phase'] = 'load';
  log(`load started: ${warmTally.sent} warm-up requests before (not counted below); RSS start ${fmt(MB(rssStart), 1)} MB`);

  // --- sampler: RSS + /metrics every 5 s
  let sampling = true;
  let scrapeFailures = 0;
  let lastCpu = { at: performance.now(), cpu: cpuSeconds(gwPid) };
  const takeSample = async (p: Sample['phase']): Promise<Sample> => {
    let page: PromPage | undefined;
    try {
      page = new PromPage(await getText(`${metricsUrl}/metrics`));
    } catch {
      scrapeFailures++;
    }
    const h = probe.take();
    const hs = h.rtts.length ? summarize(h.rtts) : undefined;
    const cpuNow = { at: performance.now(), cpu: cpuSeconds(gwPid) };
    const cpuPct = ((cpuNow.cpu - lastCpu.cpu) / ((cpuNow.at - lastCpu.at) / 1000)) * 100;
    lastCpu = cpuNow;
    const s: Sample = {
      t: Math.round(tNow() * 10) / 10,
      phase: p,
      gatewayRssMB: MB(rssBytes(gwPid)),
      benchRssMB: MB(process.memoryUsage().rss),
      gatewayHeapUsedMB: page?.value('nodejs_heap_size_used_bytes') !== undefined ? MB(page.value('nodejs_heap_size_used_bytes')!) : null,
      eventLoopMaxMs: page?.value('nodejs_eventloop_lag_max_seconds') !== undefined ? page.value('nodejs_eventloop_lag_max_seconds')! * 1000 : null,
      eventLoopP99Ms: page?.value('nodejs_eventloop_lag_p99_seconds') !== undefined ? page.value('nodejs_eventloop_lag_p99_seconds')! * 1000 : null,
      healthMaxMs: hs ? hs.max : null,
      healthP99Ms: hs ? hs.p99 : null,
      healthFailures: h.failures,
      benchLoopMaxMs: h.ownMaxMs,
      gatewayCpuPct: cpuPct,
      sent: load.tally.sent,
      clientInFlight: load.tally.inFlight,
      requestRunning: page ? page.sum('llm_d_epp_request_running') : null,
      endpointInFlight: page ? page.sum('llm_d_epp_endpoint_inflight_requests') : null,
      queueSize: page ? page.sum('llm_d_epp_flow_control_queue_size') : null,
      flapperUp,
      loadAvg1: loadavg()[0]!,
    };
    samples.push(s);
    log(
      `  t=${fmt(s.t, 0).padStart(4)}s ${p.padEnd(5)} sent ${String(s.sent).padStart(6)}  rss ${fmt(s.gatewayRssMB, 1).padStart(6)} MB` +
        `  heap ${fmt(s.gatewayHeapUsedMB ?? NaN, 1).padStart(5)} MB  el max ${fmt(s.eventLoopMaxMs ?? NaN, 1).padStart(6)} ms` +
        `  /health max ${fmt(s.healthMaxMs ?? NaN, 1).padStart(6)} ms  bench el max ${fmt(s.benchLoopMaxMs, 1).padStart(6)} ms  gw cpu ${fmt(s.gatewayCpuPct, 0).padStart(3)}%` +
        `  open ${String(s.clientInFlight).padStart(4)}` +
        `  running ${s.requestRunning ?? '–'}  in-flight ${s.endpointInFlight ?? '–'}  queue ${s.queueSize ?? '–'}  flapper ${s.flapperUp ? 'up' : 'DOWN'}`,
    );
    return s;
  };
  const sampler = (async () => {
    let next = SAMPLE_EVERY_MS;
    while (sampling) {
      const wait = t0 + next - performance.now();
      if (wait > 0) await sleep(Math.min(wait, 200));
      else {
        next += SAMPLE_EVERY_MS;
        if (sampling) await takeSample(phase);
      }
    }
  })();

  // --- flapper: healthy → failing → killed → down → restarted, until the load ends
  let flapping = true;
  const pause = async (ms: number) => {
    const until = performance.now() + ms;
    while (flapping && performance.now() < until) await sleep(Math.min(100, until - performance.now()));
    return flapping;
  };
  const flapEvent = (e: FlapEvent) => {
    flapEvents.push(e);
    log(`  t=${fmt(e.t, 1).padStart(4)}s flapper ${e.event}${e.detail ? ` (${e.detail})` : ''}`);
  };
  const flapLoop = (async () => {
    for (let cycle = 0; flapping; cycle++) {
      if (!(await pause(FLAP.healthyMs))) break;
      try {
        await getText(`http://${HOST}:${flapPort}/admin/config`, 2000); // still alive?
        const res = await fetch(`http://${HOST}:${flapPort}/admin/config`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ failureRate: FLAP.failureRate }),
          signal: AbortSignal.timeout(2000),
        });
        await res.arrayBuffer();
        flapEvent({ t: tNow(), event: 'failing', detail: `failureRate ${FLAP.failureRate}` });
      } catch (err) {
        flapEvent({ t: tNow(), event: 'failing', detail: `could not set failureRate: ${(err as Error).message}` });
      }
      if (!(await pause(FLAP.failingMs))) break;
      const signal: NodeJS.Signals = cycle % 2 === 0 ? 'SIGKILL' : 'SIGTERM';
      if (flapper) {
        flapperStopping = true;
        await stopSoakProcess(flapper, 2000, signal === 'SIGKILL'); // SIGKILL: a crash, no graceful anything
        flapper = undefined;
      }
      flapperUp = false;
      flapEvent({ t: tNow(), event: 'down', detail: signal });
      if (!(await pause(FLAP.downMs))) break;
      const t1 = performance.now();
      try {
        flapper = await startSim(dir, 'flapper', flapPort);
        flapperStopping = false;
        watchExit(flapper, tNow, () => flapperStopping);
        flapperUp = true;
        flapEvent({ t: tNow(), event: 'up', detail: `restart took ${Math.round(performance.now() - t1)} ms` });
      } catch (err) {
        flapEvent({ t: tNow(), event: 'restart-failed', detail: (err as Error).message.split('\n')[0] });
      }
    }
  })();

  const tally: ClientTally = await load.done;
  const loadSeconds = tNow();
  flapping = false;
  await flapLoop;
  await load.close();
  phase = 'drain';
  log(`load over after ${fmt(loadSeconds, 1)} s: ${tally.sent} sent; waiting for quiescence`);

  // --- quiescence: nothing running, nothing in flight, nothing queued (bounded)
  let quiet: PromPage | undefined;
  const quietBy = performance.now() + 20_000;
  while (performance.now() < quietBy) {
    try {
      const page = new PromPage(await getText(`${metricsUrl}/metrics`));
      if (
        page.nonZero('llm_d_epp_endpoint_inflight_requests').length === 0 &&
        page.sum('llm_d_epp_flow_control_queue_size') === 0 &&
        page.sum('llm_d_epp_request_running') === 0
      ) {
        quiet = page;
        break;
      }
    } catch {
      scrapeFailures++;
    }
    await sleep(250);
  }
  const quiescenceSeconds = tNow() - loadSeconds;
  await sleep(500); // let a last scrape cycle of the pool run
  sampling = false;
  await sampler;
  const endSample = await takeSample('end');
  let finalText = '';
  let debugPool: { endpoints: { name: string; inFlight: number; scrapeErrors?: number; stale: boolean }[] } = { endpoints: [] };
  let finalError: string | undefined;
  try {
    finalText = await getText(`${metricsUrl}/metrics`);
    debugPool = JSON.parse(await getText(`${metricsUrl}/debug/pool`)) as typeof debugPool;
  } catch (err) {
    finalError = (err as Error).message;
  }
  const final = new PromPage(finalText);
  const rssEnd = rssBytes(gwPid);
  await probe.stop();
  const gcEnd: MemSnapshot | undefined = await memSnapshot(gw, memFile);
  const loadAvgEnd = loadavg();
  const gatewayAlive = !exited(gw.child) && finalError === undefined;
  finishing = true;
  writeFileSync(join(dir, 'final-metrics.txt'), finalText);

  // --- figures
  const o = tally.outcomes;
  const aborted = o['aborted-before-headers'] + o['aborted-after-headers'];
  const outcomeSum = (Object.values(o) as number[]).reduce((a, b) => a + b, 0);
  const accepted = final.sum('llm_d_epp_request_total') - baselineAccepted;
  const fcOutcomesAll = final.by('llm_d_epp_flow_control_requests_total', 'outcome');
  const fcTotal = final.sum('llm_d_epp_flow_control_requests_total') - baselineOutcomes;
  const fcOutcomes: Record<string, number> = { ...fcOutcomesAll };
  const baseFc = baselinePage.by('llm_d_epp_flow_control_requests_total', 'outcome');
  for (const [k, v] of Object.entries(baseFc)) fcOutcomes[k] = (fcOutcomes[k] ?? 0) - v;
  const gwErrors: Record<string, number> = final.by('llm_d_epp_request_error_total', 'error_code');
  for (const [k, v] of Object.entries(baselineErrors)) gwErrors[k] = (gwErrors[k] ?? 0) - v;
  for (const k of Object.keys(gwErrors)) if (gwErrors[k] === 0) delete gwErrors[k];
  const gwErrorTotal = Object.values(gwErrors).reduce((a, b) => a + b, 0);
  const retries = final.by('llm_d_epp_upstream_retries_total', 'endpoint_name');
  const scrapeErrors = final.by('llm_d_epp_datalayer_poll_errors_total', 'endpoint_name');
  const schedFailures = final.sum('llm_d_epp_scheduler_attempts_total', { status: 'failure' });
  const inflightSeries = final.series('llm_d_epp_endpoint_inflight_requests').map((s) => ({ endpoint: s.labels.endpoint_name ?? '', value: s.value }));
  const queueSize = final.sum('llm_d_epp_flow_control_queue_size');
  const queueBytes = final.sum('llm_d_epp_flow_control_queue_bytes');
  const running = final.sum('llm_d_epp_request_running');
  const clientErrStatuses: Record<string, number> = {};
  for (const [code, n] of Object.entries(tally.statuses)) if (Number(code) >= 400) clientErrStatuses[code] = n;
  const logSummary = gatewayLogSummary(gw.logFile);

  const loadSamples = samples.filter((s) => s.phase === 'load');
  const allRss = samples.map((s) => s.gatewayRssMB).concat([MB(rssStart), MB(rssEnd)]).filter(Number.isFinite);
  const rssPeak = Math.max(...allRss);
  const mid = loadSamples.find((s) => s.t >= loadSeconds / 2);
  const lastLoad = loadSamples[loadSamples.length - 1];
  const eldWindows = samples.map((s) => s.eventLoopMaxMs).filter((v): v is number => v !== null);
  const eldLoadWindows = loadSamples.map((s) => s.eventLoopMaxMs).filter((v): v is number => v !== null);
  const eldP99Windows = loadSamples.map((s) => s.eventLoopP99Ms).filter((v): v is number => v !== null);
  const health = summarize(probe.all);
  const own = probe.ownDelay();

  // --- checks
  const alive: Check = {
    name: 'gateway ran throughout and answered /metrics at the end',
    ok: gatewayAlive && !unexpectedExits.some((e) => e.name === 'gateway'),
    detail: gatewayAlive ? `pid ${gwPid}` : `gone (${finalError ?? 'exited'})`,
  };
  const zero: Check[] = [
    alive,
    { name: 'client: no request left open', ok: tally.inFlight === 0, detail: `${tally.inFlight} open` },
    {
      name: 'llm_d_epp_endpoint_inflight_requests all 0',
      ok: inflightSeries.every((s) => s.value === 0),
      detail: inflightSeries.map((s) => `${s.endpoint}=${s.value}`).join(' '),
    },
    {
      name: '/debug/pool inFlight all 0',
      ok: debugPool.endpoints.every((e) => e.inFlight === 0),
      detail: debugPool.endpoints.map((e) => `${e.name}=${e.inFlight}`).join(' '),
    },
    { name: 'llm_d_epp_flow_control_queue_size = 0 (and queue_bytes = 0)', ok: queueSize === 0 && queueBytes === 0, detail: `${queueSize} requests, ${queueBytes} bytes` },
    { name: 'llm_d_epp_request_running = 0', ok: running === 0, detail: String(running) },
  ];
  const headered = tally.sent - o['aborted-before-headers'] - o.timeout - o['transport-error'];
  const errBoundLow = o['http-error'] + o['stream-error-event'];
  const errBoundHigh = o['http-error'] + o['stream-error-event'] + o['stream-truncated'] + o['json-invalid'] + o['transport-error'] + o.timeout + aborted;
  const perCode = Object.entries(clientErrStatuses).map(([code, n]) => ({ code, client: n, gateway: gwErrors[code] ?? 0 }));
  const accounted: Check[] = [
    { name: 'client: one outcome per request sent', ok: outcomeSum === tally.sent, detail: `${outcomeSum} outcomes / ${tally.sent} sent` },
    {
      name: 'flow-control outcomes sum = llm_d_epp_request_total (accepted)',
      ok: fcTotal === accepted,
      detail: `${fcTotal} outcomes / ${accepted} accepted`,
    },
    {
      name: 'accepted within [requests that got headers, requests sent]',
      ok: accepted >= headered && accepted <= tally.sent,
      detail: `${headered} ≤ ${accepted} ≤ ${tally.sent}`,
    },
    {
      name: 'gateway error count per status ≥ client-seen (502 incl. in-stream error events)',
      ok: perCode.every((p) => p.gateway >= p.client + (p.code === '502' ? o['stream-error-event'] : 0)) && (o['stream-error-event'] === 0 || (gwErrors['502'] ?? 0) >= o['stream-error-event']),
      detail: perCode.map((p) => `${p.code}: gw ${p.gateway} / client ${p.client}`).join(', ') + (o['stream-error-event'] ? `; in-stream errors ${o['stream-error-event']}` : ''),
    },
    {
      name: 'gateway errors within [client-seen errors, client-seen + aborted + broken]',
      ok: gwErrorTotal >= errBoundLow && gwErrorTotal <= errBoundHigh,
      detail: `${errBoundLow} ≤ ${gwErrorTotal} ≤ ${errBoundHigh}`,
    },
    { name: 'no double release / unhandled rejection in the gateway log', ok: logSummary.suspicious.length === 0, detail: logSummary.suspicious.length ? logSummary.suspicious[0]! : 'none' },
    alive,
  ];
  if (!gatewayAlive) {
    // Nothing to read the counters from: every gateway-side check is failed, not vacuously passed.
    for (const c of [...zero, ...accounted]) {
      if (c === alive || c.name.startsWith('client:')) continue;
      c.ok = false;
      c.detail = 'no data: the gateway is gone';
    }
  }
  const zeroOk = zero.every((c) => c.ok) && quiet !== undefined;
  const accountedOk = accounted.every((c) => c.ok);
  const runValid = unexpectedExits.length === 0;

  // --- report
  const pad = (s: string, n: number) => s.padEnd(n);
  log('');
  log(`requests: ${tally.sent} sent in ${fmt(loadSeconds, 1)} s (${fmt(tally.sent / loadSeconds, 1)}/s; ${tally.streaming} streaming), ${tally.skipped} not sent (too many open); ${tally.abortsPlanned} drew a random abort`);
  log(`client outcomes: ${(Object.entries(o) as [Outcome, number][]).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`).join(', ')}`);
  log(`client statuses: ${Object.entries(tally.statuses).map(([k, n]) => `${k} ${n}`).join(', ')}`);
  if (Object.keys(tally.transportErrors).length) log(`client transport errors: ${JSON.stringify(tally.transportErrors)}`);
  const lj = summarize(tally.latencyJsonMs);
  const ls = summarize(tally.latencyStreamMs);
  const lt = summarize(tally.ttfbStreamMs);
  log(`client latency of ok answers: json p50 ${fmt(lj.p50, 1)} / p99 ${fmt(lj.p99, 1)} ms; stream first byte p50 ${fmt(lt.p50, 1)} / p99 ${fmt(lt.p99, 1)} ms, whole p50 ${fmt(ls.p50, 1)} / p99 ${fmt(ls.p99, 1)} ms`);
  log(`gateway: accepted ${accepted}; flow control ${Object.entries(fcOutcomes).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`).join(', ')}`);
  log(`gateway errors by code: ${Object.keys(gwErrors).length ? Object.entries(gwErrors).map(([k, n]) => `${k} ${n}`).join(', ') : 'none'}`);
  log(`upstream retries: ${Object.entries(retries).map(([k, n]) => `${k} ${n}`).join(', ') || 'none'}; scheduler failures ${schedFailures}`);
  log(`scrape errors: ${Object.entries(scrapeErrors).map(([k, n]) => `${k} ${n}`).join(', ') || 'none'}`);
  log(`flapper: ${flapEvents.filter((e) => e.event === 'down').length} kills, ${flapEvents.filter((e) => e.event === 'up').length} restarts, ${flapEvents.filter((e) => e.event === 'failing').length} failing phases${flapEvents.some((e) => e.event === 'restart-failed') ? ', RESTART FAILURES' : ''}`);
  log(`gateway log (warn+): ${Object.entries(logSummary.byMessage).sort((a, b) => b[1] - a[1]).slice(0, 6).map(([k, n]) => `"${k}" ×${n}`).join(', ') || 'empty'}`);
  log('');
  log(`RSS (gateway, VmRSS): start ${fmt(MB(rssStart), 1)} MB, peak ${fmt(rssPeak, 1)} MB, end ${fmt(MB(rssEnd), 1)} MB; growth ${fmt(MB(rssEnd - rssStart), 1)} MB` +
    (mid && lastLoad ? `; second half of the load ${fmt(lastLoad.gatewayRssMB - mid.gatewayRssMB, 1)} MB (t=${fmt(mid.t, 0)}→${fmt(lastLoad.t, 0)} s)` : ''));
  log(
    `heap used (gateway, after a forced full GC): start ${fmt(gcStart ? MB(gcStart.heapUsed) : NaN, 1)} MB, end ${fmt(gcEnd ? MB(gcEnd.heapUsed) : NaN, 1)} MB` +
      ` (RSS after GC ${fmt(gcStart ? MB(gcStart.rss) : NaN, 1)} → ${fmt(gcEnd ? MB(gcEnd.rss) : NaN, 1)} MB); without GC: ${fmt(MB(heapStart ?? NaN), 1)} → ${fmt(endSample.gatewayHeapUsedMB ?? NaN, 1)} MB`,
  );
  log(`machine: ${cpus().length} CPUs, load average ${fmt(loadAvgStart[0], 2)} at the start, ${fmt(loadAvgEnd[0], 2)} at the end (max over samples ${fmt(Math.max(...samples.map((x) => x.loadAvg1)), 2)})`);
  log(`event-loop delay (gateway, prom-client, 10 ms tick included): max ${fmt(Math.max(...eldWindows), 1)} ms (under load ${fmt(Math.max(...eldLoadWindows), 1)} ms), worst 5-s window p99 ${fmt(Math.max(...eldP99Windows), 1)} ms`);
  log(`/health round-trip every ${HEALTH_EVERY_MS} ms (upper bound): p50 ${fmt(health.p50, 2)} ms, p99 ${fmt(health.p99, 2)} ms, max ${fmt(health.max, 1)} ms over ${health.n} probes, ${probe.failures} failed; bench's own loop delay max ${fmt(own.maxMs, 1)} ms`);
  log(`quiescence reached ${quiet ? `${fmt(quiescenceSeconds, 1)} s after the load` : 'NEVER (20 s)'}`);
  log('');
  for (const c of zero) log(`  ${c.ok ? '✓' : '✗'} ${pad(c.name, 66)} ${c.detail}`);
  log(`${zeroOk ? 'PASS' : 'FAIL'}: all back to zero (in flight, queue, running)`);
  for (const c of accounted) log(`  ${c.ok ? '✓' : '✗'} ${pad(c.name, 66)} ${c.detail}`);
  log(`${accountedOk ? 'PASS' : 'FAIL'}: every request accounted for`);
  if (!runValid) log(`RUN INVALID: processes exited unexpectedly: ${unexpectedExits.map((e) => `${e.name} at t=${fmt(e.t, 1)} s (code ${e.code}, signal ${e.signal})`).join('; ')}`);
  if (!zeroOk || !accountedOk) log(`\n--- gateway log (tail) ---\n${logTail(gw.logFile, 30)}`);

  const out = join(BENCH_DIR, 'results', 'soak.json');
  mkdirSync(join(BENCH_DIR, 'results'), { recursive: true });
  const report = {
    date: new Date().toISOString(),
    node: process.version,
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model,
    loadAverage: { start: loadAvgStart, end: loadAvgEnd },
    settings: { minutes, rps, seed, streamShare: 0.5, abortShare: 0.1, maxAbortDelayMs: 300, sheddableShare: 0.1, tenants: 4, sims: 3, simArgs: SIM_ARGS, flap: FLAP },
    requests: {
      sent: tally.sent,
      seconds: loadSeconds,
      achievedRps: tally.sent / loadSeconds,
      streaming: tally.streaming,
      skipped: tally.skipped,
      abortsPlanned: tally.abortsPlanned,
      warmupRequests: warmTally.sent,
      clientOutcomes: o,
      clientStatuses: tally.statuses,
      clientTransportErrors: tally.transportErrors,
      latencyMs: { json: lj, streamFirstByte: lt, stream: ls },
    },
    gateway: {
      accepted,
      flowControlOutcomes: fcOutcomes,
      errorsByCode: gwErrors,
      upstreamRetries: retries,
      scrapeErrors,
      schedulerFailures: schedFailures,
      endpointInFlight: inflightSeries,
      queueSize,
      queueBytes,
      requestRunning: running,
      debugPool: debugPool.endpoints,
      logWarnPlus: logSummary.byMessage,
      logErrors: logSummary.errors,
      metricScrapeFailures: scrapeFailures,
    },
    rss: {
      startMB: MB(rssStart),
      peakMB: rssPeak,
      endMB: MB(rssEnd),
      growthMB: MB(rssEnd - rssStart),
      secondHalfGrowthMB: mid && lastLoad ? lastLoad.gatewayRssMB - mid.gatewayRssMB : null,
      heapUsedStartMB: heapStart !== undefined ? MB(heapStart) : null,
      heapUsedEndMB: endSample.gatewayHeapUsedMB,
      afterGcStart: gcStart ? { rssMB: MB(gcStart.rss), heapUsedMB: MB(gcStart.heapUsed), externalMB: MB(gcStart.external) } : null,
      afterGcEnd: gcEnd ? { rssMB: MB(gcEnd.rss), heapUsedMB: MB(gcEnd.heapUsed), externalMB: MB(gcEnd.external) } : null,
      heapAfterGcGrowthMB: gcStart && gcEnd ? MB(gcEnd.heapUsed - gcStart.heapUsed) : null,
    },
    eventLoop: {
      note:
        'promMaxMs: max over 5-s windows of nodejs_eventloop_lag_max_seconds (perf_hooks histogram, 10 ms tick included). ' +
        'health*: GET /health round-trips every 250 ms: an upper bound (includes loopback and the bench\'s own loop).',
      promMaxMs: eldWindows.length ? Math.max(...eldWindows) : null,
      promMaxUnderLoadMs: eldLoadWindows.length ? Math.max(...eldLoadWindows) : null,
      promWorstWindowP99Ms: eldP99Windows.length ? Math.max(...eldP99Windows) : null,
      health: { ...health, failures: probe.failures },
      benchOwnDelayMaxMs: own.maxMs,
    },
    quiescenceSeconds: quiet ? quiescenceSeconds : null,
    unexpectedExits,
    checks: { allBackToZero: { pass: zeroOk, checks: zero }, everyRequestAccounted: { pass: accountedOk, checks: accounted } },
    flapEvents,
    samples,
  };
  writeFileSync(out, `${JSON.stringify(report, null, 2)}\n`);
  log(`\nwrote ${out}${values['keep-tmp'] ? `; logs and final /metrics in ${dir}` : ''}`);
  const pass = zeroOk && accountedOk && runValid;
  if (pass && !(values['keep-tmp'] ?? false)) keepDir = false;
  return pass ? 0 : 1;
}

main().then(
  async (code) => {
    await stopAllSoak();
    process.exit(code);
  },
  async (err: unknown) => {
    console.error(`soak failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
    await stopAllSoak();
    process.exit(1);
  },
);
