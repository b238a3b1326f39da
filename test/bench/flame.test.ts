/**
 * Flame graphs of the overhead benchmark's CPU profiles (issue 7 item 5: "--cpu-prof, flame
 * graphs"): the call tree built from a V8 .cpuprofile (idle left out, same frames merged, narrow
 * frames dropped with their time kept in the parent) and its SVG (one frame per rectangle, widths
 * proportional to time, colour by whose code runs). A synthetic profile for the exact numbers, and a
 * real `node --cpu-prof` run for the format and for bench/flame.ts, the command-line form; the same
 * tree of a heap profile (bytes still alive); the report links one graph per profiled gateway.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { flameTree, heapFlameTree, shortUrl, summarizeDir, topFunctions, type CpuProfile, type FlameNode, type HeapProfile } from '../../bench/lib/cpuprofile.js';
import { flameGraph, frameKind } from '../../bench/lib/svg.js';
import { evaluateTargets, parseResults, writeReport } from '../../bench/lib/report.js';

const FLAME_CLI = fileURLToPath(new URL('../../bench/flame.ts', import.meta.url));

const frame = (functionName: string, url = '', lineNumber = 0) => ({ functionName, url, lineNumber });

/**
 * (root) ─┬ (idle)                         50 ms
 *         ├ (program)                      10 ms
 *         ├ (garbage collector)             5 ms
 *         └ handleApi src/proxy/server.ts  2 ms self
 *             ├ forward src/proxy/forward.ts   20 ms self   } one frame: same function and place
 *             ├ forward src/proxy/forward.ts    2 ms self   }
 *             │   └ dispatch undici/…           8 ms
 *             └ <tiny> node:events              0.08 ms (under 0.2 % of 47.08 ms busy: dropped)
 */
function syntheticProfile(): CpuProfile {
  const nodes: CpuProfile['nodes'] = [
    { id: 1, callFrame: frame('(root)'), children: [2, 3, 4, 5] },
    { id: 2, callFrame: frame('(idle)') },
    { id: 3, callFrame: frame('(program)') },
    { id: 4, callFrame: frame('(garbage collector)') },
    { id: 5, callFrame: frame('handleApi', 'file:///work/main/src/proxy/server.ts', 9), children: [6, 7, 9] },
    { id: 6, callFrame: frame('forward', 'file:///work/main/src/proxy/forward.ts', 41) },
    { id: 7, callFrame: frame('forward', 'file:///work/main/src/proxy/forward.ts', 41), children: [8] },
    { id: 8, callFrame: frame('dispatch', 'file:///work/main/node_modules/undici/lib/dispatcher/client.js', 99) },
    { id: 9, callFrame: frame('<tiny>', 'node:events', 470) },
  ];
  // One sample per 10 µs: `ms` ms of samples in node `id`.
  const samples: number[] = [];
  const add = (id: number, ms: number) => {
    for (let i = 0; i < Math.round(ms * 100); i++) samples.push(id);
  };
  add(2, 50);
  add(3, 10);
  add(4, 5);
  add(5, 2);
  add(6, 20);
  add(7, 2);
  add(8, 8);
  add(9, 0.08);
  return { nodes, samples, timeDeltas: samples.map(() => 10) };
}

const close = (a: number, b: number) => assert.ok(Math.abs(a - b) < 1e-6, `${a} ≉ ${b}`);

describe('flame graph', () => {
  test('call tree: busy time only, same frames merged, widest first, narrow frames dropped but counted', () => {
    const all = flameTree(syntheticProfile());
    close(all.total, 47.08); // 50 ms idle left out
    assert.deepEqual(
      all.children.map((c) => c.name),
      ['handleApi', '(program)', '(garbage collector)'],
    );
    const handle = all.children[0]!;
    assert.equal(handle.at, 'src/proxy/server.ts:10');
    close(handle.self, 2);
    close(handle.total, 32.08); // the dropped 0.08 ms stays in its parent's total
    assert.equal(handle.children.length, 1, 'the two forward frames are one; <tiny> (0.17 %) is dropped');
    const fwd = handle.children[0]!;
    close(fwd.self, 22);
    close(fwd.total, 30);
    assert.deepEqual(
      fwd.children.map((c) => [c.name, c.at, c.total]),
      [['dispatch', 'undici/lib/dispatcher/client.js:100', 8]],
    );
    // With no threshold the tiny frame stays.
    assert.equal(flameTree(syntheticProfile(), 0).children[0]!.children.length, 2);
  });

  test('SVG: one rectangle per frame, widths in proportion to time, colour by whose code, names escaped', () => {
    const root: FlameNode = flameTree(syntheticProfile());
    root.children[0]!.children[0]!.name = 'forward<T>';
    const svg = flameGraph({ title: 'test & profile', root, width: 1020 });
    const rects = [...svg.matchAll(/<title>([^<]*)<\/title><rect x="([\d.]+)" y="(-?\d+)" width="([\d.]+)"[^>]*fill="([^"]+)"/g)];
    // all, handleApi, (program), (garbage collector), forward, dispatch
    assert.equal(rects.length, 6);
    const byName = new Map(rects.map((r) => [r[1]!.split(/ — |\n/)[0]!, { x: Number(r[2]), y: Number(r[3]), w: Number(r[4]) + 0.5, fill: r[5]! }]));
    const plot = 1000; // 1020 − 2 × 10 px margin
    close(byName.get('all')!.w, plot);
    assert.ok(Math.abs(byName.get('handleApi')!.w - (plot * 32.08) / 47.08) < 0.01);
    assert.ok(Math.abs(byName.get('forward&lt;T&gt;')!.w - (plot * 30) / 47.08) < 0.01);
    // Callees sit one row above their caller, at the caller's left edge.
    assert.equal(byName.get('forward&lt;T&gt;')!.y, byName.get('handleApi')!.y - 17);
    assert.equal(byName.get('forward&lt;T&gt;')!.x, byName.get('handleApi')!.x);
    // Siblings follow each other, widest first.
    assert.ok(Math.abs(byName.get('(program)')!.x - (byName.get('handleApi')!.x + byName.get('handleApi')!.w)) < 0.01);
    assert.match(byName.get('handleApi')!.fill, /^hsl\(24,/);
    assert.match(byName.get('dispatch')!.fill, /^hsl\(210,/);
    assert.match(byName.get('(garbage collector)')!.fill, /^hsl\(0,70%/);
    assert.match(svg, /<title>forward&lt;T&gt; — src\/proxy\/forward.ts:42\n63.7 % of busy time \(self 46.7 %\)<\/title>/);
    assert.match(svg, /test &amp; profile/);
    assert.doesNotMatch(svg, /NaN|undefined/);
    assert.deepEqual(
      ['file:///app/dist/proxy/forward.js', 'file:///w/node_modules/yaml/dist/index.js', 'file:///w/node_modules/a/node_modules/undici/index.js', 'node:events'].map(shortUrl),
      ['dist/proxy/forward.js', 'yaml/dist/index.js', 'undici/index.js', 'node:events'],
    );
    assert.deepEqual(
      [frameKind({ name: 'x', at: 'pino/lib/proto.js:1' }), frameKind({ name: 'writev', at: '' }), frameKind({ name: 'emit', at: 'node:events:1' }), frameKind({ name: 'forward', at: 'dist/proxy/forward.js:67' })],
      ['other modules', 'V8, native', 'Node.js', 'Sluice'],
    );
  });

  test('heap profile: frames as wide as the bytes they allocated that are still alive; bench/flame.ts draws it', () => {
    const cf = (functionName: string, url = '') => ({ functionName, url, lineNumber: 0 });
    const prof: HeapProfile = {
      head: {
        callFrame: cf('(root)'),
        selfSize: 0,
        children: [
          { callFrame: cf('readBody', 'file:///w/src/proxy/body.ts'), selfSize: 1000, children: [{ callFrame: cf('concat', 'node:buffer'), selfSize: 3000, children: [] }] },
          { callFrame: cf('learn', 'file:///w/src/scheduling/prefix-index.ts'), selfSize: 1000, children: [] },
        ],
      },
    };
    const all = heapFlameTree(prof);
    assert.equal(all.total, 5000);
    assert.deepEqual(
      all.children.map((c) => [c.name, c.self, c.total]),
      [['readBody', 1000, 4000], ['learn', 1000, 1000]],
    );
    assert.deepEqual(topFunctions(all).map((e) => [e.name, e.share]), [['concat (node:buffer:1)', 0.6], ['readBody (src/proxy/body.ts:1)', 0.2], ['learn (src/scheduling/prefix-index.ts:1)', 0.2]]);
    const dir = mkdtempSync(join(tmpdir(), 'flame-heap-'));
    try {
      const file = join(dir, 'x.heapprofile');
      writeFileSync(file, JSON.stringify(prof));
      const printed = execFileSync(process.execPath, ['--import', 'tsx', FLAME_CLI, file], { encoding: 'utf8' });
      assert.match(printed, /0\.0 MB sampled alive; self bytes:\n +60\.0 %  concat/);
      assert.match(readFileSync(join(dir, 'x.svg'), 'utf8'), /<title>readBody — src\/proxy\/body.ts:1\n80.0 % of sampled memory \(self 20.0 %\)<\/title>/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('the report draws one flame graph per profiled gateway and links it under its hot-function table', () => {
    const { targets: _t, ...rest } = parseResults(readFileSync(new URL('../fixtures/bench-results.json', import.meta.url), 'utf8'));
    const flame = flameTree(syntheticProfile());
    const prof = { file: 'x.cpuprofile', samplesMs: 47.08, topFunctions: [{ name: 'forward', share: 0.467 }], topFiles: [] };
    const res = { ...rest, overhead: { ...rest.overhead!, profiles: { 'node-proxy': { ...prof, flame }, sluice: { ...prof, flame }, 'sluice-3s': prof } } };
    const dir = mkdtempSync(join(tmpdir(), 'flame-report-'));
    try {
      const files = writeReport({ ...res, targets: evaluateTargets(res) }, dir);
      // A summary without a tree (results.json from before flame graphs) keeps its table only.
      assert.deepEqual(files.filter((f) => f.includes('flame')), ['overhead-flame-node-proxy.svg', 'overhead-flame-sluice.svg']);
      const md = readFileSync(join(dir, 'REPORT.md'), 'utf8');
      assert.match(md, /\*\*CPU profile of sluice\*\*[^]*\| `forward` \| 46.7 % \|\n\n!\[overhead-flame-sluice.svg\]\(overhead-flame-sluice.svg\)/);
      assert.match(readFileSync(join(dir, 'overhead-flame-sluice.svg'), 'utf8'), /handleApi — src\/proxy\/server.ts:10/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a real node --cpu-prof profile: the busy function is in the tree, under its caller', () => {
    const dir = mkdtempSync(join(tmpdir(), 'flame-'));
    try {
      const script = 'function spinHere(){const t=Date.now();let x=0;while(Date.now()-t<300)x+=Math.sqrt(x+1);return x}function outerCaller(){return spinHere()}outerCaller()';
      execFileSync(process.execPath, ['--cpu-prof', '--cpu-prof-dir', dir, '-e', script]);
      const sum = summarizeDir(dir)!;
      const find = (n: FlameNode, name: string): FlameNode | undefined => (n.name === name ? n : n.children.map((c) => find(c, name)).find(Boolean));
      const outer = find(sum.flame!, 'outerCaller');
      assert.ok(outer, 'outerCaller is a frame');
      const spin = outer.children.find((c) => c.name === 'spinHere');
      assert.ok(spin, 'spinHere is called from outerCaller');
      assert.ok(spin.total > 0.5 * sum.flame!.total, `spinHere ${spin.total} ms of ${sum.flame!.total} ms busy`);
      assert.ok(flameGraph({ title: 'real', root: sum.flame! }).includes('spinHere'));
      // bench/flame.ts draws the same from the command line.
      const out = join(dir, 'out.svg');
      const printed = execFileSync(process.execPath, ['--import', 'tsx', FLAME_CLI, dir, '-o', out, '--title', 'cli'], { encoding: 'utf8' });
      assert.match(printed, /spinHere/);
      const svg = readFileSync(out, 'utf8');
      assert.match(svg, /^<svg[^]*>cli<\/text>[^]*spinHere[^]*<\/svg>\n$/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
