/**
 * A/B of gateway variants: CPU per request and req/s under the same wrk load (or p99 latency at a
 * paced rate), for deciding whether a hot-path change is worth keeping.
 *
 *   npx tsx bench/ab.ts [options] VARIANT VARIANT [...]
 *
 * A variant is a directory holding a Sluice tree (e.g. `git worktree add /tmp/base HEAD~1` and a
 * `node_modules` symlink), `node-proxy` (the bare Node relay of the overhead benchmark), or
 * `DIR+FLAG[+FLAG…]` for node flags (`.+--single-threaded-gc` is this tree with that flag).
 *
 * Options: `--case short|4kb` (4kb uses the three-scorer profile), `--mode json|sse`, `--rounds N`
 * (default 8), `--seconds S` per round (5), `--rate R` (paced wrk at R req/s: reports the p99 in ms
 * instead of CPU), `--no-restart`.
 *
 * Why every round starts fresh processes, and why you should also run it with the variants swapped:
 * on the shared 2-core machine two processes of the same code differ by up to ~5 % in CPU per
 * request. The difference depends on which was started second, and it stays fixed for the
 * processes' whole life. Restarting every round and alternating the order of the runs removes most
 * of it. A difference that survives swapping the variants is real. Each round's numbers are
 * printed, so a single lucky round is easy to spot.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { overheadBody, THREE_SCORER_PROFILE } from './lib/overhead.js';
import { BODY_COUNTER, runWrk, runWrkPaced, templateScript, writeWrkScript } from './lib/loadgen.js';
import { REPO_ROOT, cpuTimes, stopProcess, type Managed } from './lib/proc.js';
import { startFakeBackends, startNodeProxy, startSluice } from './lib/targets.js';

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    case: { type: 'string', default: 'short' },
    mode: { type: 'string', default: 'json' },
    rounds: { type: 'string', default: '8' },
    seconds: { type: 'string', default: '5' },
    rate: { type: 'string', default: '0' },
    'no-restart': { type: 'boolean', default: false },
  },
});
const promptCase = opts.case === '4kb' ? '4kb' : 'short';
const mode = opts.mode === 'sse' ? 'sse' : 'json';
const rounds = Number(opts.rounds);
const seconds = Number(opts.seconds);
const rate = Number(opts.rate);
if (positionals.length < 2 || !(rounds > 0) || !(seconds > 0) || !(rate >= 0)) {
  console.error('usage: npx tsx bench/ab.ts [--case short|4kb] [--mode json|sse] [--rounds N] [--seconds S] [--rate R] [--no-restart] VARIANT VARIANT [...]');
  process.exit(2);
}

interface Variant {
  label: string;
  tree: string | 'node-proxy';
  flags: string[];
  proc?: Managed;
  url?: string;
  values: number[];
  rps: number[];
  user: number[];
  sys: number[];
}

const variants: Variant[] = positionals.map((arg) => {
  const [where, ...flags] = arg.split('+');
  const tree = where === 'node-proxy' ? 'node-proxy' : resolve(where === '' || where === '.' ? REPO_ROOT : where!);
  return { label: arg, tree, flags, values: [], rps: [], user: [], sys: [] };
});

const dir = mkdtempSync(join(tmpdir(), 'sluice-ab-'));
const backends = await startFakeBackends(2, dir);
const body = overheadBody(mode, promptCase);
const plainScript = writeWrkScript(dir); // writes the templated script (a distinct 4 KB prompt per request) too
const script = body.includes(BODY_COUNTER) ? templateScript(dir) : plainScript;

async function start(v: Variant, i: number): Promise<void> {
  const tag = `v${i}`;
  const started =
    v.tree === 'node-proxy'
      ? await startNodeProxy(dir, backends.map((b) => b.port), { tag, nodeFlags: v.flags })
      : await startSluice(dir, tag, backends.map((b) => ({ name: b.name, port: b.port })), promptCase === '4kb' ? THREE_SCORER_PROFILE : '', { tree: v.tree, nodeFlags: v.flags });
  v.proc = started.proc;
  v.url = `${started.baseUrl}/v1/chat/completions`;
  await runWrk(v.url, body, 32, 2, 1, script); // warm-up: JIT and pools
}

const median = (a: readonly number[]): number => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
const unit = rate > 0 ? 'ms p99' : 'µs CPU/req';

try {
  console.log(`A/B: ${promptCase} ${mode}, ${rounds} rounds × ${seconds} s, ${rate > 0 ? `paced at ${rate} req/s` : 'wrk 32 connections'}, ${opts['no-restart'] ? 'same processes' : 'fresh processes every round'}`);
  for (let r = 0; r < rounds; r++) {
    if (r === 0 || !opts['no-restart']) {
      for (const [i, v] of variants.entries()) {
        if (v.proc) await stopProcess(v.proc);
        await start(v, i);
      }
    }
    const order = r % 2 === 0 ? variants : [...variants].reverse();
    for (const v of order) {
      const pid = v.proc!.child.pid;
      const t0 = cpuTimes(pid);
      if (rate > 0) {
        const p = await runWrkPaced(v.url!, body, 64, rate, seconds, dir);
        v.values.push(p.latencyMs.p99);
        v.rps.push(p.achievedRps);
        continue;
      }
      const res = await runWrk(v.url!, body, 32, seconds, 1, script);
      const t1 = cpuTimes(pid);
      const perReq = (t: number): number => (t * 1e6) / Math.max(1, res.requests);
      v.user.push(perReq(t1.user - t0.user));
      v.sys.push(perReq(t1.sys - t0.sys));
      v.values.push(perReq(t1.user - t0.user + t1.sys - t0.sys));
      v.rps.push(res.rps);
    }
    console.log(`round ${r + 1}: ` + variants.map((v) => `${v.label} ${v.values.at(-1)!.toFixed(rate > 0 ? 2 : 1)} ${unit}, ${v.rps.at(-1)!.toFixed(0)} req/s`).join('  |  '));
  }
  const base = median(variants[0]!.values);
  for (const v of variants) {
    const m = median(v.values);
    const split = v.user.length > 0 ? ` (user ${median(v.user).toFixed(1)}, sys ${median(v.sys).toFixed(1)})` : '';
    console.log(`${v.label}: median ${m.toFixed(rate > 0 ? 2 : 1)} ${unit}${split}, ${median(v.rps).toFixed(0)} req/s, ×${(m / base).toFixed(3)} of the first`);
  }
} finally {
  for (const v of variants) if (v.proc) await stopProcess(v.proc);
  for (const b of backends) await stopProcess(b.proc);
  rmSync(dir, { recursive: true, force: true });
}
process.exit(0);
