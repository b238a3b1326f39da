/**
 * A flame graph (SVG) of a V8 CPU profile: the same picture `npm run bench -- --profile` draws of
 * each gateway, for any profile you took yourself (docs/operations.md, "Profiling the gateway").
 *
 *   npx tsx bench/flame.ts PROFILE.cpuprofile|DIR [-o OUT.svg] [--title TEXT] [--min-share 0.002]
 *
 * Given a directory, the biggest .cpuprofile in it is drawn (node writes one per thread; the main
 * thread's is the biggest). Prints the top functions by self time, and writes OUT (default: the
 * profile's path with .svg).
 */
import { statSync, writeFileSync } from 'node:fs';
import { basename } from 'node:path';
import { parseArgs } from 'node:util';
import { summarizeDir, summarizeProfile } from './lib/cpuprofile.js';
import { fmt } from './lib/stats.js';
import { flameGraph } from './lib/svg.js';

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    out: { type: 'string', short: 'o' },
    title: { type: 'string' },
    'min-share': { type: 'string', default: '0.002' },
  },
});
const minShare = Number(opts['min-share']);
if (positionals.length !== 1 || !(minShare >= 0 && minShare < 1)) {
  console.error('usage: npx tsx bench/flame.ts PROFILE.cpuprofile|DIR [-o OUT.svg] [--title TEXT] [--min-share 0.002]');
  process.exit(2);
}
const input = positionals[0]!;
let summary;
try {
  summary = statSync(input).isDirectory() ? summarizeDir(input, 15, minShare) : summarizeProfile(input, 15, minShare);
} catch (err) {
  console.error(`flame: cannot read ${input}: ${(err as Error).message}`);
  process.exit(1);
}
if (summary === undefined) {
  console.error(`flame: no .cpuprofile file in ${input}`);
  process.exit(1);
}
const out = opts.out ?? summary.file.replace(/\.cpuprofile$/, '') + '.svg';
const title = opts.title ?? `${basename(summary.file)}: ${fmt(summary.samplesMs / 1000, 1)} s busy`;
writeFileSync(out, flameGraph({ title, root: summary.flame! }));
console.log(`${summary.file}: ${fmt(summary.samplesMs / 1000, 1)} s busy; self time:`);
for (const f of summary.topFunctions) console.log(`${(f.share * 100).toFixed(1).padStart(6)} %  ${f.name}`);
console.log(`wrote ${out}`);
