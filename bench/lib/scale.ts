/**
 * Scale (issue 7, item 4):
 *   scheduling     — µs per decision vs endpoint count, 8…1024 (bench/lib/sched-sweep.ts, own process);
 *   flow control   — the pure controller with 100k queued (bench/flowcontrol.ts, own process with
 *                    --expose-gc): bytes per queued request, enqueue and dispatch rates;
 *   gateway queue  — a real Sluice holding N queued HTTP requests (backends report saturation):
 *                    RSS per queued request, extrapolated to 100k (the container allows 20k file
 *                    descriptors per process, so 100k real sockets cannot be held), then the time to
 *                    dispatch them all once the backends report free capacity;
 *   soak           — Sluice RSS sampled while wrk pushes N requests (1M full, 100k quick) with a
 *                    distinct ~250-character prompt each (so the prefix index keeps learning and must evict).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runWrk } from './loadgen.js';
import { BENCH_DIR, HOST, MEM_PROBE, REPO_ROOT, cpuSeconds, freePort, memSnapshot, startNode, waitForOk, onCleanup, rssBytes, sleep, stopProcess, type MemSnapshot } from './proc.js';
import { fmt, fmtInt, mb } from './stats.js';
import { backendServed, startFakeBackends, startSluice, type Started } from './targets.js';
import type { SweepPoint } from './sched-sweep.js';
import type { ManyFlowsResult } from '../flowcontrol.js';

export type ScalePart = 'sched' | 'flowcontrol' | 'queue' | 'soak';

export interface ScaleOptions {
  quick: boolean;
  parts: ScalePart[];
  /** Real queued HTTP requests held by the gateway. */
  queueRequests: number;
  soakRequests: number;
  keepTmp: boolean;
  log: (line: string) => void;
}

export interface FlowControlDepth {
  depth: number;
  enqueueNs: number;
  drainNs: number;
  steadyPairNs: number;
  memory: { controllerBytes: number; requestBytes: number } | null;
}

export interface GatewayQueueResult {
  requests: number;
  queuedSeen: number;
  rssIdleMB: number;
  rssQueuedMB: number;
  /** RSS growth / queued requests, both after a full GC. */
  bytesPerQueuedRequest: number;
  /** V8 heap + external growth / queued requests, after a full GC. */
  heapBytesPerQueuedRequest: number;
  bodyBytes: number;
  /** A bare node:http server holding the same requests (Node's floor for HTTP). */
  baseline: HoldBaseline | undefined;
  /** A bare net.Server holding the same connections unparsed (Node's floor for a connection). */
  tcpBaseline?: HoldBaseline | undefined;
  /** rssIdle + 100k × bytesPerQueuedRequest. */
  extrapolated100kMB: number;
  /** Time from "backends free" to the last of the N answers, and the rate. */
  drainSeconds: number;
  drainRps: number;
  answered: number;
  fillSeconds: number;
}

export interface SoakSample {
  t: number;
  requests: number;
  rssMB: number;
}

export interface SoakResult {
  requests: number;
  seconds: number;
  rps: number;
  errors: number;
  samples: SoakSample[];
  startMB: number;
  endMB: number;
  peakMB: number;
  growthMB: number;
  afterIdleMB: number;
  /** Post-GC snapshots after 10 % of the requests and at the end (mem-probe). */
  gcStart: { rssMB: number; heapUsedMB: number } | undefined;
  gcEnd: { rssMB: number; heapUsedMB: number } | undefined;
  cpuUsPerRequest: number;
}

export interface ScaleResult {
  sched?: SweepPoint[];
  flowcontrol?: { depths: FlowControlDepth[]; unsaturatedEnqueueDispatchNs: number; gcExposed: boolean; manyFlows?: ManyFlowsResult[] };
  queue?: GatewayQueueResult;
  soak?: SoakResult;
  errors: Record<string, string>;
}

function runScript(args: string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    let out = '';
    child.stdout?.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr?.on('data', (c: Buffer) => (out += c.toString()));
    const kill = (): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // gone
      }
    };
    const timer = setTimeout(kill, timeoutMs);
    process.once('exit', kill);
    child.on('close', (code) => {
      clearTimeout(timer);
      process.off('exit', kill);
      resolve({ code, out });
    });
  });
}

async function schedSweep(quick: boolean): Promise<SweepPoint[]> {
  const r = await runScript(['--import', 'tsx', join(BENCH_DIR, 'lib', 'sched-sweep.ts'), ...(quick ? ['--quick'] : [])], 180_000);
  const line = r.out.split('\n').find((l) => l.startsWith('SWEEPJSON '));
  if (r.code !== 0 || line === undefined) throw new Error(`sched-sweep failed (exit ${r.code}): ${r.out.slice(-500)}`);
  return JSON.parse(line.slice('SWEEPJSON '.length)) as SweepPoint[];
}

async function flowControl(quick: boolean): Promise<NonNullable<ScaleResult['flowcontrol']>> {
  const r = await runScript(['--expose-gc', '--import', 'tsx', join(BENCH_DIR, 'flowcontrol.ts'), ...(quick ? ['--quick'] : [])], 300_000);
  if (r.code !== 0) throw new Error(`bench/flowcontrol.ts failed (exit ${r.code}): ${r.out.slice(-500)}`);
  const json = JSON.parse(readFileSync(join(BENCH_DIR, 'results', 'flowcontrol.json'), 'utf8')) as {
    depths: FlowControlDepth[];
    unsaturatedEnqueueDispatchNs: number;
    gcExposed: boolean;
    manyFlows: ManyFlowsResult[];
  };
  return { depths: json.depths, unsaturatedEnqueueDispatchNs: json.unsaturatedEnqueueDispatchNs, gcExposed: json.gcExposed, manyFlows: json.manyFlows };
}

export const QUEUE_CONFIG = `flowControl:
  defaultRequestTTL: 300s
  defaultPriorityBand: { maxRequests: 1M, maxBytes: 10G }
`;

/** Requests in the gateway's queue (/debug/flowcontrol totals). */
async function queuedNow(metricsUrl: string): Promise<number> {
  try {
    const res = await fetch(`${metricsUrl}/debug/flowcontrol`, { signal: AbortSignal.timeout(5000) });
    const j = (await res.json()) as { totals?: { requests?: number } };
    return j.totals?.requests ?? NaN;
  } catch {
    return NaN;
  }
}

/** Opens `n` raw HTTP/1.1 connections (500 per 25 ms), each sending one POST that is then left waiting. */
function openHeldRequests(port: number, n: number, body: string, sockets: Socket[]): { startedAt: number; opened: Promise<void>; answered: () => number; lastAnswerAt: () => number } {
  const request = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
  let answered = 0;
  let lastAnswerAt = 0;
  const startedAt = performance.now();
  const opened = (async () => {
    const batch = 500;
    for (let i = 0; i < n; i += batch) {
      for (let k = i; k < Math.min(n, i + batch); k++) {
        const sock = connect({ host: HOST, port });
        sock.setNoDelay(true);
        sock.on('connect', () => sock.write(request));
        let seen = false;
        sock.on('data', (d: Buffer) => {
          if (!seen && d.toString('latin1', 0, 12).startsWith('HTTP/1.1 ')) {
            seen = true;
            answered++;
            lastAnswerAt = performance.now();
          }
        });
        sock.on('error', () => {});
        sockets.push(sock);
      }
      await sleep(25);
    }
  })();
  return { startedAt, opened, answered: () => answered, lastAnswerAt: () => lastAnswerAt };
}

export interface HoldBaseline {
  bytesPerRequest: number;
  heapBytesPerRequest: number;
  held: number;
}

/**
 * The same held requests against bench/lib/hold-server.ts: a bare node:http server (`http`, Node's
 * own cost per waiting HTTP request) or a bare net.Server holding the connections unparsed (`tcp`,
 * the least any Node process pays per open client connection).
 */
async function baselineHold(n: number, body: string, dir: string, mode: 'http' | 'tcp'): Promise<HoldBaseline> {
  const sockets: Socket[] = [];
  const port = await freePort();
  const controlPort = mode === 'tcp' ? await freePort() : port;
  const memFile = join(dir, `hold-${mode}.mem.json`);
  const args = mode === 'tcp' ? [String(port), 'tcp', String(controlPort)] : [String(port)];
  const proc = startNode(`hold-server-${mode}`, join(BENCH_DIR, 'lib', 'hold-server.ts'), args, join(dir, `hold-server-${mode}.log`), ['--expose-gc'], [MEM_PROBE], { BENCH_MEM_FILE: memFile });
  try {
    const ready = await waitForOk(`http://${HOST}:${controlPort}/health`, 20_000, proc);
    if (!ready.ok) throw new Error(`hold-server (${mode}): ${ready.reason}`);
    const idle = await memSnapshot(proc, memFile);
    const client = openHeldRequests(port, n, body, sockets);
    await client.opened;
    let held = 0;
    const deadline = performance.now() + 60_000;
    while (performance.now() < deadline) {
      const r = await fetch(`http://${HOST}:${controlPort}/held`).then((x) => x.json() as Promise<{ held: number }>).catch(() => ({ held: 0 }));
      held = r.held;
      if (held >= n) break;
      await sleep(250);
    }
    await sleep(500);
    const full = await memSnapshot(proc, memFile);
    if (!idle || !full) throw new Error(`no memory snapshot from hold-server (${mode})`);
    const k = Math.max(1, Math.min(n, held));
    return { bytesPerRequest: (full.rss - idle.rss) / k, heapBytesPerRequest: (full.heapUsed + full.external - idle.heapUsed - idle.external) / k, held };
  } finally {
    for (const sock of sockets) sock.destroy();
    await stopProcess(proc);
  }
}

async function gatewayQueue(n: number, dir: string, log: (l: string) => void): Promise<GatewayQueueResult> {
  const started: Started[] = [];
  const sockets: Socket[] = [];
  try {
    const backends = await startFakeBackends(2, dir, { saturated: false });
    started.push(...backends);
    const s = await startSluice(dir, 'sluice-queue', backends.map((b) => ({ name: b.name, port: b.port })), QUEUE_CONFIG, { memProbe: true });
    started.push(s);
    // Warm the proxy path a little (JIT, pools) before measuring the idle RSS.
    const body = JSON.stringify({ model: 'bench-model', messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 16 });
    for (let i = 0; i < 200; i++) {
      await fetch(`${s.baseUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }).then((r) => r.arrayBuffer());
    }
    await Promise.all(backends.map((b) => fetch(`${b.baseUrl}/bench/saturated`, { method: 'POST', body: '1' })));
    await sleep(500); // a scrape or two: the pool reads saturated now
    const idle = await memSnapshot(s.proc, s.memFile);
    const rssIdle = idle?.rss ?? rssBytes(s.proc.child.pid);
    const servedBefore = (await backendServed(backends)).reduce((a, b) => a + b, 0);

    const client = openHeldRequests(s.port, n, body, sockets);
    const fillStart = client.startedAt;
    await client.opened;
    let queued = 0;
    const deadline = performance.now() + 60_000;
    while (performance.now() < deadline) {
      queued = await queuedNow(s.metricsUrl);
      if (queued >= n) break;
      await sleep(250);
    }
    const fillSeconds = (performance.now() - fillStart) / 1000;
    await sleep(500);
    const full = await memSnapshot(s.proc, s.memFile);
    const rssQueued = full?.rss ?? rssBytes(s.proc.child.pid);
    const heapPer = idle && full ? (full.heapUsed + full.external - idle.heapUsed - idle.external) / Math.max(1, Math.min(n, queued)) : NaN;
    log(
      `  gateway queue: ${fmtInt(queued)} of ${fmtInt(n)} requests queued in ${fmt(fillSeconds, 1)} s; RSS after GC ${fmt(mb(rssIdle), 1)} → ${fmt(mb(rssQueued), 1)} MB ` +
        `(heap+external ${fmt(mb((idle?.heapUsed ?? NaN) + (idle?.external ?? NaN)), 1)} → ${fmt(mb((full?.heapUsed ?? NaN) + (full?.external ?? NaN)), 1)} MB)`,
    );

    const openAt = performance.now();
    await Promise.all(backends.map((b) => fetch(`${b.baseUrl}/bench/saturated`, { method: 'POST', body: '0' })));
    const drainDeadline = performance.now() + 120_000;
    while (client.answered() < n && performance.now() < drainDeadline) await sleep(50);
    const answered = client.answered();
    const drainSeconds = ((answered > 0 ? client.lastAnswerAt() : performance.now()) - openAt) / 1000;
    const servedAfter = (await backendServed(backends)).reduce((a, b) => a + b, 0);
    const per = (rssQueued - rssIdle) / Math.max(1, Math.min(n, queued));
    log(
      `  gateway queue: ${fmtInt(answered)} answered (${fmtInt(servedAfter - servedBefore)} reached a backend) ${fmt(drainSeconds, 2)} s after the backends freed up ` +
        `(${fmtInt(answered / Math.max(drainSeconds, 1e-3))} req/s); ${fmtInt(per)} B RSS per queued request → 100k ≈ ${fmt(mb(rssIdle + per * 100_000), 0)} MB`,
    );
    for (const sock of sockets.splice(0)) sock.destroy();
    const baseline = (mode: 'http' | 'tcp') =>
      baselineHold(n, body, dir, mode).catch((err: Error) => {
        log(`  gateway queue: ${mode} baseline failed — ${err.message}`);
        return undefined;
      });
    const base = await baseline('http');
    if (base) {
      log(
        `  baseline (bare node:http holding ${fmtInt(base.held)} parsed requests): ${fmtInt(base.bytesPerRequest)} B RSS, ${fmtInt(base.heapBytesPerRequest)} B heap per request ` +
          `→ Sluice's own share ≈ ${fmtInt(heapPer - base.heapBytesPerRequest)} B heap per queued request`,
      );
    }
    const tcpBase = await baseline('tcp');
    if (tcpBase) {
      log(
        `  floor (bare net.Server holding ${fmtInt(tcpBase.held)} connections, no HTTP): ${fmtInt(tcpBase.bytesPerRequest)} B RSS, ${fmtInt(tcpBase.heapBytesPerRequest)} B heap per connection ` +
          `→ 100k connections alone ≈ ${fmt(mb(tcpBase.bytesPerRequest * 100_000), 0)} MB`,
      );
    }
    return {
      baseline: base,
      tcpBaseline: tcpBase,
      requests: n,
      queuedSeen: queued,
      rssIdleMB: mb(rssIdle),
      rssQueuedMB: mb(rssQueued),
      bytesPerQueuedRequest: per,
      heapBytesPerQueuedRequest: heapPer,
      bodyBytes: Buffer.byteLength(body),
      extrapolated100kMB: mb(rssIdle + per * 100_000),
      drainSeconds,
      drainRps: answered / Math.max(drainSeconds, 1e-3),
      answered,
      fillSeconds,
    };
  } finally {
    for (const sock of sockets) sock.destroy();
    for (const p of started.reverse()) await stopProcess(p.proc);
  }
}

/** A distinct prompt per request (run id + counter first), ~250 characters (4 prefix blocks), so the prefix index keeps growing and must evict. */
const SOAK_WRK_SCRIPT = `
counter = 0
local run = os.getenv("RUN_ID") or "0"
local filler = string.rep("lorem ipsum dolor sit amet consectetur ", 6)
request = function()
  counter = counter + 1
  local body = '{"model":"bench-model","messages":[{"role":"user","content":"' .. run .. '-' .. counter .. ' ' .. filler .. '"}],"max_tokens":16}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKJSON {\\"requests\\":%d,\\"duration_us\\":%d,\\"p50_us\\":%d,\\"p99_us\\":%d,\\"mean_us\\":%f,\\"errors\\":%d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    e.connect + e.read + e.write + e.status + e.timeout))
end
`;

async function soak(target: number, quick: boolean, dir: string, log: (l: string) => void): Promise<SoakResult> {
  const started: Started[] = [];
  try {
    const backends = await startFakeBackends(2, dir);
    started.push(...backends);
    const s = await startSluice(dir, 'sluice-soak', backends.map((b) => ({ name: b.name, port: b.port })), '', { memProbe: true });
    started.push(s);
    const pid = s.proc.child.pid;
    const script = join(dir, 'soak.lua');
    writeFileSync(script, SOAK_WRK_SCRIPT);
    const samples: SoakSample[] = [];
    let done = 0;
    let errors = 0;
    const t0 = performance.now();
    const cpu0 = cpuSeconds(pid);
    samples.push({ t: 0, requests: 0, rssMB: mb(rssBytes(pid)) });
    const sampler = setInterval(() => {
      samples.push({ t: (performance.now() - t0) / 1000, requests: done, rssMB: mb(rssBytes(pid)) });
    }, 1000);
    const chunkSeconds = quick ? 4 : 10;
    let run = 0;
    let lastReport = 0;
    let gcStart: MemSnapshot | undefined;
    try {
      while (done < target) {
        if (gcStart === undefined && done >= target * 0.1) gcStart = await memSnapshot(s.proc, s.memFile);
        // RUN_ID makes every chunk's prompts distinct from the previous chunks' (runWrk passes our environment).
        process.env.RUN_ID = String(run);
        const r = await runWrk(`${s.baseUrl}/v1/chat/completions`, '', 32, chunkSeconds, 1, script);
        done += r.requests;
        errors += r.errors;
        run++;
        if (done - lastReport >= target / 5 || done >= target) {
          lastReport = done;
          log(`  soak: ${fmtInt(done)} requests, ${fmt((performance.now() - t0) / 1000, 0)} s, RSS ${fmt(mb(rssBytes(pid)), 1)} MB`);
        }
      }
    } finally {
      clearInterval(sampler);
      delete process.env.RUN_ID;
    }
    const seconds = (performance.now() - t0) / 1000;
    const cpu1 = cpuSeconds(pid);
    samples.push({ t: seconds, requests: done, rssMB: mb(rssBytes(pid)) });
    await sleep(3000);
    const afterIdleMB = mb(rssBytes(pid));
    const gcEnd = await memSnapshot(s.proc, s.memFile);
    const median = (xs: number[]): number => {
      const a = [...xs].sort((x, y) => x - y);
      return a.length ? a[Math.floor(a.length / 2)]! : NaN;
    };
    // Start = after the first 10 % of the requests (JIT, pools and the prefix index warmed up).
    const startWindow = samples.filter((x) => x.requests >= done * 0.1 && x.requests <= done * 0.2).map((x) => x.rssMB);
    const endWindow = samples.slice(-5).map((x) => x.rssMB);
    const startMB = startWindow.length ? median(startWindow) : samples[1]?.rssMB ?? NaN;
    const endMB = median(endWindow);
    return {
      requests: done,
      seconds,
      rps: done / seconds,
      errors,
      samples,
      startMB,
      endMB,
      peakMB: Math.max(...samples.map((x) => x.rssMB)),
      growthMB: endMB - startMB,
      afterIdleMB,
      gcStart: gcStart && { rssMB: mb(gcStart.rss), heapUsedMB: mb(gcStart.heapUsed) },
      gcEnd: gcEnd && { rssMB: mb(gcEnd.rss), heapUsedMB: mb(gcEnd.heapUsed) },
      cpuUsPerRequest: ((cpu1 - cpu0) * 1e6) / Math.max(1, done),
    };
  } finally {
    for (const p of started.reverse()) await stopProcess(p.proc);
  }
}

export async function runScale(opts: ScaleOptions): Promise<ScaleResult> {
  const log = opts.log;
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-scale-'));
  const removeTmp = (): void => {
    if (!opts.keepTmp) rmSync(dir, { recursive: true, force: true });
  };
  onCleanup(removeTmp);
  const result: ScaleResult = { errors: {} };
  const attempt = async <T>(part: ScalePart, fn: () => Promise<T>): Promise<T | undefined> => {
    if (!opts.parts.includes(part)) return undefined;
    try {
      return await fn();
    } catch (err) {
      result.errors[part] = (err as Error).message;
      log(`  ${part}: FAILED — ${(err as Error).message.split('\n')[0]}`);
      return undefined;
    }
  };
  try {
    result.sched = await attempt('sched', async () => {
      const pts = await schedSweep(opts.quick);
      log(`  scheduling µs/decision (median / p99): ${pts.map((p) => `${p.endpoints}: ${fmt(p.medianUs, 1)}/${fmt(p.p99Us, 0)}`).join('  ')}`);
      return pts;
    });
    result.flowcontrol = await attempt('flowcontrol', async () => {
      const fc = await flowControl(opts.quick);
      const d = fc.depths.find((x) => x.depth === 100_000);
      if (d) {
        const bytes = d.memory ? d.memory.controllerBytes + d.memory.requestBytes : NaN;
        log(
          `  flow control, 100k queued: ${fmt(bytes, 0)} B/request (controller ${fmt(d.memory?.controllerBytes, 0)} + request ${fmt(d.memory?.requestBytes, 0)}), ` +
            `enqueue ${fmtInt(1e9 / d.enqueueNs)}/s, dispatch ${fmtInt(1e9 / d.drainNs)}/s`,
        );
      }
      return fc;
    });
    result.queue = await attempt('queue', () => gatewayQueue(opts.queueRequests, dir, log));
    result.soak = await attempt('soak', async () => {
      const r = await soak(opts.soakRequests, opts.quick, dir, log);
      log(
        `  soak: ${fmtInt(r.requests)} requests in ${fmt(r.seconds, 0)} s (${fmtInt(r.rps)} req/s, ${r.errors} errors, ${fmt(r.cpuUsPerRequest, 0)} µs CPU/request); ` +
          `RSS start ${fmt(r.startMB, 1)} → end ${fmt(r.endMB, 1)} MB (growth ${fmt(r.growthMB, 1)} MB, peak ${fmt(r.peakMB, 1)}, idle after ${fmt(r.afterIdleMB, 1)}); ` +
          `after GC: heap ${fmt(r.gcStart?.heapUsedMB, 1)} → ${fmt(r.gcEnd?.heapUsedMB, 1)} MB, RSS ${fmt(r.gcStart?.rssMB, 1)} → ${fmt(r.gcEnd?.rssMB, 1)} MB`,
      );
      return r;
    });
  } finally {
    removeTmp();
  }
  return result;
}
