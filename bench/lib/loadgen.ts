/**
 * Load generators: wrk (closed loop, fixed connections; C, so it costs the box little), wrk paced by
 * think time (a fixed offered rate), autocannon (closed loop from Node, fallback), and a paced
 * open-loop undici client (fixed request rate, latency with sub-millisecond resolution — wrk2 is not
 * packaged, and autocannon's latencies are whole ms).
 */
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Pool } from 'undici';
import { summarize, type Summary } from './stats.js';

export interface LoadResult {
  requests: number;
  seconds: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  /** Non-2xx answers plus connection/read/time-out errors. */
  errors: number;
  p90Ms: number;
  maxMs: number;
}

const WRK_SCRIPT = `
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BENCH_BODY")
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKJSON {\\"requests\\":%d,\\"duration_us\\":%d,\\"p50_us\\":%d,\\"p90_us\\":%d,\\"p99_us\\":%d,\\"max_us\\":%d,\\"mean_us\\":%f,\\"errors\\":%d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    e.connect + e.read + e.write + e.status + e.timeout))
end
`;

/**
 * Paced wrk: each connection waits an exponentially distributed think time (mean BENCH_THINK_MS;
 * wrk waits whole milliseconds) before each request, so the connections together send at about
 * connections / (think + latency) — a fixed offered rate from a C load generator that costs the box
 * little and never stalls for a garbage collection.
 */
const WRK_THINK_SCRIPT =
  WRK_SCRIPT +
  `
local think = tonumber(os.getenv("BENCH_THINK_MS"))
delay = function()
  return math.floor(-math.log(1 - math.random()) * think + 0.5)
end
`;

/**
 * A body template with BODY_COUNTER in it: every request gets its own body (the placeholder replaced
 * by "<BENCH_RUN>-<n>"), built in Lua per request — distinct prompts from wrk.
 */
export const BODY_COUNTER = '@@N@@';

const WRK_TEMPLATE_SCRIPT = `
local template = os.getenv("BENCH_BODY")
local run = os.getenv("BENCH_RUN") or "0"
local i = string.find(template, "${BODY_COUNTER}", 1, true)
local pre = string.sub(template, 1, i - 1)
local post = string.sub(template, i + ${BODY_COUNTER.length})
local headers = { ["Content-Type"] = "application/json" }
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("POST", nil, headers, pre .. run .. "-" .. counter .. post)
end
` + WRK_SCRIPT.slice(WRK_SCRIPT.indexOf('done = function'));

/** Writes the wrk Lua scripts into `dir` and returns the path of the fixed-body one (the templated one is `templateScript(dir)`). */
export function writeWrkScript(dir: string): string {
  const file = join(dir, 'post.lua');
  writeFileSync(file, WRK_SCRIPT);
  writeFileSync(templateScript(dir), WRK_TEMPLATE_SCRIPT);
  writeFileSync(thinkScript(dir), WRK_THINK_SCRIPT);
  return file;
}

function thinkScript(dir: string): string {
  return join(dir, 'post-think.lua');
}

export function templateScript(dir: string): string {
  return join(dir, 'post-template.lua');
}

let runCounter = 0;

export async function runWrk(
  url: string,
  body: string,
  concurrency: number,
  seconds: number,
  threads: number,
  scriptFile: string,
  extraEnv: Record<string, string> = {},
): Promise<LoadResult> {
  const args = [`-t${threads}`, `-c${concurrency}`, `-d${Math.max(1, Math.round(seconds))}s`, '--timeout', '10s', '-s', scriptFile, url];
  // Own process group, killed with the group if we are interrupted (the child is short-lived).
  const env = { ...process.env, ...extraEnv, BENCH_BODY: body, BENCH_RUN: `${process.pid}.${++runCounter}` };
  const child = spawn('wrk', args, { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const kill = (): void => {
    try {
      if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
    } catch {
      // gone
    }
  };
  process.once('exit', kill);
  let out = '';
  child.stdout?.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (out += c.toString()));
  // Not installed (ENOENT): an 'error' event, which unheard would end the whole benchmark.
  let spawnError: Error | undefined;
  child.on('error', (err) => (spawnError = err));
  const code = await new Promise<number | null>((r) => child.on('close', r));
  process.off('exit', kill);
  if (spawnError !== undefined) throw new Error(`wrk could not start (${spawnError.message}): apt-get install -y wrk`);
  const line = out.split('\n').find((l) => l.startsWith('WRKJSON '));
  if (code !== 0 || line === undefined) throw new Error(`wrk failed (exit ${code}):\n${out}`);
  const r = JSON.parse(line.slice('WRKJSON '.length)) as {
    requests: number;
    duration_us: number;
    p50_us: number;
    p90_us: number;
    p99_us: number;
    max_us: number;
    mean_us: number;
    errors: number;
  };
  const secs = r.duration_us / 1e6;
  return {
    requests: r.requests,
    seconds: secs,
    rps: r.requests / secs,
    p50Ms: r.p50_us / 1000,
    p90Ms: r.p90_us / 1000,
    p99Ms: r.p99_us / 1000,
    maxMs: r.max_us / 1000,
    meanMs: r.mean_us / 1000,
    errors: r.errors,
  };
}

/**
 * wrk at a fixed offered rate (`WRK_THINK_SCRIPT`), as a PacedResult. The think time leaves room for
 * about half a millisecond of latency per request; the achieved rate is what the run measured.
 * Latency is wrk's (send → whole response, microsecond histogram); wrk does not measure how late it
 * sent, so `sendLagMs` is empty.
 */
export async function runWrkPaced(url: string, body: string, connections: number, rateRps: number, seconds: number, dir: string): Promise<PacedResult> {
  const thinkMs = Math.max(0, (connections * 1000) / rateRps - 0.5);
  const r = await runWrk(url, body, connections, seconds, 1, thinkScript(dir), { BENCH_THINK_MS: thinkMs.toFixed(3) });
  return {
    targetRps: rateRps,
    achievedRps: r.rps,
    sent: r.requests,
    completed: r.requests - r.errors,
    errors: r.errors,
    latencyMs: { n: r.requests, p50: r.p50Ms, p90: r.p90Ms, p99: r.p99Ms, mean: r.meanMs, max: r.maxMs },
    sendLagMs: summarize([]),
  };
}

/** The part of autocannon's programmatic API used here (the package ships no types). */
interface AutocannonResult {
  requests: { total: number };
  latency: { p50: number; p90: number; p99: number; max: number; mean: number };
  duration: number;
  non2xx: number;
  errors: number;
  timeouts: number;
}
type Autocannon = (opts: { url: string; method: string; headers: Record<string, string>; body: string; connections: number; duration: number }) => Promise<AutocannonResult>;

/** (A BODY_COUNTER placeholder is replaced by one fixed value: autocannon sends the same body every time.) */
export async function runAutocannon(url: string, template: string, concurrency: number, seconds: number): Promise<LoadResult> {
  const autocannon = createRequire(import.meta.url)('autocannon') as Autocannon;
  const body = template.replace(BODY_COUNTER, 'fixed');
  const r = await autocannon({ url, method: 'POST', headers: { 'content-type': 'application/json' }, body, connections: concurrency, duration: seconds });
  return {
    requests: r.requests.total,
    seconds: r.duration,
    rps: r.requests.total / r.duration,
    p50Ms: r.latency.p50,
    p90Ms: r.latency.p90,
    p99Ms: r.latency.p99,
    maxMs: r.latency.max,
    meanMs: r.latency.mean,
    errors: r.non2xx + r.errors + r.timeouts,
  };
}

export interface PacedResult {
  targetRps: number;
  achievedRps: number;
  sent: number;
  completed: number;
  errors: number;
  /** Request latency (send → last body byte), ms. */
  latencyMs: Summary;
  /** How late requests were sent against their schedule (timer granularity), ms. */
  sendLagMs: Summary;
  /**
   * The gateway's event-loop thread over the round, as shares of wall time: on a CPU, and runnable
   * but waiting for one (the box's other processes had the cores). Set by callers that know its pid.
   */
  gateway?: { cpuShare: number; runQueueWaitShare: number };
}

/**
 * Open loop at a fixed rate for `seconds`: request i is due at start + i/rate; every timer tick
 * sends whatever is due. Latency is measured from the actual send (the client never waits for a
 * free connection: the pool has more connections than rate × latency needs).
 */
export async function runPaced(baseUrl: string, path: string, body: string, rate: number, seconds: number, connections = 64): Promise<PacedResult> {
  const pool = new Pool(baseUrl, { connections, pipelining: 1, keepAliveTimeout: 30_000 });
  const latencies: number[] = [];
  const lags: number[] = [];
  let sent = 0;
  let errors = 0;
  const total = Math.max(1, Math.round(rate * seconds));
  const inflight = new Set<Promise<void>>();
  const headers = { 'content-type': 'application/json' };
  const t0 = performance.now();
  const one = async (due: number): Promise<void> => {
    const start = performance.now();
    lags.push(start - due);
    try {
      const res = await pool.request({ path, method: 'POST', headers, body });
      await res.body.dump({ limit: Infinity });
      if (res.statusCode >= 200 && res.statusCode < 300) latencies.push(performance.now() - start);
      else errors++;
    } catch {
      errors++;
    }
  };
  while (sent < total) {
    const now = performance.now();
    const dueCount = Math.min(total, Math.floor(((now - t0) / 1000) * rate) + 1);
    while (sent < dueCount) {
      const due = t0 + (sent / rate) * 1000;
      sent++;
      const p = one(due);
      inflight.add(p);
      void p.finally(() => inflight.delete(p));
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  const sendEnd = performance.now();
  await Promise.race([Promise.all(inflight), new Promise((r) => setTimeout(r, 10_000))]);
  await pool.destroy();
  return {
    targetRps: rate,
    achievedRps: sent / ((sendEnd - t0) / 1000),
    sent,
    completed: latencies.length,
    errors: errors + (sent - latencies.length - errors),
    latencyMs: summarize(latencies),
    sendLagMs: summarize(lags),
  };
}
