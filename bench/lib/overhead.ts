/**
 * Proxy overhead (issue 7, item 2). Two fast fake backends behind
 *   direct        — nothing (backend 0 alone),
 *   nginx         — nginx `least_conn` + upstream keepalive over both,
 *   node-proxy    — a bare node:http + undici pass-through over both (lib/node-proxy.ts): Node's floor,
 *   sluice        — Sluice, default config (queue ×2, kv ×2, prefix ×3; flow control on),
 *   sluice-3s     — Sluice, explicit three-scorer profile (prefix ×3, queue ×2, active-request ×2),
 * closed-loop at fixed concurrency (wrk, else autocannon) for JSON and SSE, with a short prompt
 * (direct / nginx / node-proxy / sluice) and a 4 KB prompt (the same with sluice-3s), in interleaved
 * rounds (the box is shared and drifts: each target's median round counts). Then, at half of
 * Sluice's measured JSON throughput, the p99 latency Sluice adds at a load it can carry: measured by
 * wrk paced with think time (judged: a C client with no stalls of its own) and by an open-loop undici
 * client (shown beside it: its own event-loop stalls land in its tail).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MODEL } from './fake-backend.js';
import { BODY_COUNTER, runAutocannon, runPaced, runWrk, runWrkPaced, templateScript, writeWrkScript, type LoadResult, type PacedResult } from './loadgen.js';
import { summarizeDir, type ProfileSummary } from './cpuprofile.js';
import { cpuSeconds, onCleanup, schedStat, stopProcess } from './proc.js';
import { fmt, fmtInt, textTable } from './stats.js';
import { backendServed, hasCommand, startFakeBackends, startNginx, startNodeProxy, startSluice, type Backend, type Started } from './targets.js';

export type Mode = 'json' | 'sse';
export type PromptCase = 'short' | '4kb';
export type OverheadTarget = 'direct' | 'nginx' | 'node-proxy' | 'sluice' | 'sluice-3s';

export interface OverheadOptions {
  quick: boolean;
  concurrency: number;
  /** Length of one closed-loop round. */
  seconds: number;
  /** Closed-loop rounds per target, interleaved across targets; the median round (by req/s) counts. */
  rounds: number;
  warmupSeconds: number;
  pacedSeconds: number;
  /** Rounds of the open-loop comparison (the median round's p99 counts). */
  pacedRounds: number;
  loadgen: 'wrk' | 'autocannon';
  modes: Mode[];
  cases: PromptCase[];
  targets: OverheadTarget[];
  keepTmp: boolean;
  /** CPU-profile the Node gateways (node-proxy, sluice, sluice-3s; node --cpu-prof): hot functions and flame trees. */
  profile: boolean;
  log: (line: string) => void;
}

export interface OverheadRun extends LoadResult {
  case: PromptCase;
  mode: Mode;
  target: OverheadTarget;
  /** Share of the requests each backend served during the run. */
  backendShare: number[];
  /** CPU seconds the proxy process used per 1000 requests (nginx: master only, workers not counted → omitted). */
  proxyCpuMsPerRequest?: number;
  /** req/s of every round, in order (the fields above are the median round's). */
  roundsRps?: number[];
}

export interface OverheadRatio {
  case: PromptCase;
  mode: Mode;
  of: string;
  throughput: number;
  p50: number;
  p99: number;
}

/** The open-loop rounds compare these; `node-proxy` shows what any Node gateway adds on this box. */
export const PACED_TARGETS = ['direct', 'nginx', 'node-proxy', 'sluice'] as const;
export type PacedTarget = (typeof PACED_TARGETS)[number];
export type PacedResults = Partial<Record<PacedTarget, PacedResult>>;

/** What Sluice (and the bare Node proxy) add over direct, from the median-p99 round of each. */
export interface AddedLatency {
  /** Sluice p99 − direct p99, ms. */
  addedP99Ms?: number;
  addedP50Ms?: number;
  /** The bare Node proxy's p99 − direct p99, ms (Node's own floor in the same rounds). */
  nodeAddedP99Ms?: number;
  /** Every round, per target (the target fields hold the median-p99 round). */
  rounds?: Partial<Record<PacedTarget, PacedResult[]>>;
}

/** The open-loop undici client's rounds (the target fields), then wrk's at the same rate. */
export interface PacedComparison extends PacedResults, AddedLatency {
  /** Half of Sluice's closed-loop JSON throughput (short prompt). */
  rateRps: number;
  seconds: number;
  /** The same at a low fixed rate: the latency each hop adds when nothing queues. */
  low?: PacedResults & { rateRps: number; seconds: number };
  /**
   * wrk at the same offered rate (connections with exponential think time): a C client that never
   * stalls for a collection of its own, where the undici client's event-loop stalls (5–15 ms on
   * this box) land in its tail. When present, the added-latency target is judged on it.
   */
  wrk?: PacedResults & AddedLatency & { connections: number };
}

/** Connections of both paced clients. */
const PACED_CONNECTIONS = 64;

export interface OverheadResult {
  options: Omit<OverheadOptions, 'log' | 'keepTmp'>;
  backend: { sseChunks: number; sseChunkGapMs: number };
  sluice3sProfile: string;
  runs: OverheadRun[];
  ratios: OverheadRatio[];
  paced: PacedComparison;
  skipped: Record<string, string>;
  /** With --profile: self-time summaries and flame trees of each Node gateway over its whole life (all its runs). */
  profiles?: Partial<Record<OverheadTarget, ProfileSummary>>;
}

export const THREE_SCORER_PROFILE = `plugins:
- type: prefix-cache-scorer
- type: queue-scorer
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: prefix-cache-scorer, weight: 3 }
  - { pluginRef: queue-scorer, weight: 2 }
  - { pluginRef: active-request-scorer, weight: 2 }
`;

const WORDS = 'the of and to in is you that it he was for on are as with his they at be this have from or one had by'.split(' ');

function words(chars: number, seed: number): string {
  let out = '';
  let x = seed;
  while (out.length < chars) {
    x = (x * 1103515245 + 12345) >>> 0;
    out += WORDS[x % WORDS.length]! + ' ';
  }
  return out.slice(0, chars);
}

/**
 * The request body. The 4 KB prompt starts with BODY_COUNTER, which wrk replaces per request: every
 * prompt is distinct from its first block, so Sluice hashes and learns all of it each time, and no
 * prefix affinity piles identical prompts onto one backend (that would measure the backend).
 */
export function overheadBody(mode: Mode, promptCase: PromptCase): string {
  const content = promptCase === 'short' ? 'Say hello.' : `${BODY_COUNTER} ${words(4096 - BODY_COUNTER.length - 1, 7)}`;
  return JSON.stringify({
    model: MODEL,
    messages: [{ role: 'user', content }],
    max_tokens: 16,
    ...(mode === 'sse' ? { stream: true, stream_options: { include_usage: true } } : {}),
  });
}

/** One JSON and one SSE request through the target, so we never benchmark an error page. */
async function probe(baseUrl: string): Promise<string | undefined> {
  for (const mode of ['json', 'sse'] as const) {
    try {
      const res = await fetch(`${baseUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: overheadBody(mode, '4kb').replace(BODY_COUNTER, 'probe'),
        signal: AbortSignal.timeout(5000),
      });
      const text = await res.text();
      if (res.status !== 200) return `${mode} probe: HTTP ${res.status} ${text.slice(0, 200)}`;
      if (mode === 'json' && !text.includes('hi from')) return `json probe: unexpected body ${text.slice(0, 200)}`;
      if (mode === 'sse' && !text.includes('data: [DONE]')) return `sse probe: stream did not end with [DONE]: ${text.slice(0, 200)}`;
    } catch (err) {
      return `${mode} probe failed: ${(err as Error).message}`;
    }
  }
  return undefined;
}

/** Rate of the "nothing queued" latency runs. */
const LOW_RATE = 200;

type TargetUrls = ReadonlyMap<OverheadTarget, { baseUrl: string; proc?: Started['proc'] }>;

/**
 * Rounds of one paced measurement, interleaving the PACED_TARGETS present (a burst of load from
 * elsewhere on the box hits one round of each). The round with the median p99 stands for each
 * target; every round is kept. Also what Sluice and the bare Node proxy add over direct.
 */
async function pacedRounds(urls: TargetUrls, rounds: number, run: (baseUrl: string) => Promise<PacedResult>, log: (line: string) => void): Promise<PacedResults & AddedLatency> {
  const all: Partial<Record<PacedTarget, PacedResult[]>> = {};
  for (let round = 0; round < rounds; round++) {
    for (const target of PACED_TARGETS) {
      const t = urls.get(target);
      if (t === undefined) continue;
      // nginx's pid is its master, not the worker that does the work.
      const pid = target === 'nginx' ? undefined : t.proc?.child.pid;
      const before = schedStat(pid);
      const startedAt = performance.now();
      const r = await run(t.baseUrl);
      const after = schedStat(pid);
      const wallMs = performance.now() - startedAt;
      if (before !== undefined && after !== undefined && wallMs > 0) {
        r.gateway = { cpuShare: (after.cpuMs - before.cpuMs) / wallMs, runQueueWaitShare: (after.waitMs - before.waitMs) / wallMs };
      }
      (all[target] ??= []).push(r);
    }
  }
  const out: PacedResults & AddedLatency = { rounds: all };
  for (const target of PACED_TARGETS) {
    const list = all[target];
    if (!list?.length) continue;
    const r = [...list].sort((a, b) => a.latencyMs.p99 - b.latencyMs.p99)[Math.floor((list.length - 1) / 2)]!;
    out[target] = r;
    const lag = Number.isNaN(r.sendLagMs.p99) ? '' : `  send lag p99 ${fmt(r.sendLagMs.p99, 2)} ms`;
    log(
      `    ${target.padEnd(10)} sent ${r.sent} (${fmtInt(r.achievedRps)} req/s)  p50 ${fmt(r.latencyMs.p50, 3)} ms  p99 ${fmt(r.latencyMs.p99, 3)} ms  max ${fmt(r.latencyMs.max, 1)} ms` +
        `${lag}${r.errors ? `  ${r.errors} ERRORS` : ''}  (p99 of the rounds: ${list.map((x) => fmt(x.latencyMs.p99, 2)).join(', ')})` +
        (r.gateway ? `  gateway on CPU ${fmt(r.gateway.cpuShare * 100, 0)} %, waiting for a CPU ${fmt(r.gateway.runQueueWaitShare * 100, 1)} % of the time` : ''),
    );
  }
  if (out.sluice && out.direct) {
    out.addedP99Ms = out.sluice.latencyMs.p99 - out.direct.latencyMs.p99;
    out.addedP50Ms = out.sluice.latencyMs.p50 - out.direct.latencyMs.p50;
    log(`    Sluice adds p50 ${fmt(out.addedP50Ms, 3)} ms, p99 ${fmt(out.addedP99Ms, 3)} ms over direct`);
  }
  const node = out['node-proxy'];
  if (node && out.direct) out.nodeAddedP99Ms = node.latencyMs.p99 - out.direct.latencyMs.p99;
  return out;
}

const PAIRS: Array<[OverheadTarget, OverheadTarget]> = [
  ['sluice', 'nginx'],
  ['sluice', 'direct'],
  ['sluice', 'node-proxy'],
  ['sluice-3s', 'nginx'],
  ['sluice-3s', 'direct'],
  ['sluice-3s', 'node-proxy'],
  ['node-proxy', 'nginx'],
  ['nginx', 'direct'],
];

function ratios(runs: OverheadRun[]): OverheadRatio[] {
  const out: OverheadRatio[] = [];
  for (const c of ['short', '4kb'] as const) {
    for (const mode of ['json', 'sse'] as const) {
      for (const [a, b] of PAIRS) {
        const ra = runs.find((r) => r.case === c && r.mode === mode && r.target === a);
        const rb = runs.find((r) => r.case === c && r.mode === mode && r.target === b);
        if (ra === undefined || rb === undefined) continue;
        out.push({ case: c, mode, of: `${a}/${b}`, throughput: ra.rps / rb.rps, p50: ra.p50Ms / rb.p50Ms, p99: ra.p99Ms / rb.p99Ms });
      }
    }
  }
  return out;
}

export async function runOverhead(opts: OverheadOptions): Promise<OverheadResult> {
  const log = opts.log;
  const tmp = mkdtempSync(join(tmpdir(), 'sluice-bench-overhead-'));
  const removeTmp = (): void => {
    if (!opts.keepTmp) rmSync(tmp, { recursive: true, force: true });
  };
  onCleanup(removeTmp);
  const skipped: Record<string, string> = {};
  const runs: OverheadRun[] = [];
  const started: Started[] = [];
  const urls = new Map<OverheadTarget, Started | { baseUrl: string; proc?: undefined }>();
  const paced: PacedComparison = { rateRps: NaN, seconds: opts.pacedSeconds };
  const want = (t: OverheadTarget): boolean => opts.targets.includes(t);

  try {
    log(`overhead: ${opts.loadgen}, ${opts.concurrency} connections, ${opts.seconds} s per run (+${opts.warmupSeconds} s warm-up), modes ${opts.modes.join(',')}, prompts ${opts.cases.join(',')}`);
    const backends: Backend[] = await startFakeBackends(2, tmp);
    started.push(...backends);
    const ports = backends.map((b) => b.port);
    if (want('direct')) urls.set('direct', { baseUrl: backends[0]!.baseUrl });

    /** Starts a target and probes it; a target that fails either is skipped with the reason. */
    const addTarget = async (target: OverheadTarget, start: () => Promise<Started>): Promise<void> => {
      if (!want(target)) return;
      try {
        const t = await start();
        started.push(t);
        const problem = await probe(t.baseUrl);
        if (problem === undefined) urls.set(target, t);
        else skipped[target] = problem;
      } catch (err) {
        skipped[target] = (err as Error).message;
      }
    };
    if (want('nginx') && !hasCommand('nginx')) skipped.nginx = 'nginx is not installed (apt-get install -y --no-install-recommends nginx-light)';
    else await addTarget('nginx', () => startNginx(tmp, ports, 'least_conn'));
    await addTarget('node-proxy', () => startNodeProxy(tmp, ports, opts.profile ? { cpuProfDir: join(tmp, 'prof-node-proxy') } : {}));
    const endpoints = backends.map((b) => ({ name: b.name, port: b.port }));
    for (const [target, extra] of [
      ['sluice', ''],
      ['sluice-3s', THREE_SCORER_PROFILE],
    ] as const) {
      await addTarget(target, () => startSluice(tmp, target, endpoints, extra, opts.profile ? { cpuProfDir: join(tmp, `prof-${target}`) } : {}));
    }
    for (const [t, why] of Object.entries(skipped)) log(`  ${t}: NOT MEASURED — ${why.split('\n')[0]}`);

    const wrkScript = writeWrkScript(tmp);
    const load = (url: string, body: string, seconds: number): Promise<LoadResult> =>
      opts.loadgen === 'wrk'
        ? runWrk(url, body, opts.concurrency, seconds, 1, body.includes(BODY_COUNTER) ? templateScript(tmp) : wrkScript)
        : runAutocannon(url, body, opts.concurrency, seconds);

    const measure = async (promptCase: PromptCase, mode: Mode, target: OverheadTarget, t: { baseUrl: string; proc?: Started['proc'] }): Promise<OverheadRun> => {
      const url = `${t.baseUrl}/v1/chat/completions`;
      const before = await backendServed(backends);
      const cpuBefore = cpuSeconds(t.proc?.child.pid);
      const result = await load(url, overheadBody(mode, promptCase), opts.seconds);
      const cpuAfter = cpuSeconds(t.proc?.child.pid);
      const after = await backendServed(backends);
      const deltas = after.map((a, i) => a - (before[i] ?? 0));
      const total = deltas.reduce((s, d) => s + d, 0);
      const run: OverheadRun = { case: promptCase, mode, target, ...result, backendShare: deltas.map((d) => (total > 0 ? d / total : 0)) };
      if (target !== 'nginx' && t.proc !== undefined && Number.isFinite(cpuAfter - cpuBefore) && result.requests > 0) {
        run.proxyCpuMsPerRequest = ((cpuAfter - cpuBefore) * 1000) / result.requests;
      }
      return run;
    };

    for (const promptCase of opts.cases) {
      const targets: OverheadTarget[] = ['direct', 'nginx', 'node-proxy', promptCase === 'short' ? 'sluice' : 'sluice-3s'];
      for (const mode of opts.modes) {
        const present = targets.flatMap((target) => {
          const t = urls.get(target);
          return t === undefined ? [] : [[target, t] as const];
        });
        for (const [, t] of present) await load(`${t.baseUrl}/v1/chat/completions`, overheadBody(mode, promptCase), opts.warmupSeconds);
        // Rounds interleave the targets, so a burst of load from elsewhere on the box hits one round of each.
        const byTarget = new Map<OverheadTarget, OverheadRun[]>();
        for (let round = 0; round < opts.rounds; round++) {
          for (const [target, t] of present) {
            const run = await measure(promptCase, mode, target, t);
            byTarget.set(target, [...(byTarget.get(target) ?? []), run]);
          }
        }
        for (const [target, list] of byTarget) {
          const run: OverheadRun = { ...[...list].sort((a, b) => a.rps - b.rps)[Math.floor((list.length - 1) / 2)]!, roundsRps: list.map((r) => r.rps) };
          runs.push(run);
          log(
            `  ${promptCase.padEnd(5)} ${mode.padEnd(4)} → ${target.padEnd(10)} ${fmtInt(run.rps).padStart(6)} req/s  p50 ${fmt(run.p50Ms)} ms  p99 ${fmt(run.p99Ms)} ms` +
              (run.proxyCpuMsPerRequest !== undefined ? `  (${fmt(run.proxyCpuMsPerRequest * 1000, 0)} µs CPU/req)` : '') +
              `  rounds ${list.map((r) => fmtInt(r.rps)).join(' / ')}` +
              (run.errors ? `  ${run.errors} ERRORS` : ''),
          );
        }
      }
    }

    // --- open loop at half of Sluice's max (JSON, short prompt)
    const sluiceMax = runs.find((r) => r.case === 'short' && r.mode === 'json' && r.target === 'sluice');
    if (sluiceMax !== undefined && opts.pacedSeconds > 0) {
      const rate = Math.round(sluiceMax.rps / 2);
      paced.rateRps = rate;
      const body = overheadBody('json', 'short');
      const path = '/v1/chat/completions';
      log(`  open loop at ${rate} req/s (half of Sluice's ${fmtInt(sluiceMax.rps)}), ${opts.pacedRounds} rounds × ${opts.pacedSeconds} s per target, interleaved, JSON short prompt:`);
      for (const target of PACED_TARGETS) {
        const t = urls.get(target);
        if (t !== undefined) await runPaced(t.baseUrl, path, body, rate, 1, PACED_CONNECTIONS); // warm-up
      }
      const interleaved = (run: (baseUrl: string) => Promise<PacedResult>) => pacedRounds(urls, opts.pacedRounds, run, log);
      Object.assign(paced, await interleaved((u) => runPaced(u, path, body, rate, opts.pacedSeconds, PACED_CONNECTIONS)));
      const low: NonNullable<PacedComparison['low']> = { rateRps: LOW_RATE, seconds: Math.max(3, Math.round(opts.pacedSeconds / 2)) };
      log(`  open loop at ${LOW_RATE} req/s, ${low.seconds} s each (latency with nothing queued):`);
      for (const target of PACED_TARGETS) {
        const t = urls.get(target);
        if (t === undefined) continue;
        const r = await runPaced(t.baseUrl, path, body, LOW_RATE, low.seconds, PACED_CONNECTIONS);
        low[target] = r;
        log(`    ${target.padEnd(10)} p50 ${fmt(r.latencyMs.p50, 3)} ms  p90 ${fmt(r.latencyMs.p90, 3)} ms  p99 ${fmt(r.latencyMs.p99, 3)} ms${r.errors ? `  ${r.errors} ERRORS` : ''}`);
      }
      paced.low = low;
      if (opts.loadgen === 'wrk') {
        log(`  wrk at the same rate (${PACED_CONNECTIONS} connections, exponential think time), ${opts.pacedRounds} rounds × ${opts.pacedSeconds} s per target, interleaved:`);
        try {
          paced.wrk = { connections: PACED_CONNECTIONS, ...(await interleaved((u) => runWrkPaced(`${u}${path}`, body, PACED_CONNECTIONS, rate, opts.pacedSeconds, tmp))) };
        } catch (err) {
          // Keep everything measured so far; the added latency is then judged on the undici client.
          skipped['wrk paced'] = (err as Error).message;
          log(`    NOT MEASURED — ${(err as Error).message.split('\n')[0]}`);
        }
      }
    }
  } finally {
    // A profiled process writes its profile on a clean exit: give it time.
    for (const s of started.reverse()) await stopProcess(s.proc, opts.profile ? 15_000 : 3000);
  }
  const profiles: Partial<Record<OverheadTarget, ProfileSummary>> = {};
  if (opts.profile) {
    for (const target of ['node-proxy', 'sluice', 'sluice-3s'] as const) {
      const sum = summarizeDir(join(tmp, `prof-${target}`));
      if (sum === undefined) continue;
      profiles[target] = sum;
      log(`\n  CPU profile of ${target} (self time, share of busy time over the process's life):`);
      for (const e of sum.topFunctions.slice(0, 12)) log(`    ${(e.share * 100).toFixed(1).padStart(5)}%  ${e.name}`);
    }
  }
  removeTmp();

  const ratioList = ratios(runs);
  if (runs.length > 0) {
    log('');
    log(
      textTable(
        ['prompt', 'mode', 'target', 'req/s', 'p50 ms', 'p99 ms', 'errors', 'backend share'],
        runs.map((r) => [r.case, r.mode, r.target, fmtInt(r.rps), fmt(r.p50Ms), fmt(r.p99Ms), String(r.errors), r.backendShare.map((s) => `${Math.round(s * 100)}%`).join('/')]),
        3,
      ),
    );
  }
  const { log: _l, keepTmp: _k, ...options } = opts;
  return {
    options,
    backend: { sseChunks: 4, sseChunkGapMs: 2 },
    sluice3sProfile: 'prefix-cache-scorer ×3, queue-scorer ×2, active-request-scorer ×2, max-score-picker (+ utilization-detector filter, flow control on)',
    runs,
    ratios: ratioList,
    paced,
    skipped,
    ...(opts.profile ? { profiles } : {}),
  };
}
