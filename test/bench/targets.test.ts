/**
 * The benchmark's verdicts (issue 7: "the benchmark prints each target as met / not met"): each
 * target flips at its threshold, a part that did not run reads "not measured", and an added p99
 * within the client's own timing noise is "inconclusive" rather than a verdict. Synthetic results,
 * no traffic.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { evaluateTargets, printVerdicts, TARGETS, type BenchResults, type Meta, type Verdict } from '../../bench/lib/report.js';
import type { OverheadResult } from '../../bench/lib/overhead.js';
import type { QualityResult, StepResult } from '../../bench/lib/quality.js';
import type { ScaleResult } from '../../bench/lib/scale.js';
import { summarize, type Summary } from '../../bench/lib/stats.js';

type Parts = Omit<BenchResults, 'targets'>;

const META: Meta = {
  date: '2026-11-30T00:00:00.000Z',
  mode: 'quick',
  only: ['overhead', 'quality', 'scale'],
  node: 'v20',
  cpus: 2,
  cpuModel: 'test',
  git: { head: 'abc', dirty: false },
  loadAverageStart: [0, 0, 0],
  loadAverageEnd: [0, 0, 0],
  seconds: 1,
  srcHashes: {},
};

const IDS = ['1a', '1b', '1c', '1d', '2', '3', '4', '5a', '5b', '6', '7'];

function verdict(res: Parts, id: string): Verdict {
  const v = evaluateTargets(res).find((x) => x.id === id);
  assert.ok(v, `no verdict ${id}`);
  return v;
}

const flat = (ms: number): Summary => summarize([ms]);

/** Overhead with the given Sluice/nginx throughput ratio in every case, and a paced comparison. */
function overhead(ratio: number, paced: { addedP99Ms?: number; lagMs?: number; wrkAddedP99Ms?: number } = {}): OverheadResult {
  const ratios = [];
  for (const [c, target] of [['short', 'sluice'], ['4kb', 'sluice-3s']] as const) {
    for (const mode of ['json', 'sse'] as const) {
      ratios.push({ case: c, mode, of: `${target}/nginx`, throughput: ratio, p50: 1, p99: 1 });
      ratios.push({ case: c, mode, of: 'node-proxy/nginx', throughput: 0.62, p50: 1, p99: 1 });
      ratios.push({ case: c, mode, of: `${target}/node-proxy`, throughput: ratio / 0.62, p50: 1, p99: 1 });
    }
  }
  const lag = paced.lagMs ?? 0.2;
  const round = (p99: number) => ({ targetRps: 1000, achievedRps: 1000, sent: 1000, completed: 1000, errors: 0, latencyMs: { ...flat(1), p99 }, sendLagMs: { ...flat(0.1), p99: lag } });
  const wrk =
    paced.wrkAddedP99Ms === undefined
      ? {}
      : { wrk: { connections: 64, addedP99Ms: paced.wrkAddedP99Ms, addedP50Ms: 0.1, nodeAddedP99Ms: 0.5, direct: round(1), sluice: round(1 + paced.wrkAddedP99Ms) } };
  return {
    ratios,
    runs: [],
    paced:
      paced.addedP99Ms === undefined
        ? { rateRps: 1000, seconds: 1, ...wrk }
        : { rateRps: 1000, seconds: 1, addedP99Ms: paced.addedP99Ms, addedP50Ms: 0.1, direct: round(1), sluice: round(1 + paced.addedP99Ms), ...wrk },
  } as unknown as OverheadResult;
}

function step(load: number, p90: number, extra: Partial<StepResult> = {}): StepResult {
  return { load, ttftMs: { ...flat(p90 / 2), p90 }, share: [0.25, 0.25, 0.25, 0.25], maxShareOverMean: 1, ...extra } as unknown as StepResult;
}

function quality(sluiceP90: number, rrP90: number, maxShareOverMean?: number): QualityResult {
  return {
    routers: [
      { router: 'sluice', steps: [step(0.3, 1), step(0.8, sluiceP90)] },
      { router: 'nginx-rr', steps: [step(0.3, 1), step(0.8, rrP90)] },
    ],
    ...(maxShareOverMean === undefined ? {} : { distinct: { router: 'sluice', step: step(0.6, 10, { maxShareOverMean }) } }),
  } as unknown as QualityResult;
}

function scale(o: { bytesPerRequest?: number; extrapolated100kMB?: number; sched64Us?: number; rss?: [number, number]; heap?: [number, number] }): ScaleResult {
  const s: ScaleResult = { errors: {} };
  if (o.bytesPerRequest !== undefined) {
    s.flowcontrol = { depths: [{ depth: 100_000, memory: { controllerBytes: o.bytesPerRequest - 100, requestBytes: 100 } }], unsaturatedEnqueueDispatchNs: 1, gcExposed: true } as unknown as ScaleResult['flowcontrol'];
  }
  if (o.extrapolated100kMB !== undefined) {
    s.queue = { rssIdleMB: 50, bytesPerQueuedRequest: (o.extrapolated100kMB * 1048576) / 100_000, requests: 5000, extrapolated100kMB: o.extrapolated100kMB } as unknown as ScaleResult['queue'];
  }
  if (o.sched64Us !== undefined) s.sched = [{ endpoints: 8, medianUs: 1, p99Us: 2 }, { endpoints: 64, medianUs: o.sched64Us, p99Us: o.sched64Us * 2 }] as unknown as ScaleResult['sched'];
  if (o.rss) {
    const [a, b] = o.rss;
    const [ha, hb] = o.heap ?? [20, 20];
    s.soak = { requests: 1_000_000, startMB: a, endMB: b, growthMB: b - a, gcStart: { rssMB: a, heapUsedMB: ha }, gcEnd: { rssMB: b, heapUsedMB: hb } } as unknown as ScaleResult['soak'];
  }
  return s;
}

describe('benchmark target verdicts', () => {
  test('every target gets a verdict, in order; a part that did not run is "not measured", not a failure', () => {
    const vs = evaluateTargets({ meta: META, errors: {} });
    assert.deepEqual(
      vs.map((v) => v.id),
      IDS,
    );
    for (const v of vs) {
      assert.equal(v.met, null, v.id);
      assert.match(v.value, /not measured/, v.id);
    }
    const lines: string[] = [];
    printVerdicts(vs, (l) => lines.push(l));
    assert.equal(lines.filter((l) => l.includes('[not measured')).length, IDS.length);
  });

  test('throughput (1a–1d) is met at 0.6 × nginx and not below; the bare Node floor is reported beside it', () => {
    for (const id of ['1a', '1b', '1c', '1d']) {
      assert.equal(verdict({ meta: META, errors: {}, overhead: overhead(TARGETS.throughputVsNginx) }, id).met, true, id);
      assert.equal(verdict({ meta: META, errors: {}, overhead: overhead(0.59) }, id).met, false, id);
    }
    assert.match(verdict({ meta: META, errors: {}, overhead: overhead(0.55) }, '1a').value, /×0\.55 \(a bare Node proxy reaches ×0\.62 of nginx/);
  });

  test('added p99 (2): met at ≤ 2 ms, not met above, inconclusive when within the client\'s own lateness', () => {
    const at = (addedP99Ms: number, lagMs = 0.2) => verdict({ meta: META, errors: {}, overhead: overhead(1, { addedP99Ms, lagMs }) }, '2');
    assert.equal(at(1.5).met, true);
    assert.equal(at(2.5).met, false);
    assert.equal(at(30).met, false);
    const noisy = at(2.5, 1);
    assert.equal(noisy.met, null);
    assert.equal(noisy.inconclusive, true);
    assert.match(noisy.value, /inconclusive/);
    // Without a paced run there is nothing to decide.
    assert.equal(verdict({ meta: META, errors: {}, overhead: overhead(1) }, '2').met, null);
  });

  test('added p99 (2) is judged on wrk when it ran; the open-loop undici client\'s number is shown beside it', () => {
    const at = (wrkAddedP99Ms: number, addedP99Ms: number) => verdict({ meta: META, errors: {}, overhead: overhead(1, { wrkAddedP99Ms, addedP99Ms }) }, '2');
    const met = at(1.5, 30);
    assert.equal(met.met, true);
    assert.match(met.value, /^1\.50 ms at 1,000 req\/s \(wrk, 64 connections/);
    assert.match(met.value, /open-loop undici client measured 30\.00 ms/);
    assert.equal(at(2.5, 1).met, false);
    // No "inconclusive" band for wrk: it does not measure how late it sent, and it does not stall.
    assert.equal(at(2.1, 1).met, false);
  });

  test('TTFT (3) compares p90 at the 80 % step only: met at 0.5 × round-robin, not above', () => {
    assert.equal(verdict({ meta: META, errors: {}, quality: quality(100, 200) }, '3').met, true);
    const v = verdict({ meta: META, errors: {}, quality: quality(101, 200) }, '3');
    assert.equal(v.met, false);
    assert.match(v.value, /101 vs 200 ms = ×0\.51/);
    // No round-robin row (nginx missing): not measured rather than a verdict against nothing.
    const noRr = quality(10, 200);
    noRr.routers = noRr.routers.filter((r) => r.router !== 'nginx-rr');
    assert.equal(verdict({ meta: META, errors: {}, quality: noRr }, '3').met, null);
  });

  test('share (4): met at 1.5 × the mean, not above; not measured without the distinct-prompts step', () => {
    assert.equal(verdict({ meta: META, errors: {}, quality: quality(1, 2, 1.5) }, '4').met, true);
    assert.equal(verdict({ meta: META, errors: {}, quality: quality(1, 2, 1.51) }, '4').met, false);
    assert.equal(verdict({ meta: META, errors: {}, quality: quality(1, 2) }, '4').met, null);
  });

  test('memory (5a, 5b): the idle gateway counts toward 300 MB; 5b is judged on the extrapolation', () => {
    // 2,000 B × 100k = 190.7 MB + 50 MB idle = 241 MB: met. 3,000 B → 286 + 50 = 336 MB: not.
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ bytesPerRequest: 2000, extrapolated100kMB: 1 }) }, '5a').met, true);
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ bytesPerRequest: 3000, extrapolated100kMB: 1 }) }, '5a').met, false);
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ extrapolated100kMB: 299 }) }, '5b').met, true);
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ extrapolated100kMB: 1183 }) }, '5b').met, false);
  });

  test('5b shows the bare net.Server floor per connection, extrapolated to 100k, when it was measured', () => {
    const s = scale({ extrapolated100kMB: 1183 });
    assert.doesNotMatch(verdict({ meta: META, errors: {}, scale: s }, '5b').value, /net\.Server/);
    s.queue!.tcpBaseline = { bytesPerRequest: 4565, heapBytesPerRequest: 1421, held: 5000 };
    // 4,565 B × 100k = 435.3 MiB.
    assert.match(verdict({ meta: META, errors: {}, scale: s }, '5b').value, /net\.Server holding the connections, no HTTP: 4,565 B\/connection \(100k ≈ 435 MB/);
  });

  test('scheduling 64 endpoints (6): met under 50 µs', () => {
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ sched64Us: 49.9 }) }, '6').met, true);
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ sched64Us: 50 }) }, '6').met, false);
  });

  test('RSS after 1M requests (7): growth up to 5 % (at least 5 MB) after GC is no growth; heap growth above 5 MB is', () => {
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ rss: [150, 157] }) }, '7').met, true); // 7 ≤ 7.5
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ rss: [150, 158] }) }, '7').met, false);
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ rss: [60, 64.9] }) }, '7').met, true); // the 5 MB floor
    assert.equal(verdict({ meta: META, errors: {}, scale: scale({ rss: [150, 150], heap: [20, 26] }) }, '7').met, false);
  });
});
