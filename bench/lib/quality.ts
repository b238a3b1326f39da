/**
 * Scheduling quality (issue 7, item 3): a fleet of `sluice sim` instances (prefix caching,
 * max-num-seqs slots, a FIFO queue, TTFT = overhead + cost per uncached prompt token) behind
 *   sluice         — Sluice, default profile (queue ×2, kv ×2, prefix ×3; flow control on),
 *   sluice-random  — Sluice with `random-picker` (same gateway, no scoring),
 *   nginx-rr       — nginx round-robin with upstream keepalive,
 *   sluice-ttft    — Sluice with the default plugins and queue-scorer weighed ×3, as heavy as the prefix
 *                    scorer (the profile configuration.md recommends when TTFT matters most),
 *   sluice-llmd    — llm-d's optimized baseline: prefix-cache-affinity-filter (calibrated to the
 *                    simulator's prefill speed) + token-load-scorer, the index kept by the producer,
 * and optionally a P/D variant (Sluice with disagg-profile-handler on a prefill/decode-labelled fleet)
 * and a diagnostic one without flow control (sluice-fc-off: what the saturation gate costs or saves).
 *
 * Workload: many users sharing a few long system prompts plus a unique user message each,
 * streamed chat completions, Poisson arrivals stepped through fractions of the fleet's capacity.
 * TTFT is measured at the client (send → first body byte; the simulator sends headers with the
 * first token). Every router sees the identical request sequence (same seed) on a fresh fleet.
 */
import { setMaxListeners } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';
import { onCleanup, sleep, stopProcess } from './proc.js';
import { expGapMs, fmt, fmtInt, summarize, textTable, type Summary } from './stats.js';
import { hasCommand, startNginx, startSimFleet, startSluice, validateSluiceConfig, type Backend, type SimParams, type Started } from './targets.js';
import { seededRandom } from '../../src/util/clock.js';

export type Router = 'sluice' | 'sluice-random' | 'nginx-rr' | 'sluice-pd' | 'sluice-fc-off' | 'sluice-ttft' | 'sluice-llmd';

export interface Workload {
  systemPrompts: number;
  systemPromptChars: number;
  suffixChars: number;
  outputTokensMin: number;
  outputTokensMax: number;
  /** All prompts distinct (no shared system prompt): the share check. */
  distinct?: boolean;
}

export interface QualityOptions {
  quick: boolean;
  instances: number;
  sim: SimParams;
  workload: Workload;
  /** Load steps as fractions of the estimated fleet capacity. */
  steps: number[];
  /** Load steps of the P/D variant (a subset keeps the run short). */
  pdSteps: number[];
  /** Load steps of the diagnostic variant without flow control (Sluice default profile, featureGates flowControl=false). */
  fcOffSteps: number[];
  stepSeconds: number;
  /** Length of the 80 % step (the target's), when it should be longer than the others. */
  targetStepSeconds?: number;
  warmupSeconds: number;
  drainSeconds: number;
  routers: Router[];
  /** Fraction of (all-uncached) capacity for the distinct-prompts share check; 0 = skip. */
  distinctLoad: number;
  distinctSeconds: number;
  keepTmp: boolean;
  log: (line: string) => void;
}

export interface Capacity {
  /** Service time of one request when its system prompt is cached (what a cache-aware router can reach). */
  serviceMsCached: number;
  /** Service time when nothing is cached. */
  serviceMsUncached: number;
  /** instances × maxNumSeqs / serviceMsCached: the "100 %" of the load steps. */
  fleetRps: number;
  fleetRpsUncached: number;
  ttftMsCached: number;
  ttftMsUncached: number;
}

export interface StepResult {
  load: number;
  rateRps: number;
  seconds: number;
  sent: number;
  completed: number;
  errors: number;
  /** Requests that had not finished when the drain time ran out (aborted; TTFT counted as ∞ if no first byte). */
  unfinished: number;
  /** TTFT over all sent requests (∞ for those without a first byte), ms. */
  ttftMs: Summary;
  /** Whole request, completed ones, ms. */
  e2eMs: Summary;
  /** Completions inside the step window / step length. */
  completedRps: number;
  /** Share of requests per instance (by x-inference-pod), in fleet order (names in `instances`). */
  share: number[];
  instances: string[];
  /** Max share / mean share. */
  maxShareOverMean: number;
  /** Fleet prefix-cache hit rate over the step (cached / queried prompt tokens). */
  cacheHitRate: number;
  /** Requests whose instance had less than half of the prompt cached (from the usage chunk), share of completed. */
  missRate: number;
  /** TTFT of requests that found their prompt cached (≥ half) / that did not: separates queueing from misses. */
  ttftHitMs: Summary;
  ttftMissMs: Summary;
  /**
   * Instances serving each system prompt, averaged over the prompts: those that answered at least 10 %
   * of the prompt's requests in the step (a prompt pinned to one instance queues there; one spread
   * over several is pooled). Absent in results recorded before it was measured, and for distinct prompts.
   */
  instancesPerPrompt?: number;
  /** Requests routed to a P/D prefill leg (sluice-pd only). */
  prefillLegs?: number;
}

export interface RouterResult {
  router: Router;
  steps: StepResult[];
  error?: string;
}

export interface QualityResult {
  options: Omit<QualityOptions, 'log' | 'keepTmp'>;
  capacity: Capacity;
  instanceNames: string[];
  routers: RouterResult[];
  distinct?: { router: Router; step: StepResult; error?: string };
  pd: { status: 'measured' | 'pending' | 'skipped'; note: string; fleet?: string; decodeInstances?: number };
}

const WORDS = (
  'the of and to in is you that it he was for on are as with his they at be this have from or one had by word but not what all were we when ' +
  'your can said there use an each which she do how their if will up other about out many then them these so some her would make like him into ' +
  'time has look two more write go see number no way could people my than first water been call who oil its now find long down day did get come'
).split(' ');

function text(random: () => number, chars: number): string {
  let out = '';
  while (out.length < chars) out += WORDS[Math.floor(random() * WORDS.length)]! + ' ';
  return out.slice(0, chars);
}

const CHARS_PER_TOKEN = 4;

export function estimateCapacity(instances: number, sim: SimParams, w: Workload): Capacity {
  const meanOut = (w.outputTokensMin + w.outputTokensMax) / 2;
  const promptTokens = (w.systemPromptChars + w.suffixChars + 60) / CHARS_PER_TOKEN; // + JSON of the two messages
  // Cached: everything up to the block holding the system prompt's end; uncached: the rest (+ one block).
  const uncachedWhenHit = w.distinct ? promptTokens : (w.suffixChars + 60) / CHARS_PER_TOKEN + 16;
  const ttftCached = sim.ttftOverheadMs + sim.prefillMsPerToken * uncachedWhenHit;
  const ttftUncached = sim.ttftOverheadMs + sim.prefillMsPerToken * promptTokens;
  const decode = (meanOut - 1) * sim.itlMs;
  const serviceMsCached = ttftCached + decode;
  const serviceMsUncached = ttftUncached + decode;
  return {
    serviceMsCached,
    serviceMsUncached,
    fleetRps: (instances * sim.maxNumSeqs * 1000) / serviceMsCached,
    fleetRpsUncached: (instances * sim.maxNumSeqs * 1000) / serviceMsUncached,
    ttftMsCached: ttftCached,
    ttftMsUncached: ttftUncached,
  };
}

interface PlannedRequest {
  atMs: number;
  body: string;
  /** Index of the system prompt, -1 for a distinct prompt. */
  prompt: number;
}

/** The request sequence of one step: identical for every router (seeded by step index). */
function planStep(w: Workload, sim: SimParams, systemPrompts: string[], rate: number, seconds: number, seed: number): PlannedRequest[] {
  const random = seededRandom(seed);
  const out: PlannedRequest[] = [];
  let t = expGapMs(rate, random);
  let n = 0;
  while (t < seconds * 1000) {
    n++;
    const maxTokens = w.outputTokensMin + Math.floor(random() * (w.outputTokensMax - w.outputTokensMin + 1));
    const user = `user-${seed}-${n}: ${text(random, w.suffixChars)}`;
    const prompt = w.distinct ? -1 : Math.floor(random() * systemPrompts.length);
    const messages = w.distinct
      ? [{ role: 'user', content: `${n}-${seed} ${text(random, w.systemPromptChars + w.suffixChars)}` }]
      : [
          { role: 'system', content: systemPrompts[prompt]! },
          { role: 'user', content: user },
        ];
    out.push({ atMs: t, prompt, body: JSON.stringify({ model: sim.model, messages, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } }) });
    t += expGapMs(rate, random);
  }
  return out;
}

interface Outcome {
  /** Index of the system prompt (-1: distinct). */
  prompt: number;
  sentAt: number;
  ttftMs: number;
  e2eMs: number;
  status: number;
  pod: string;
  doneAt: number;
  /** From the usage chunk: prompt tokens and how many of them the instance had cached. */
  promptTokens: number;
  cachedTokens: number;
}

/** Sends the plan open-loop (never waits for answers), then waits up to drainSeconds; the rest is aborted. */
async function runPlan(baseUrl: string, plan: PlannedRequest[], drainSeconds: number): Promise<{ outcomes: Outcome[]; startedAt: number }> {
  const pool = new Pool(baseUrl, { connections: null, pipelining: 1, keepAliveTimeout: 30_000, headersTimeout: 0, bodyTimeout: 0 });
  const abort = new AbortController();
  setMaxListeners(0, abort.signal); // one signal for every request of the step
  const outcomes: Outcome[] = [];
  const inflight = new Set<Promise<void>>();
  const headers = { 'content-type': 'application/json' };
  const startedAt = performance.now();
  const one = async ({ body, prompt }: PlannedRequest): Promise<void> => {
    const sent = performance.now();
    const o: Outcome = { prompt, sentAt: sent - startedAt, ttftMs: Infinity, e2eMs: Infinity, status: 0, pod: '', doneAt: Infinity, promptTokens: NaN, cachedTokens: NaN };
    outcomes.push(o);
    try {
      const res = await pool.request({ path: '/v1/chat/completions', method: 'POST', headers, body, signal: abort.signal });
      o.status = res.statusCode;
      const pod = res.headers['x-inference-pod'];
      o.pod = Array.isArray(pod) ? (pod[0] ?? '') : (pod ?? '');
      let first = true;
      let tail = '';
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        if (first) {
          o.ttftMs = performance.now() - sent;
          first = false;
        }
        // Keep only the end of the stream: the usage chunk comes just before [DONE].
        tail = (tail + chunk.toString('latin1')).slice(-1024);
      }
      const pt = /"prompt_tokens":(\d+)/.exec(tail);
      const ct = /"cached_tokens":(\d+)/.exec(tail);
      if (pt) o.promptTokens = Number(pt[1]);
      if (ct) o.cachedTokens = Number(ct[1]);
      const end = performance.now();
      if (res.statusCode === 200) {
        o.e2eMs = end - sent;
        o.doneAt = end - startedAt;
      } else o.ttftMs = Infinity;
    } catch {
      // aborted after the drain time, or a connection error: stays unfinished / error
    }
  };
  let i = 0;
  while (i < plan.length) {
    const now = performance.now() - startedAt;
    while (i < plan.length && plan[i]!.atMs <= now) {
      const p = one(plan[i]!);
      inflight.add(p);
      void p.finally(() => inflight.delete(p));
      i++;
    }
    await sleep(1);
  }
  const deadline = performance.now() + drainSeconds * 1000;
  while (inflight.size > 0 && performance.now() < deadline) await sleep(20);
  abort.abort();
  await Promise.allSettled([...inflight]);
  await pool.destroy().catch(() => {});
  return { outcomes, startedAt };
}

interface FleetCounters {
  hits: number;
  queries: number;
  prefillLegs: number;
}

async function fleetCounters(fleet: readonly Backend[]): Promise<FleetCounters> {
  const c: FleetCounters = { hits: 0, queries: 0, prefillLegs: 0 };
  await Promise.all(
    fleet.map(async (b) => {
      try {
        const res = await fetch(`${b.baseUrl}/metrics`, { signal: AbortSignal.timeout(3000) });
        const t = await res.text();
        const num = (re: RegExp): number => {
          const m = re.exec(t);
          return m ? Number(m[1]) : 0;
        };
        c.hits += num(/^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$/m);
        c.queries += num(/^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)$/m);
        c.prefillLegs += num(/^vllm:request_success_total\{finish_reason="remote_decode"[^}]*\} (\S+)$/m);
      } catch {
        // leave as is
      }
    }),
  );
  return c;
}

function stepResult(load: number, rate: number, seconds: number, outcomes: Outcome[], fleetNames: string[], before: FleetCounters, after: FleetCounters): StepResult {
  const completed = outcomes.filter((o) => o.status === 200 && Number.isFinite(o.e2eMs));
  const errors = outcomes.filter((o) => o.status !== 0 && o.status !== 200).length;
  const unfinished = outcomes.filter((o) => o.status === 0 || (o.status === 200 && !Number.isFinite(o.e2eMs))).length;
  const counts = fleetNames.map((n) => outcomes.filter((o) => o.pod === n).length);
  const total = counts.reduce((a, b) => a + b, 0);
  const share = counts.map((c) => (total > 0 ? c / total : 0));
  // Mean over the instances that can receive requests (a P/D fleet's prefill pods never answer one).
  const eligible = fleetNames.filter((n) => !n.startsWith('prefill-')).length;
  const mean = eligible > 0 ? 1 / eligible : 0;
  const queried = after.queries - before.queries;
  const known = completed.filter((o) => Number.isFinite(o.promptTokens) && Number.isFinite(o.cachedTokens));
  const hit = known.filter((o) => o.cachedTokens >= o.promptTokens / 2);
  const miss = known.filter((o) => o.cachedTokens < o.promptTokens / 2);
  return {
    missRate: known.length ? miss.length / known.length : NaN,
    ttftHitMs: summarize(hit.map((o) => o.ttftMs)),
    ttftMissMs: summarize(miss.map((o) => o.ttftMs)),
    load,
    rateRps: rate,
    seconds,
    sent: outcomes.length,
    completed: completed.length,
    errors,
    unfinished,
    ttftMs: summarize(outcomes.map((o) => o.ttftMs)),
    e2eMs: summarize(completed.map((o) => o.e2eMs)),
    completedRps: completed.filter((o) => o.doneAt <= seconds * 1000).length / seconds,
    share,
    instances: fleetNames,
    maxShareOverMean: mean > 0 ? Math.max(...share) / mean : NaN,
    cacheHitRate: queried > 0 ? (after.hits - before.hits) / queried : NaN,
    instancesPerPrompt: instancesPerPrompt(outcomes),
  };
}

/** Mean over the shared prompts of how many instances answered ≥ 10 % of the prompt's requests (undefined: none shared). */
export function instancesPerPrompt(outcomes: readonly { prompt: number; pod: string }[]): number | undefined {
  const byPrompt = new Map<number, Map<string, number>>();
  for (const { prompt, pod } of outcomes) {
    if (prompt < 0 || pod === '') continue;
    const pods = byPrompt.get(prompt) ?? new Map<string, number>();
    byPrompt.set(prompt, pods.set(pod, (pods.get(pod) ?? 0) + 1));
  }
  if (byPrompt.size === 0) return undefined;
  let sum = 0;
  for (const pods of byPrompt.values()) {
    let total = 0;
    for (const c of pods.values()) total += c;
    for (const c of pods.values()) if (c >= 0.1 * total) sum++;
  }
  return sum / byPrompt.size;
}

/** The config Sluice runs with as `router` (appended to the server and pool sections). */
export function routerConfig(router: Router): string {
  if (router === 'sluice-random') {
    return `plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
`;
  }
  if (router === 'sluice-pd') return PD_CONFIG;
  if (router === 'sluice-fc-off') return 'featureGates: ["flowControl=false"]\n';
  if (router === 'sluice-ttft') return TTFT_CONFIG;
  if (router === 'sluice-llmd') return LLMD_BASELINE_CONFIG;
  return '';
}

/**
 * llm-d's optimized baseline (its guides: approx producer, in-flight producer, affinity filter,
 * token-load scorer), calibrated to the simulator: peakPrefillThroughput = 1 / prefillMsPerToken
 * (0.1 ms) = 10 000 tokens/s; maxTTFTPenaltyMs = what computing a shared system prompt costs
 * (1 500 tokens × 0.1 ms), so a prompt leaves its cache only when waiting there costs more.
 */
const LLMD_BASELINE_CONFIG = `plugins:
- type: approx-prefix-cache-producer
- type: inflight-load-producer
- type: prefix-cache-affinity-filter
  parameters: { peakPrefillThroughput: 10000, maxTTFTPenaltyMs: 150 }
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
`;

/** The default plugins with the queue scorer as heavy as the prefix scorer (configuration.md, "Tuning for TTFT"). */
const TTFT_CONFIG = `plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: queue-scorer, weight: 3 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
`;

/** P/D: prefill and decode profiles, disaggregate when ≥ 256 prompt tokens are not cached on the decoder. */
const PD_CONFIG = `plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: prefix-based-pd-decider
  parameters: { nonCachedTokens: 256 }
- type: disagg-profile-handler
  parameters:
    connector: nixlv2
    deciders: { prefill: prefix-based-pd-decider }
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - { pluginRef: queue-scorer, weight: 2 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
- name: decode
  plugins:
  - pluginRef: decode-filter
  - { pluginRef: queue-scorer, weight: 2 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
`;

/** Prefill role for the first third of a P/D fleet, decode for the rest. */
export function pdRole(i: number, n: number): 'prefill' | 'decode' {
  return i < Math.max(1, Math.floor(n / 3)) ? 'prefill' : 'decode';
}

async function startRouter(router: Router, dir: string, fleet: readonly Backend[], nginxOk: boolean): Promise<Started> {
  if (router === 'nginx-rr') {
    if (!nginxOk) throw new Error('nginx is not installed');
    return startNginx(dir, fleet.map((b) => b.port), 'round_robin', 'nginx-rr');
  }
  const endpoints = fleet.map((b, i) => ({
    name: b.name,
    port: b.port,
    ...(router === 'sluice-pd' ? { labels: { 'llm-d.ai/role': pdRole(i, fleet.length) } } : {}),
  }));
  return startSluice(dir, router, endpoints, routerConfig(router));
}

async function warmup(baseUrl: string, w: Workload, sim: SimParams, systemPrompts: string[], rate: number, seconds: number): Promise<void> {
  if (seconds <= 0) return;
  await runPlan(baseUrl, planStep(w, sim, systemPrompts, rate, seconds, 999), 10);
}

/** Runs the load steps for one router on a fresh fleet. */
async function runRouter(
  router: Router,
  opts: QualityOptions,
  w: Workload,
  steps: number[],
  capacityRps: number,
  stepSeconds: number,
  dir: string,
  nginxOk: boolean,
  systemPrompts: string[],
): Promise<RouterResult> {
  const started: Started[] = [];
  const result: RouterResult = { router, steps: [] };
  try {
    const labels = router === 'sluice-pd' ? (i: number) => `${pdRole(i, opts.instances)}-${i}` : (i: number) => `sim-${i}`;
    const fleet = await startSimFleet(opts.instances, opts.sim, dir, labels);
    started.push(...fleet);
    const names = fleet.map((b) => b.name);
    const r = await startRouter(router, dir, fleet, nginxOk);
    started.push(r);
    await warmup(r.baseUrl, w, opts.sim, systemPrompts, capacityRps * 0.5, opts.warmupSeconds);
    for (const [k, load] of steps.entries()) {
      const rate = capacityRps * load;
      const seconds = Math.abs(load - 0.8) < 1e-9 && opts.targetStepSeconds !== undefined && !w.distinct ? opts.targetStepSeconds : stepSeconds;
      const plan = planStep(w, opts.sim, systemPrompts, rate, seconds, 1000 + Math.round(load * 1000) + (w.distinct ? 500 : 0));
      const before = await fleetCounters(fleet);
      const { outcomes } = await runPlan(r.baseUrl, plan, opts.drainSeconds);
      const after = await fleetCounters(fleet);
      const s = stepResult(load, rate, seconds, outcomes, names, before, after);
      if (router === 'sluice-pd') s.prefillLegs = after.prefillLegs - before.prefillLegs;
      result.steps.push(s);
      opts.log(
        `  ${router.padEnd(13)} ${`${Math.round(load * 100)}%`.padStart(4)} ${fmt(rate, 1).padStart(6)} req/s  sent ${String(s.sent).padStart(5)}  ` +
          `TTFT p50 ${fmt(s.ttftMs.p50, 0).padStart(5)}  p90 ${fmt(s.ttftMs.p90, 0).padStart(5)}  p99 ${fmt(s.ttftMs.p99, 0).padStart(5)} ms  ` +
          `done ${fmt(s.completedRps, 1).padStart(5)}/s  hit ${fmt(s.cacheHitRate * 100, 0).padStart(3)}%  miss ${fmt(s.missRate * 100, 0).padStart(3)}% ` +
          `(p90 hit ${fmt(s.ttftHitMs.p90, 0)} / miss ${fmt(s.ttftMissMs.p90, 0)})  share ${s.share.map((x) => Math.round(x * 100)).join('/')}` +
          (s.prefillLegs !== undefined ? `  prefill legs ${s.prefillLegs}` : '') +
          (s.errors ? `  ${s.errors} ERR` : '') +
          (s.unfinished ? `  ${s.unfinished} unfinished` : ''),
      );
    }
  } catch (err) {
    result.error = (err as Error).message;
    opts.log(`  ${router}: FAILED — ${result.error.split('\n')[0]}`);
  } finally {
    for (const s of started.reverse()) await stopProcess(s.proc);
  }
  return result;
}

/** Whether the gateway can run P/D: the handler validates and a probe request produces a prefill leg. */
async function pdAvailable(dir: string, opts: QualityOptions): Promise<{ ok: boolean; note: string }> {
  const yaml = `pool:\n  endpoints:\n  - { name: p, address: 127.0.0.1, port: 1, labels: { llm-d.ai/role: prefill } }\n  - { name: d, address: 127.0.0.1, port: 2, labels: { llm-d.ai/role: decode } }\n${PD_CONFIG}`;
  const problem = validateSluiceConfig(dir, 'pd', yaml);
  if (problem !== undefined) return { ok: false, note: `disagg-profile-handler config does not validate yet: ${problem.split('\n').slice(0, 2).join(' / ')}` };
  const started: Started[] = [];
  try {
    const fleet = await startSimFleet(2, opts.sim, dir, (i) => (i === 0 ? 'prefill-0' : 'decode-1'));
    started.push(...fleet);
    const endpoints = fleet.map((b, i) => ({ name: b.name, port: b.port, labels: { 'llm-d.ai/role': i === 0 ? 'prefill' : 'decode' } }));
    const s = await startSluice(dir, 'sluice-pd-probe', endpoints, PD_CONFIG);
    started.push(s);
    const body = JSON.stringify({ model: opts.sim.model, messages: [{ role: 'user', content: text(seededRandom(5), 4000) }], max_tokens: 4, stream: true });
    const res = await fetch(`${s.baseUrl}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(10_000) });
    const answer = await res.text();
    const c = await fleetCounters([fleet[0]!]);
    if (res.status !== 200) return { ok: false, note: `P/D probe answered HTTP ${res.status}: ${answer.slice(0, 160)}` };
    if (c.prefillLegs < 1) return { ok: false, note: 'disagg-profile-handler validates, but a long uncached prompt produced no prefill leg on the prefill pod (the proxy does not carry out P/D yet)' };
    return { ok: true, note: 'probe request was prefilled on the prefill pod and decoded on the decode pod' };
  } catch (err) {
    return { ok: false, note: `P/D probe failed: ${(err as Error).message.split('\n')[0]}` };
  } finally {
    for (const p of started.reverse()) await stopProcess(p.proc);
  }
}

export async function runQuality(opts: QualityOptions): Promise<QualityResult> {
  const log = opts.log;
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-quality-'));
  const removeTmp = (): void => {
    if (!opts.keepTmp) rmSync(dir, { recursive: true, force: true });
  };
  onCleanup(removeTmp);
  const w = opts.workload;
  const capacity = estimateCapacity(opts.instances, opts.sim, w);
  const random = seededRandom(42);
  const systemPrompts = Array.from({ length: w.systemPrompts }, (_, i) => `You are assistant #${i}. ${text(random, w.systemPromptChars)}`);
  const nginxOk = hasCommand('nginx');
  const s = opts.sim;
  log(
    `quality: ${opts.instances} × sim (max-num-seqs ${s.maxNumSeqs}, TTFT ${s.ttftOverheadMs} ms + ${s.prefillMsPerToken} ms/uncached token, ITL ${s.itlMs} ms, ${s.numGpuBlocks} KV blocks), ` +
      `${w.systemPrompts} system prompts × ${w.systemPromptChars} chars + ${w.suffixChars}-char user messages, ${w.outputTokensMin}–${w.outputTokensMax} output tokens`,
  );
  log(
    `  capacity estimate: service ${fmt(capacity.serviceMsCached, 0)} ms with the system prompt cached (TTFT ${fmt(capacity.ttftMsCached, 0)} ms), ` +
      `${fmt(capacity.serviceMsUncached, 0)} ms uncached (TTFT ${fmt(capacity.ttftMsUncached, 0)} ms) → fleet ${fmt(capacity.fleetRps, 1)} req/s = 100 % ` +
      `(${fmt(capacity.fleetRpsUncached, 1)} req/s if nothing were cached)`,
  );
  const result: QualityResult = {
    options: (({ log: _l, keepTmp: _k, ...o }) => o)(opts),
    capacity,
    instanceNames: Array.from({ length: opts.instances }, (_, i) => `sim-${i}`),
    routers: [],
    pd: { status: 'skipped', note: 'not requested' },
  };
  try {
    for (const router of opts.routers.filter((r) => r !== 'sluice-pd')) {
      const steps = router === 'sluice-fc-off' ? opts.fcOffSteps : opts.steps;
      if (steps.length === 0) continue;
      result.routers.push(await runRouter(router, opts, w, steps, capacity.fleetRps, opts.stepSeconds, dir, nginxOk, systemPrompts));
    }
    if (opts.routers.includes('sluice-pd')) {
      const avail = await pdAvailable(dir, opts);
      if (!avail.ok) {
        result.pd = { status: 'pending', note: avail.note };
        log(`  P/D variant: pending — ${avail.note}`);
      } else {
        const roles = Array.from({ length: opts.instances }, (_, i) => pdRole(i, opts.instances));
        const decodeInstances = roles.filter((r) => r === 'decode').length;
        result.pd = { status: 'measured', note: avail.note, fleet: `${roles.filter((r) => r === 'prefill').length} prefill + ${decodeInstances} decode`, decodeInstances };
        result.routers.push(await runRouter('sluice-pd', opts, w, opts.pdSteps, capacity.fleetRps, opts.stepSeconds, dir, nginxOk, systemPrompts));
      }
    }
    if (opts.distinctLoad > 0) {
      const dw: Workload = { ...w, distinct: true };
      const dcap = estimateCapacity(opts.instances, opts.sim, dw);
      log(`  distinct prompts (no shared prefix) at ${Math.round(opts.distinctLoad * 100)}% of ${fmt(dcap.fleetRps, 1)} req/s, Sluice default:`);
      const r = await runRouter('sluice', opts, dw, [opts.distinctLoad], dcap.fleetRps, opts.distinctSeconds, dir, nginxOk, systemPrompts);
      result.distinct = { router: 'sluice', step: r.steps[0]!, ...(r.error ? { error: r.error } : {}) };
    }
  } finally {
    removeTmp();
  }

  const rows: string[][] = [];
  for (const r of result.routers) {
    for (const st of r.steps) {
      rows.push([
        r.router,
        `${Math.round(st.load * 100)}%`,
        fmt(st.rateRps, 1),
        fmt(st.ttftMs.p50, 0),
        fmt(st.ttftMs.p90, 0),
        fmt(st.ttftMs.p99, 0),
        fmt(st.completedRps, 1),
        `${fmt(st.cacheHitRate * 100, 0)}%`,
        fmt(st.maxShareOverMean, 2),
        fmtInt(st.unfinished + st.errors),
      ]);
    }
  }
  if (rows.length) {
    log('');
    log(textTable(['router', 'load', 'req/s', 'TTFT p50', 'p90', 'p99', 'done/s', 'hit', 'max/mean', 'failed'], rows, 1));
  }
  return result;
}
