/**
 * Proxy overhead on its own (the suite runs the same code via `npm run bench -- --only overhead`):
 * two fast fake backends behind direct / nginx least_conn / a bare Node proxy / Sluice (default
 * config) / Sluice (three-scorer profile), in interleaved rounds, JSON and SSE, short and 4 KB prompts; then the added p99 latency at half
 * of Sluice's throughput. Prints the table and ratios; writes bench/results/proxy-overhead.json.
 *
 *   npx tsx bench/proxy-overhead.ts [--quick] [--targets direct,nginx,node-proxy,sluice,sluice-3s] [--modes json,sse]
 *        [--prompts short,4kb] [--concurrency 32] [--duration S] [--rounds N] [--paced S] [--loadgen wrk|autocannon] [--profile] [--keep-tmp]
 *
 * The pieces live in bench/lib (overhead.ts, targets.ts, loadgen.ts, fake-backend.ts, proc.ts).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { runOverhead, type Mode, type OverheadTarget, type PromptCase } from './lib/overhead.js';
import { BENCH_DIR, installCleanup, stopAll } from './lib/proc.js';
import { fmt } from './lib/stats.js';
import { hasCommand } from './lib/targets.js';

function list<T extends string>(raw: string, allowed: readonly T[], what: string): T[] {
  const items = raw.split(',').map((s) => s.trim()).filter(Boolean);
  for (const item of items) if (!allowed.includes(item as T)) throw new Error(`unknown ${what} '${item}' (allowed: ${allowed.join(', ')})`);
  return items as T[];
}

function positive(raw: string, what: string): number {
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${what} must be a positive number, got '${raw}'`);
  return n;
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      targets: { type: 'string', default: 'direct,nginx,node-proxy,sluice,sluice-3s' },
      modes: { type: 'string', default: 'json,sse' },
      prompts: { type: 'string', default: 'short,4kb' },
      concurrency: { type: 'string', default: '32' },
      duration: { type: 'string' },
      rounds: { type: 'string' },
      paced: { type: 'string' },
      loadgen: { type: 'string' },
      'keep-tmp': { type: 'boolean', default: false },
      profile: { type: 'boolean', default: false },
    },
    strict: true,
  });
  const quick = values.quick ?? false;
  const hasWrk = hasCommand('wrk');
  const loadgen = (values.loadgen ?? (hasWrk ? 'wrk' : 'autocannon')) as 'wrk' | 'autocannon';
  if (loadgen !== 'wrk' && loadgen !== 'autocannon') throw new Error('--loadgen must be wrk or autocannon');
  if (loadgen === 'wrk' && !hasWrk) throw new Error('wrk is not installed (apt-get install -y wrk), use --loadgen autocannon');
  installCleanup();
  const result = await runOverhead({
    quick,
    concurrency: Math.round(positive(values.concurrency ?? '32', 'concurrency')),
    seconds: values.duration !== undefined ? positive(values.duration, 'duration') : quick ? 2 : 5,
    rounds: values.rounds !== undefined ? Math.round(positive(values.rounds, 'rounds')) : 3,
    warmupSeconds: quick ? 1 : 2,
    pacedSeconds: values.paced !== undefined ? Number(values.paced) : quick ? 2 : 5,
    pacedRounds: 3,
    loadgen,
    modes: list<Mode>(values.modes ?? '', ['json', 'sse'], 'mode'),
    cases: list<PromptCase>(values.prompts ?? '', ['short', '4kb'], 'prompt'),
    targets: list<OverheadTarget>(values.targets ?? '', ['direct', 'nginx', 'node-proxy', 'sluice', 'sluice-3s'], 'target'),
    keepTmp: values['keep-tmp'] ?? false,
    profile: values.profile ?? false,
    log: (l) => console.log(l),
  });
  if (result.ratios.length > 0) {
    console.log('\nratios (throughput: higher is better for the first; latency: lower is better)');
    for (const r of result.ratios) {
      console.log(`  ${r.case.padEnd(5)} ${r.mode.padEnd(4)} ${r.of.padEnd(16)} throughput ×${fmt(r.throughput)}  p50 ×${fmt(r.p50)}  p99 ×${fmt(r.p99)}`);
    }
  }
  for (const [target, reason] of Object.entries(result.skipped)) console.log(`not measured: ${target} — ${reason.split('\n')[0]}`);
  const dir = join(BENCH_DIR, 'results');
  mkdirSync(dir, { recursive: true });
  const out = join(dir, 'proxy-overhead.json');
  writeFileSync(out, `${JSON.stringify({ date: new Date().toISOString(), node: process.version, cpus: cpus().length, cpuModel: cpus()[0]?.model, ...result }, null, 2)}\n`);
  console.log(`\nwrote ${out}`);
  return result.runs.length > 0 ? 0 : 1;
}

main().then(
  async (code) => {
    await stopAll();
    process.exit(code);
  },
  async (err: unknown) => {
    console.error(`proxy-overhead failed: ${err instanceof Error ? err.message : String(err)}`);
    await stopAll();
    process.exit(1);
  },
);
