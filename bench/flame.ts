/**
 * A flame graph (SVG) of a V8 profile: the same picture `npm run bench -- --profile` draws of each
 * gateway, for any profile you took yourself (docs/operations.md, "Profiling the gateway"): a CPU
 * profile (`.cpuprofile`: /debug/profile/cpu, node --cpu-prof) or a sampling heap profile
 * (`.heapprofile`: /debug/profile/heap; frames are as wide as the memory they allocated that was
 * still alive).
 *
 *   npx tsx bench/flame.ts PROFILE|DIR [-o OUT.svg] [--title TEXT] [--min-share 0.002]
 *
 * Given a directory, the biggest profile in it is drawn (node writes one per thread; the main
 * thread's is the biggest). Prints the top functions by self time (or self bytes), and writes OUT
 * (default: the profile's path with .svg).
 */
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { basename } from 'node:path';
import { parseArgs } from 'node:util';
import { biggestProfile, flameTree, heapFlameTree, pruneFlame, topFunctions, type CpuProfile, type HeapProfile } from './lib/cpuprofile.js';
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
  console.error('usage: npx tsx bench/flame.ts PROFILE|DIR [-o OUT.svg] [--title TEXT] [--min-share 0.002]');
  process.exit(2);
}

function fail(message: string): never {
  console.error(`flame: ${message}`);
  process.exit(1);
}

const input = positionals[0]!;
let file = input;
let prof: unknown;
try {
  if (statSync(input).isDirectory()) {
    const found = biggestProfile(input, /\.(cpu|heap)profile$/);
    if (found === undefined) fail(`no .cpuprofile or .heapprofile file in ${input}`);
    file = found;
  }
  prof = JSON.parse(readFileSync(file, 'utf8'));
} catch (err) {
  fail(`cannot read ${file}: ${(err as Error).message}`);
}

const heap = typeof prof === 'object' && prof !== null && 'head' in prof;
const cpu = typeof prof === 'object' && prof !== null && 'nodes' in prof && 'samples' in prof;
if (!heap && !cpu) fail(`${file} is neither a V8 CPU profile (nodes, samples) nor a heap profile (head)`);
// The top functions from the whole tree; the graph from the tree pruned.
const root = heap ? heapFlameTree(prof as HeapProfile, 0) : flameTree(prof as CpuProfile, 0);
const tops = topFunctions(root);
pruneFlame(root, minShare);
const amount = heap ? `${fmt(root.total / 1048576, 1)} MB sampled alive` : `${fmt(root.total / 1000, 1)} s busy`;
const out = opts.out ?? file.replace(/\.(cpu|heap)profile$/, '') + '.svg';
writeFileSync(out, flameGraph({ title: opts.title ?? `${basename(file)}: ${amount}`, root, measure: heap ? 'sampled memory' : 'busy time' }));
console.log(`${file}: ${amount}; self ${heap ? 'bytes' : 'time'}:`);
for (const f of tops) console.log(`${(f.share * 100).toFixed(1).padStart(6)} %  ${f.name}`);
console.log(`wrote ${out}`);
