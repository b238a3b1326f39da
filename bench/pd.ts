/**
 * Prefill/decode benchmark: Sluice running the nixlv2 connector (both legs by the gateway) in front
 * of simulators, every request disaggregated (always-disagg-pd-decider). Measures what the gateway
 * adds between the prefill answer and the decode request:
 *
 *   gateway gap  — prefill answer fully received (undici `request:trailers`) → decode request created
 *                  (`request:create`): parsing the prefill answer, building the decode body and
 *                  headers, in-flight accounting — the gateway's own code;
 *   wire gap     — prefill answer fully received → decode request headers written to the socket
 *                  (`client:sendHeaders`): the above plus getting a pooled connection. undici (7.x)
 *                  writes to an idle keep-alive socket only after one setImmediate (its idle-socket
 *                  validation, GHSA-35p6-xmwp-9g52), so under load this includes one full event-loop
 *                  iteration — a cost of every upstream request, not of P/D.
 *
 * Both are taken with undici's diagnostics channels inside the gateway process (target: p99 well
 * under 1 ms). The simulators and the load generator run in a child process (this file with
 * `--child`) so that the gateway's event loop carries nothing else. Prints p50/p90/p99/max per
 * concurrency and mode, end-to-end client latency and req/s; writes bench/results/pd.json.
 *
 *   npx tsx bench/pd.ts [--quick] [--requests N] [--concurrency 1,16,64] [--modes json,sse] [--prompt-chars 4000]
 */
import { fork, type ChildProcess } from 'node:child_process';
import diagnosticsChannel from 'node:diagnostics_channel';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';

const SCRIPT = fileURLToPath(import.meta.url);
const REPO_ROOT = resolve(dirname(SCRIPT), '..');
const HOST = '127.0.0.1';
const MODEL = 'bench-model';

type Mode = 'json' | 'sse';

// ================================================================================================
// Child: simulators + load generator

interface ChildReady {
  type: 'ready';
  prefill: number[];
  decode: number[];
}
interface RunCommand {
  type: 'run';
  url: string;
  concurrency: number;
  requests: number;
  mode: Mode;
  promptChars: number;
  runId: string;
}
interface RunResult {
  type: 'result';
  latenciesMs: number[];
  errors: number;
  statuses: Record<string, number>;
  seconds: number;
}

async function runChild(): Promise<void> {
  const { startSimulator } = await import('../src/sim/server.js');
  const simOpts = {
    host: HOST,
    model: MODEL,
    maxNumSeqs: 512,
    ttftOverheadMs: 0,
    prefillMsPerToken: 0,
    itlMs: 0,
    kvTransferMs: 0,
    kvTransferMsPerToken: 0,
    defaultOutputTokens: 8,
  };
  const sims = await Promise.all(
    ['prefill-0', 'prefill-1', 'decode-0', 'decode-1'].map((name) => startSimulator({ ...simOpts, name })),
  );
  const send = (m: ChildReady | RunResult) => process.send!(m);
  send({ type: 'ready', prefill: sims.slice(0, 2).map((s) => s.port), decode: sims.slice(2).map((s) => s.port) });

  process.on('message', async (msg: RunCommand | { type: 'exit' }) => {
    if (msg.type === 'exit') {
      await Promise.all(sims.map((s) => s.close()));
      process.exit(0);
    }
    send(await load(msg));
  });
}

async function load(cmd: RunCommand): Promise<RunResult> {
  const pool = new Pool(cmd.url, { connections: cmd.concurrency, pipelining: 1 });
  const latencies: number[] = [];
  const statuses: Record<string, number> = {};
  let errors = 0;
  let next = 0;
  const filler = 'The keeper opens the paddles slowly so the lock fills without a surge. ';
  const body = (i: number): string => {
    // Unique per request (no prefix sharing between requests), about promptChars long.
    const text = `[${cmd.runId}-${i}] ` + filler.repeat(Math.ceil(cmd.promptChars / filler.length)).slice(0, cmd.promptChars);
    return JSON.stringify({
      model: MODEL,
      max_tokens: 8,
      messages: [{ role: 'user', content: text }],
      ...(cmd.mode === 'sse' ? { stream: true, stream_options: { include_usage: true } } : {}),
    });
  };
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= cmd.requests) return;
      const t0 = performance.now();
      try {
        const r = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body: body(i) });
        await r.body.text();
        statuses[r.statusCode] = (statuses[r.statusCode] ?? 0) + 1;
        if (r.statusCode !== 200) errors++;
      } catch {
        errors++;
      }
      latencies.push(performance.now() - t0);
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: cmd.concurrency }, worker));
  const seconds = (performance.now() - start) / 1000;
  await pool.close();
  return { type: 'result', latenciesMs: latencies, errors, statuses, seconds };
}

// ================================================================================================
// Parent: the gateway, the measurement, the report

interface Stats {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  mean: number;
}

function stats(values: number[]): Stats {
  const v = [...values].sort((a, b) => a - b);
  const at = (q: number) => v[Math.min(v.length - 1, Math.max(0, Math.ceil(q * v.length) - 1))] ?? NaN;
  const mean = v.reduce((s, x) => s + x, 0) / (v.length || 1);
  return { n: v.length, p50: at(0.5), p90: at(0.9), p99: at(0.99), max: v[v.length - 1] ?? NaN, mean };
}

/** Per request id: when its prefill answer completed, and when its decode request was created / sent. */
interface Marks {
  prefillDone?: number;
  decodeCreated?: number;
  decodeSent?: number;
}

function headerValue(headers: unknown, name: string): string | undefined {
  if (!Array.isArray(headers)) return undefined;
  for (let i = 0; i + 1 < headers.length; i += 2) {
    if (String(headers[i]).toLowerCase() === name) return String(headers[i + 1]);
  }
  return undefined;
}

function instrument(prefillOrigins: Set<string>, decodeOrigins: Set<string>) {
  const marks = new Map<string, Marks>();
  const mark = (request: { origin?: unknown; headers?: unknown }, field: keyof Marks, leg: 'prefill' | 'decode') => {
    const origin = String(request.origin ?? '');
    if (!(leg === 'prefill' ? prefillOrigins : decodeOrigins).has(origin)) return;
    const id = headerValue(request.headers, 'x-request-id');
    if (id === undefined) return;
    let m = marks.get(id);
    if (m === undefined) marks.set(id, (m = {}));
    m[field] ??= performance.now();
  };
  const onTrailers = (msg: unknown) => mark((msg as { request: { origin: unknown; headers: unknown } }).request, 'prefillDone', 'prefill');
  const onCreate = (msg: unknown) => mark((msg as { request: { origin: unknown; headers: unknown } }).request, 'decodeCreated', 'decode');
  const onSend = (msg: unknown) => mark((msg as { request: { origin: unknown; headers: unknown } }).request, 'decodeSent', 'decode');
  diagnosticsChannel.subscribe('undici:request:trailers', onTrailers);
  diagnosticsChannel.subscribe('undici:request:create', onCreate);
  diagnosticsChannel.subscribe('undici:client:sendHeaders', onSend);
  return {
    marks,
    stop() {
      diagnosticsChannel.unsubscribe('undici:request:trailers', onTrailers);
      diagnosticsChannel.unsubscribe('undici:request:create', onCreate);
      diagnosticsChannel.unsubscribe('undici:client:sendHeaders', onSend);
    },
  };
}

function gatewayConfig(prefill: number[], decode: number[]): string {
  const eps = [
    ...prefill.map((port, i) => `  - { name: prefill-${i}, address: ${HOST}, port: ${port}, labels: { llm-d.ai/role: prefill } }`),
    ...decode.map((port, i) => `  - { name: decode-${i}, address: ${HOST}, port: ${port}, labels: { llm-d.ai/role: decode } }`),
  ].join('\n');
  return `server:
  port: 0
  metricsPort: 0
  upstream: { connections: 256 }
pool:
  name: bench-pool
  metrics: { interval: 50ms, timeout: 1s }
  endpoints:
${eps}
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: prefix-cache-scorer
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters: { deciders: { prefill: always-disagg-pd-decider }, connector: nixlv2 }
- type: utilization-detector
  parameters: { queueDepthThreshold: 1000000, kvCacheUtilThreshold: 1, metricsStalenessThreshold: 5s }
schedulingProfiles:
- name: decode
  plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer }, { pluginRef: prefix-cache-scorer } ]
- name: prefill
  plugins: [ { pluginRef: prefill-filter }, { pluginRef: queue-scorer }, { pluginRef: prefix-cache-scorer } ]
flowControl:
  saturationDetector: { pluginRef: utilization-detector }
`;
}

function request<T>(child: ChildProcess, msg: RunCommand): Promise<T> {
  return new Promise((resolvePromise) => {
    child.once('message', (m) => resolvePromise(m as T));
    child.send(msg);
  });
}

const fmt = (ms: number) => (ms < 1 ? `${(ms * 1000).toFixed(0)} µs` : `${ms.toFixed(2)} ms`);

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      requests: { type: 'string' },
      concurrency: { type: 'string', default: '1,16,64' },
      modes: { type: 'string', default: 'json,sse' },
      'prompt-chars': { type: 'string', default: '4000' },
      child: { type: 'boolean', default: false },
    },
  });
  if (values.child) return runChild();

  const quick = values.quick === true;
  const requests = Number(values.requests ?? (quick ? 400 : 3000));
  const levels = values.concurrency!.split(',').map(Number);
  const modes = values.modes!.split(',') as Mode[];
  const promptChars = Number(values['prompt-chars']);

  const { startGateway } = await import('../src/app.js');
  const { loadConfigText } = await import('../src/config/load.js');
  const { builtinRegistry } = await import('../src/plugins/builtin.js');

  const child = fork(SCRIPT, ['--child'], { cwd: REPO_ROOT, execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  let gw: Awaited<ReturnType<typeof startGateway>> | undefined;
  try {
    const ready = await new Promise<ChildReady>((res, rej) => {
      child.once('message', (m) => res(m as ChildReady));
      child.once('exit', (code) => rej(new Error(`child exited ${code}`)));
    });
    const registry = builtinRegistry();
    gw = await startGateway(loadConfigText(gatewayConfig(ready.prefill, ready.decode), 'bench-pd.yaml', registry), { registry, host: HOST });
    const end = Date.now() + 5000;
    while (!gw.pool.endpoints.every((e) => e.metricsAt > 0) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));

    const prefillOrigins = new Set(ready.prefill.map((p) => `http://${HOST}:${p}`));
    const decodeOrigins = new Set(ready.decode.map((p) => `http://${HOST}:${p}`));
    const runs: Record<string, unknown>[] = [];
    console.log(`P/D (nixlv2) on simulators: ${requests} requests per run, prompt ≈ ${promptChars} chars, every request disaggregated`);
    console.log('mode  conc   req/s   e2e p50    e2e p99 | gateway gap p50   p90      p99      max   | wire gap p50   p99   | gw CPU/req');
    for (const mode of modes) {
      for (const concurrency of levels) {
        // Warm-up: connections, JIT.
        await request<RunResult>(child, { type: 'run', url: gw.apiUrl, concurrency, requests: Math.min(200, requests), mode, promptChars, runId: `warm-${mode}-${concurrency}` });
        const probe = instrument(prefillOrigins, decodeOrigins);
        const cpu0 = process.cpuUsage();
        const r = await request<RunResult>(child, { type: 'run', url: gw.apiUrl, concurrency, requests, mode, promptChars, runId: `${mode}-${concurrency}` });
        const cpu = process.cpuUsage(cpu0);
        probe.stop();
        const cpuUsPerRequest = (cpu.user + cpu.system) / r.latenciesMs.length;
        const gatewayGaps: number[] = [];
        const wireGaps: number[] = [];
        for (const m of probe.marks.values()) {
          if (m.prefillDone === undefined) continue;
          if (m.decodeCreated !== undefined) gatewayGaps.push(m.decodeCreated - m.prefillDone);
          if (m.decodeSent !== undefined) wireGaps.push(m.decodeSent - m.prefillDone);
        }
        const g = stats(gatewayGaps);
        const w = stats(wireGaps);
        const e2e = stats(r.latenciesMs);
        const rps = r.latenciesMs.length / r.seconds;
        console.log(
          `${mode.padEnd(5)} ${String(concurrency).padStart(4)} ${rps.toFixed(0).padStart(7)} ${fmt(e2e.p50).padStart(10)} ${fmt(e2e.p99).padStart(10)} | ` +
            `${fmt(g.p50).padStart(10)} ${fmt(g.p90).padStart(8)} ${fmt(g.p99).padStart(8)} ${fmt(g.max).padStart(9)} | ${fmt(w.p50).padStart(10)} ${fmt(w.p99).padStart(8)} | ${cpuUsPerRequest.toFixed(0).padStart(5)} µs` +
            (r.errors > 0 ? `  errors=${r.errors} ${JSON.stringify(r.statuses)}` : ''),
        );
        if (g.n < r.latenciesMs.length * 0.99) console.log(`  warning: only ${g.n} of ${r.latenciesMs.length} requests had both legs measured`);
        runs.push({ mode, concurrency, requests: r.latenciesMs.length, errors: r.errors, reqPerSec: rps, gatewayCpuUsPerRequest: cpuUsPerRequest, e2eMs: e2e, gatewayGapMs: g, wireGapMs: w });
      }
    }
    const out = join(REPO_ROOT, 'bench', 'results', 'pd.json');
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(
      out,
      JSON.stringify(
        { date: new Date().toISOString(), node: process.version, cpus: cpus().length, cpuModel: cpus()[0]?.model ?? '', quick, promptChars, runs },
        null,
        2,
      ) + '\n',
    );
    console.log(`wrote ${out}`);
  } finally {
    await gw?.close();
    child.send({ type: 'exit' });
    await new Promise((r) => {
      const t = setTimeout(() => {
        child.kill('SIGKILL');
        r(undefined);
      }, 3000);
      child.once('exit', () => {
        clearTimeout(t);
        r(undefined);
      });
    });
  }
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
