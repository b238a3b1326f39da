/**
 * The benchmark's report from a real quick run's results.json (test/fixtures/bench-results.json,
 * `npm run bench` on this machine type): what `npm run bench -- --report-only` does, without traffic.
 * REPORT.md carries a verdict per target and links every chart it wrote; the charts are SVG with no
 * missing number in them; results.json survives its own round trip (∞ and NaN included).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { evaluateTargets, parseResults, resultsJson, writeReport, type BenchResults } from '../../bench/lib/report.js';

const fixture = readFileSync(new URL('../fixtures/bench-results.json', import.meta.url), 'utf8');

function fromFixture(): BenchResults {
  const { targets: _stored, ...rest } = parseResults(fixture);
  return { ...rest, targets: evaluateTargets(rest) };
}

describe('benchmark report', () => {
  test('results.json round-trips, NaN and ∞ included (JSON has neither)', () => {
    const res = parseResults(fixture);
    // The distinct-prompts step has no cache hits: its hit-TTFT summary is NaN.
    assert.ok(Number.isNaN(res.quality!.distinct!.step.ttftHitMs.p90));
    const withInfinity: BenchResults = { ...res, meta: { ...res.meta, seconds: Infinity } };
    const text = resultsJson(withInfinity);
    assert.match(text, /"seconds": "Infinity"/);
    const back = parseResults(text);
    assert.equal(back.meta.seconds, Infinity);
    assert.ok(Number.isNaN(back.quality!.distinct!.step.ttftHitMs.p90));
    assert.deepEqual(back.targets, res.targets);
  });

  test('every part of a quick run gets a verdict, and the run\'s own numbers are in it', () => {
    const res = fromFixture();
    assert.deepEqual(
      res.targets.map((v) => v.id),
      ['1a', '1b', '1c', '1d', '2', '3', '4', '5a', '5b', '6', '7'],
    );
    // Every part ran: no target may read "not measured".
    for (const v of res.targets) assert.notEqual(v.value, 'not measured', v.id);
    const p90 = (router: string) => res.quality!.routers.find((r) => r.router === router)!.steps.find((s) => s.load === 0.8)!.ttftMs.p90;
    const v3 = res.targets.find((v) => v.id === '3')!;
    assert.equal(v3.met, p90('sluice') <= 0.5 * p90('nginx-rr'));
    assert.ok(v3.value.startsWith(`${Math.round(p90('sluice'))} vs ${Math.round(p90('nginx-rr'))} ms`), v3.value);
  });

  test('the quality table shows how many instances served each prompt', () => {
    const res = fromFixture();
    res.quality!.routers.find((r) => r.router === 'sluice')!.steps.find((s) => s.load === 0.8)!.instancesPerPrompt = 1.625;
    const dir = mkdtempSync(join(tmpdir(), 'sluice-report-'));
    try {
      writeReport(res, dir);
      const md = readFileSync(join(dir, 'REPORT.md'), 'utf8');
      assert.match(md, /\| p90 of misses ms \| instances per prompt \| share per instance % \|/);
      const row80 = md.split('\n').find((l) => l.startsWith('| sluice | 80% |'))!;
      assert.equal(row80.split(' | ')[11], '1.6', row80);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('the P/D variant says how many requests had a prefill leg and how loaded the decode instances were', () => {
    const res = fromFixture();
    const dir = mkdtempSync(join(tmpdir(), 'sluice-report-'));
    try {
      // The fixture's P/D step (1 prefill + 3 decode): 25 of 530 requests at 80 % of 4 instances.
      res.quality!.pd.decodeInstances = 3;
      writeReport(res, dir);
      const md = readFileSync(join(dir, 'REPORT.md'), 'utf8');
      assert.match(md, /Where the load went: at 80 %, 25 of 530 requests \(4\.7 %\) had a prefill leg, and every request ran on the 3 decode instances, 107 % of their capacity\./);
      // A results.json written before the decode count was kept has no such sentence.
      delete res.quality!.pd.decodeInstances;
      writeReport(res, dir);
      assert.doesNotMatch(readFileSync(join(dir, 'REPORT.md'), 'utf8'), /Where the load went/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('REPORT.md has the verdict table and links every chart; the charts are SVG with every number present', () => {
    const res = fromFixture();
    const dir = mkdtempSync(join(tmpdir(), 'sluice-report-'));
    try {
      const files = writeReport(res, dir);
      assert.ok(files.includes('REPORT.md'));
      const charts = files.filter((f) => f.endsWith('.svg'));
      // Overhead (throughput, p99), quality (TTFT p50/p90/p99, throughput, share), scale (scheduling, soak RSS).
      assert.ok(charts.length >= 9, charts.join(', '));
      const md = readFileSync(join(dir, 'REPORT.md'), 'utf8');
      for (const v of res.targets) {
        const row = md.split('\n').find((l) => l.startsWith(`| ${v.id} |`));
        assert.ok(row, `no row for target ${v.id}`);
        assert.match(row, v.met === null ? /not measured|inconclusive/ : v.met ? /✅ met/ : /❌ \*\*not met\*\*/, v.id);
      }
      assert.doesNotMatch(md, /undefined|\bNaN\b|\[object /);
      // The fixture predates "instances per prompt": its column reads "–" rather than a made-up number.
      const row80 = md.split('\n').find((l) => l.startsWith('| sluice | 80% |'))!;
      assert.equal(row80.split(' | ')[11], '–', row80);
      // The added latency by both instruments: wrk (judged) and the open-loop undici client.
      assert.match(md, /### Added latency at half of Sluice's maximum[^\n]*\n\nwrk with 64 connections/);
      assert.match(md, /### The same with an open-loop Node client/);
      assert.match(res.targets.find((v) => v.id === '2')!.value, /\(wrk, 64 connections/);
      for (const chart of charts) {
        assert.ok(existsSync(join(dir, chart)), chart);
        assert.ok(md.includes(`](${chart})`), `REPORT.md does not link ${chart}`);
        const svg = readFileSync(join(dir, chart), 'utf8').trim();
        assert.ok(svg.startsWith('<svg') && svg.endsWith('</svg>'), chart);
        assert.doesNotMatch(svg, /NaN|undefined|Infinity/, chart);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
