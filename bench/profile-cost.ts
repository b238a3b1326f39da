/**
 * What an on-demand CPU profile (`/debug/profile/cpu`) costs a gateway under load: Sluice (default
 * config) behind wrk with the overhead benchmark's short JSON requests, rounds with and without a
 * profile running, alternating; CPU µs per request (from /proc) and req/s of each round, and the
 * size of the profiles. Writes bench/results/profile-cost.json.
 *
 *   npx tsx bench/profile-cost.ts [--quick] [--rounds N] [--seconds S]
 *
 * One process for all rounds (a fresh process per round would add the start-up's variance; see
 * bench/ab.ts): compare the rounds with each other, not with other runs.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { overheadBody } from './lib/overhead.js';
import { runWrk, writeWrkScript } from './lib/loadgen.js';
import { BENCH_DIR, cpuTimes, installCleanup, stopAll } from './lib/proc.js';
import { fmt } from './lib/stats.js';
import { startFakeBackends, startSluice } from './lib/targets.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    rounds: { type: 'string' },
    seconds: { type: 'string' },
  },
});
const rounds = Number(values.rounds ?? (values.quick ? 1 : 3));
const seconds = Number(values.seconds ?? (values.quick ? 2 : 5));
if (!(rounds >= 1 && seconds > 0)) {
  console.error('usage: npx tsx bench/profile-cost.ts [--quick] [--rounds N] [--seconds S]');
  process.exit(2);
}

interface Round {
  profiling: boolean;
  rps: number;
  cpuUsPerRequest: number;
  profileBytes?: number;
}

installCleanup();
const dir = mkdtempSync(join(tmpdir(), 'sluice-profile-cost-'));
const rows: Round[] = [];
try {
  const backends = await startFakeBackends(2, dir);
  const script = writeWrkScript(dir);
  const s = await startSluice(dir, 'sluice', backends.map((b) => ({ name: b.name, port: b.port })));
  const url = `${s.baseUrl}/v1/chat/completions`;
  const body = overheadBody('json', 'short');
  await runWrk(url, body, 32, 2, 1, script); // warm-up
  for (let i = 0; i < rounds; i++) {
    for (const profiling of [false, true]) {
      const before = cpuTimes(s.proc.child.pid);
      // The profile spans the round (plus a second of slack, so that wrk's whole run is inside it).
      const profile = profiling ? fetch(`${s.metricsUrl}/debug/profile/cpu?seconds=${seconds + 1}`).then(async (r) => (await r.arrayBuffer()).byteLength) : undefined;
      const r = await runWrk(url, body, 32, seconds, 1, script);
      const after = cpuTimes(s.proc.child.pid);
      const row: Round = { profiling, rps: r.rps, cpuUsPerRequest: ((after.user + after.sys - before.user - before.sys) * 1e6) / r.requests };
      if (profile) row.profileBytes = await profile;
      rows.push(row);
      console.log(
        `${profiling ? 'profiling' : 'plain    '}  ${fmt(r.rps, 0).padStart(6)} req/s  ${fmt(row.cpuUsPerRequest, 1)} µs CPU/request` +
          (row.profileBytes !== undefined ? `  profile ${fmt(row.profileBytes / 1048576, 2)} MB for ${seconds + 1} s` : ''),
      );
    }
  }
} finally {
  await stopAll();
  rmSync(dir, { recursive: true, force: true });
}
mkdirSync(join(BENCH_DIR, 'results'), { recursive: true });
const out = join(BENCH_DIR, 'results', 'profile-cost.json');
writeFileSync(out, JSON.stringify({ date: new Date().toISOString(), seconds, rounds: rows }, null, 2) + '\n');
console.log(`wrote ${out}`);
process.exit(0);
