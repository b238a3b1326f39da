/**
 * The benchmark suite's one entry point (issue 7):
 *
 *   npm run bench                          quick (default, ~5 min)
 *   npm run bench -- --full                full (~20 min)
 *   npm run bench -- --only overhead,quality,scale
 *   npm run bench -- --keep-tmp            keep configs and logs of the started processes
 *   npm run bench -- --profile             CPU-profile the Node gateways during the overhead runs (hot functions, flame graphs)
 *   npm run bench -- --report-only         rewrite REPORT.md, the charts and the verdicts from the last results.json
 *
 * Parts: overhead (direct / nginx / bare Node proxy / Sluice, JSON and SSE, + added latency at half load),
 * quality (simulated fleet: Sluice vs random picker vs nginx round-robin, TTFT vs load, P/D,
 * distinct-prompt share), scale (scheduling µs vs endpoints, flow control with 100k queued,
 * gateway queue memory, RSS soak).
 *
 * Writes bench/results/results.json and bench/results/REPORT.md with SVG charts next to it, and
 * prints each target of the issue as met / not met. Exit code 0 when the run completed (whatever
 * the verdicts), 1 when a part failed to run. Traffic goes to 127.0.0.1 only; every process
 * started is stopped at the end, on error and on Ctrl-C (see bench/lib/proc.ts).
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { runOverhead, type OverheadResult } from './lib/overhead.js';
import { BENCH_DIR, REPO_ROOT, installCleanup, reapLeftovers, stopAll } from './lib/proc.js';
import { runQuality, type QualityResult, type Router } from './lib/quality.js';
import { evaluateTargets, parseResults, printVerdicts, resultsJson, writeReport, type BenchResults, type Meta } from './lib/report.js';
import { runScale, type ScaleResult } from './lib/scale.js';
import { hasCommand } from './lib/targets.js';

type Part = 'overhead' | 'quality' | 'scale';
const PARTS: Part[] = ['overhead', 'quality', 'scale'];

function git(): Meta['git'] {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: REPO_ROOT, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no', '--', 'src'], { cwd: REPO_ROOT, encoding: 'utf8' }).trim() !== '';
    return { head, dirty };
  } catch {
    return { head: 'unknown', dirty: false };
  }
}

/** Content hash of src/ (other engineers edit it while benches run: a part records what it ran). */
function srcHash(): string {
  const h = createHash('sha1');
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts')) h.update(p).update(readFileSync(p));
    }
  };
  try {
    walk(join(REPO_ROOT, 'src'));
  } catch {
    return 'unknown';
  }
  return h.digest('hex').slice(0, 10);
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      full: { type: 'boolean', default: false },
      only: { type: 'string' },
      'keep-tmp': { type: 'boolean', default: false },
      profile: { type: 'boolean', default: false },
      'report-only': { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log('usage: npm run bench -- [--quick | --full] [--only overhead,quality,scale] [--profile] [--keep-tmp] | --report-only');
    return 0;
  }
  if (values.quick && values.full) throw new Error('--quick and --full exclude each other');
  if (values['report-only']) {
    // Re-derive the verdicts, REPORT.md and the charts from the last results.json (no traffic).
    const dir = join(BENCH_DIR, 'results');
    const { targets: _t, ...rest } = parseResults(readFileSync(join(dir, 'results.json'), 'utf8'));
    const results: BenchResults = { ...rest, targets: evaluateTargets(rest) };
    writeFileSync(join(dir, 'results.json'), resultsJson(results));
    const files = writeReport(results, dir);
    printVerdicts(results.targets, (l) => console.log(l));
    console.log(`\nrewrote bench/results/{${files.join(',')}} from results.json`);
    return 0;
  }
  const full = values.full ?? false;
  const only = (values.only ?? PARTS.join(',')).split(',').map((s) => s.trim()).filter(Boolean) as Part[];
  for (const p of only) if (!PARTS.includes(p)) throw new Error(`unknown part '${p}' (parts: ${PARTS.join(', ')})`);
  const keepTmp = values['keep-tmp'] ?? false;

  installCleanup();
  const reaped = reapLeftovers();
  if (reaped > 0) console.log(`stopped ${reaped} process group(s) left behind by an interrupted earlier run`);

  const t0 = performance.now();
  const meta: Meta = {
    date: new Date().toISOString(),
    mode: full ? 'full' : 'quick',
    only,
    node: process.version,
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    git: git(),
    loadAverageStart: loadavg(),
    loadAverageEnd: [],
    seconds: 0,
    srcHashes: {},
  };
  console.log(`Sluice benchmark, ${meta.mode} run (${only.join(', ')}), git ${meta.git.head}${meta.git.dirty ? '+dirty' : ''}, ${meta.cpus} CPUs, load average ${loadavg().map((x) => x.toFixed(1)).join(' ')}`);
  const log = (line: string): void => console.log(line);
  const errors: Record<string, string> = {};
  let overhead: OverheadResult | undefined;
  let quality: QualityResult | undefined;
  let scale: ScaleResult | undefined;

  if (only.includes('overhead')) {
    meta.srcHashes['overhead'] = srcHash();
    console.log('\n== overhead ==');
    try {
      const loadgen = hasCommand('wrk') ? 'wrk' : 'autocannon';
      overhead = await runOverhead({
        quick: !full,
        concurrency: 32,
        seconds: full ? 5 : 2,
        rounds: 3,
        warmupSeconds: full ? 2 : 1,
        pacedSeconds: full ? 5 : 2,
        pacedRounds: 3,
        loadgen,
        modes: ['json', 'sse'],
        cases: ['short', '4kb'],
        targets: ['direct', 'nginx', 'node-proxy', 'sluice', 'sluice-3s'],
        keepTmp,
        profile: values.profile ?? false,
        log,
      });
    } catch (err) {
      errors.overhead = (err as Error).stack ?? String(err);
      console.log(`overhead FAILED: ${(err as Error).message}`);
    }
    await stopAll();
  }

  if (only.includes('quality')) {
    meta.srcHashes['quality'] = srcHash();
    console.log('\n== scheduling quality ==');
    try {
      // llm-d's optimized baseline only in the full run (a comparison, not a target).
      const routers: Router[] = ['sluice', 'sluice-ttft', ...(full ? (['sluice-llmd'] as const) : []), 'sluice-random', 'nginx-rr', 'sluice-fc-off', 'sluice-pd'];
      quality = await runQuality({
        quick: !full,
        instances: full ? 8 : 4,
        sim: { maxNumSeqs: 8, ttftOverheadMs: 20, prefillMsPerToken: 0.1, itlMs: 20, numGpuBlocks: 1100, maxOutputTokens: 256, model: 'sim-model' },
        workload: { systemPrompts: 16, systemPromptChars: 6000, suffixChars: 400, outputTokensMin: 8, outputTokensMax: 40 },
        steps: full ? [0.3, 0.5, 0.7, 0.8, 0.9, 1.1] : [0.3, 0.8, 1.1],
        pdSteps: full ? [0.3, 0.8] : [0.8],
        fcOffSteps: full ? [0.8, 0.9, 1.1] : [1.1],
        stepSeconds: full ? 15 : 5,
        targetStepSeconds: full ? 20 : 10,
        warmupSeconds: full ? 4 : 2,
        drainSeconds: full ? 15 : 8,
        routers,
        distinctLoad: 0.6,
        distinctSeconds: full ? 15 : 6,
        keepTmp,
        log,
      });
    } catch (err) {
      errors.quality = (err as Error).stack ?? String(err);
      console.log(`quality FAILED: ${(err as Error).message}`);
    }
    await stopAll();
  }

  if (only.includes('scale')) {
    meta.srcHashes['scale'] = srcHash();
    console.log('\n== scale ==');
    try {
      scale = await runScale({
        quick: !full,
        parts: ['sched', 'flowcontrol', 'queue', 'soak'],
        queueRequests: full ? 15_000 : 5_000,
        soakRequests: full ? 1_000_000 : 100_000,
        keepTmp,
        log,
      });
      for (const [k, v] of Object.entries(scale.errors)) errors[`scale.${k}`] = v;
    } catch (err) {
      errors.scale = (err as Error).stack ?? String(err);
      console.log(`scale FAILED: ${(err as Error).message}`);
    }
    await stopAll();
  }

  meta.loadAverageEnd = loadavg();
  meta.seconds = (performance.now() - t0) / 1000;
  const partial: Omit<BenchResults, 'targets'> = { meta, errors, ...(overhead ? { overhead } : {}), ...(quality ? { quality } : {}), ...(scale ? { scale } : {}) };
  const results: BenchResults = { ...partial, targets: evaluateTargets(partial) };
  const dir = join(BENCH_DIR, 'results');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'results.json'), resultsJson(results));
  const files = writeReport(results, dir);
  printVerdicts(results.targets, log);
  console.log(`\nwrote bench/results/results.json and bench/results/{${files.join(',')}} in ${(meta.seconds / 60).toFixed(1)} min`);
  return Object.keys(errors).length > 0 ? 1 : 0;
}

main().then(
  async (code) => {
    await stopAll();
    process.exit(code);
  },
  async (err: unknown) => {
    console.error(`bench failed: ${err instanceof Error ? err.stack : String(err)}`);
    await stopAll();
    process.exit(1);
  },
);
