/**
 * Scheduling cost vs endpoint count (issue 7, item 4): µs per decision through the real Scheduler
 * built by buildScheduling from a loaded config — decode-filter, the auto-appended
 * utilization-detector filter, queue-scorer ×2, kv-cache-utilization-scorer ×2,
 * prefix-cache-scorer ×3, max-score-picker — including the PreRequest hook that teaches the prefix
 * index (part of every decision in the proxy). The same rig as bench/scheduler.ts (which covers
 * 8/64/512 endpoints × 1 KB/100 KB prompts), swept over 8…1024 endpoints with 1 KB prompts.
 *
 * Every decision gets a distinct prompt (one of 32 shared prefixes + a unique tail) against a warm
 * index, and is timed on its own. Run in its own process so the numbers are not disturbed by the
 * rest of the bench:
 *
 *   node --import tsx bench/lib/sched-sweep.ts [--quick] [--counts 8,64,1024] [--prompt-bytes 1024]
 *
 * Prints one line `SWEEPJSON {...}` with the results.
 */
import { parseArgs } from 'node:util';
import { loadConfigText } from '../../src/config/load.js';
import { Endpoint, ROLE_LABEL } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import type { SchedulingRequest } from '../../src/scheduling/framework.js';
import { ManualClock, seededRandom } from '../../src/util/clock.js';
import { pathToFileURL } from 'node:url';

export interface SweepPoint {
  endpoints: number;
  promptBytes: number;
  decisions: number;
  medianUs: number;
  p99Us: number;
  meanUs: number;
}

/** The default profile (queue ×2, kv ×2, prefix ×3) behind decode-filter, as bench/scheduler.ts uses it too. */
export const CONFIG = `
pool:
  endpoints: []
plugins:
- type: decode-filter
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
- type: utilization-detector
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - { pluginRef: queue-scorer, weight: 2 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
  - pluginRef: max-score-picker
`;

/** Shared prompt prefixes, and the unique tail each decision's prompt ends with. */
export const FAMILIES = 32;
export const TAIL_CHARS = 96;
export const WORDS = 'the of and to in is you that it he was for on are as with his they at be this have from or one had by'.split(' ');

/** Prompt-like text of `chars` characters drawn from WORDS. */
export function text(random: () => number, chars: number): string {
  let out = '';
  while (out.length < chars) out += WORDS[Math.floor(random() * WORDS.length)]! + ' ';
  return out.slice(0, chars);
}

/**
 * The fleet both scheduling benchmarks decide over: `endpointCount` decode endpoints with fresh,
 * mostly unsaturated metrics, and the scheduler of CONFIG built on them (seeded, manual clock).
 */
export function benchFleet(endpointCount: number) {
  const registry = builtinRegistry();
  const loaded = loadConfigText(CONFIG, 'bench.yaml', registry);
  const clock = new ManualClock();
  const random = seededRandom(42);
  const endpoints: Endpoint[] = [];
  for (let i = 0; i < endpointCount; i++) {
    const ep = new Endpoint({ name: `vllm-${i}`, address: '10.0.0.1', port: 8000 + i, labels: { [ROLE_LABEL]: 'decode' } });
    // Below the detector's thresholds (5 waiting, 0.8 KV) for most, over them for a few.
    ep.metrics = { waiting: Math.floor(random() * 7), running: Math.floor(random() * 16), kvUsage: random() * 0.9 };
    ep.metricsAt = clock.now();
    endpoints.push(ep);
  }
  const logger = { warn() {}, info() {}, debug() {} };
  const built = buildScheduling(loaded.config, registry, { clock, random, pool: { endpoints }, logger, plugins: new Map() });
  return { clock, random, endpoints, built, scheduler: built.scheduler };
}

/** How long a measurement runs: decisions before timing, then at least `minDecisions` and `minMs`. */
export interface DecisionBudget {
  warmup: number;
  minDecisions: number;
  minMs: number;
}

/**
 * µs per decision over `endpointCount` endpoints (benchFleet), each decision with a distinct prompt of
 * `promptChars` characters (one of FAMILIES shared prefixes + a unique tail) against a warm index,
 * each timed on its own. Used by this sweep and by bench/scheduler.ts.
 */
export function timeDecisions(endpointCount: number, promptChars: number, budget: DecisionBudget): SweepPoint {
  const { random, endpoints, scheduler } = benchFleet(endpointCount);
  const prefixes = Array.from({ length: FAMILIES }, () => text(random, promptChars - TAIL_CHARS));
  let counter = 0;
  const nextRequest = (): SchedulingRequest => {
    const n = counter++;
    const promptText = prefixes[n % FAMILIES]! + `#${n} ${text(random, TAIL_CHARS)}`.slice(0, TAIL_CHARS);
    promptText.charCodeAt(promptText.length >> 1); // flatten the rope outside the timed region
    const body = { model: 'meta-llama/Llama-3.1-8B-Instruct', prompt: promptText };
    return { requestId: `r-${n}`, model: body.model, api: 'completions', body, promptText, headers: {}, state: new Map() };
  };
  for (let i = 0; i < budget.warmup; i++) {
    const outcome = scheduler.schedule(nextRequest(), endpoints);
    if (!outcome.ok) throw new Error(`warm-up decision failed: ${outcome.message}`);
  }
  const samples: number[] = [];
  const started = performance.now();
  while (samples.length < budget.minDecisions || performance.now() - started < budget.minMs) {
    const req = nextRequest();
    const t0 = process.hrtime.bigint();
    const outcome = scheduler.schedule(req, endpoints);
    const t1 = process.hrtime.bigint();
    if (!outcome.ok) throw new Error(`decision failed: ${outcome.message}`);
    samples.push(Number(t1 - t0) / 1000);
  }
  samples.sort((a, b) => a - b);
  const at = (q: number): number => samples[Math.min(samples.length - 1, Math.floor(q * samples.length))]!;
  const r1 = (v: number): number => Math.round(v * 10) / 10;
  return {
    endpoints: endpointCount,
    promptBytes: promptChars,
    decisions: samples.length,
    medianUs: r1(at(0.5)),
    p99Us: r1(at(0.99)),
    meanUs: r1(samples.reduce((s, v) => s + v, 0) / samples.length),
  };
}

function main(): void {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      counts: { type: 'string', default: '8,16,32,64,128,256,512,1024' },
      'prompt-bytes': { type: 'string', default: '1024' },
    },
  });
  const counts = (values.counts ?? '').split(',').map(Number).filter((n) => n > 0);
  const bytes = Number(values['prompt-bytes']);
  const quick = values.quick ?? false;
  const budget = quick ? { warmup: 500, minDecisions: 500, minMs: 250 } : { warmup: 3000, minDecisions: 3000, minMs: 1000 };
  const points = counts.map((n) => timeDecisions(n, bytes, budget));
  process.stdout.write(`SWEEPJSON ${JSON.stringify(points)}\n`);
}

// Run only as a script (bench/scheduler.ts imports the shared pieces above).
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) main();
