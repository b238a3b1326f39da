import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import type { SaturationDetector } from '../../src/saturation/detector.js';
import { globalSaturation, stageSaturation } from '../../src/saturation/stages.js';
import { UtilizationDetector, utilizationDetectorParams } from '../../src/saturation/utilization-detector.js';
import { makeEndpoint, names } from './helpers.js';

const NOW = 1_000_000;

/** A detector that reads each endpoint's `waiting` as its saturation (mean) and records its calls. */
function fakeDetector(): SaturationDetector & { calls: string[][] } {
  const calls: string[][] = [];
  return {
    type: 'fake',
    name: 'fake',
    calls,
    filter: (_ctx, _req, endpoints) => [...endpoints],
    saturation(_now, endpoints) {
      calls.push(names(endpoints));
      if (endpoints.length === 0) return { value: 1, stale: 0 };
      let sum = 0;
      let stale = 0;
      for (const e of endpoints) {
        if (e.metrics === undefined) {
          stale++;
          sum += 1;
        } else sum += e.metrics.waiting;
      }
      return { value: sum / endpoints.length, stale };
    },
  };
}

const ep = (name: string, role: string | undefined, waiting: number): Endpoint =>
  makeEndpoint(name, { ...(role === undefined ? {} : { role }), waiting }, NOW);

describe('stageSaturation', () => {
  test('partitions by role and runs the detector once per non-empty stage', () => {
    const d = fakeDetector();
    const s = stageSaturation(d, NOW, [
      ep('p1', 'prefill', 0.5),
      ep('p2', 'encode-prefill', 0.5),
      ep('d1', 'decode', 0.2),
      ep('i1', 'prefill-decode', 0.1),
      ep('i2', 'both', 0.1),
      ep('i3', 'encode-prefill-decode', 0.1),
    ]);
    assert.deepEqual(d.calls, [['p1', 'p2'], ['d1'], ['i1', 'i2', 'i3']]);
    assert.equal(s.prefill, 0.5);
    assert.equal(s.decode, 0.2);
    assert.ok(Math.abs(s.interleaved! - 0.1) < 1e-12);
    assert.equal(s.global, 0.5);
  });

  test('global is the max of the stages, above 1 when a stage is oversubscribed (no clamping)', () => {
    const d = fakeDetector();
    const s = stageSaturation(d, NOW, [ep('p', 'prefill', 1.5), ep('d', 'decode', 0.3)]);
    assert.equal(s.global, 1.5);
    const calm = stageSaturation(d, NOW, [ep('p', 'prefill', 0.3), ep('d', 'decode', 0.3)]);
    assert.equal(calm.global, 0.3);
  });

  test('a stage reading NaN (a detector bug) closes the gate: global is Infinity, not the other stages\' max', () => {
    const d = fakeDetector();
    const endpoints = [ep('p', 'prefill', NaN), ep('d', 'decode', 0.5)];
    const r = stageSaturation(d, NOW, endpoints);
    assert.equal(r.global, Infinity);
    assert.ok(Number.isNaN(r.prefill), 'the stage itself shows what its detector said');
    assert.equal(globalSaturation(d, NOW, endpoints), Infinity);
    assert.equal(globalSaturation(d, NOW, [ep('only', 'decode', NaN)]), Infinity, 'one stage alone: not -Infinity');
  });

  test('empty stages are skipped, not read as saturated', () => {
    const d = fakeDetector();
    const s = stageSaturation(d, NOW, [ep('d1', 'decode', 0.2), ep('d2', undefined, 0.4)]);
    assert.deepEqual(d.calls, [['d1', 'd2']]);
    assert.equal(s.prefill, undefined);
    assert.equal(s.interleaved, undefined);
    assert.ok(Math.abs(s.global - 0.3) < 1e-12);
  });

  test('unlabelled, unrelated labels and unknown roles all land in decode', () => {
    const d = fakeDetector();
    stageSaturation(d, NOW, [
      ep('none', undefined, 0),
      makeEndpoint('other', { labels: { zone: 'x' } }, NOW),
      ep('weird', 'encode-decode', 0),
    ]);
    assert.deepEqual(d.calls, [['none', 'other', 'weird']]);
  });

  test('encode-only endpoints take part in no stage', () => {
    const d = fakeDetector();
    const s = stageSaturation(d, NOW, [ep('e', 'encode', 5), ep('d', 'decode', 0.2)]);
    assert.deepEqual(d.calls, [['d']]);
    assert.equal(s.global, 0.2);
  });

  test('all stages empty → the detector reads the whole list; empty pool → 1.0', () => {
    const d = fakeDetector();
    const s = stageSaturation(d, NOW, [ep('e1', 'encode', 0.4), ep('e2', 'encode', 0.6)]);
    assert.deepEqual(d.calls, [['e1', 'e2']]);
    assert.equal(s.global, 0.5);
    assert.equal(s.decode, undefined);
    assert.equal(stageSaturation(d, NOW, []).global, 1);
  });

  test('stale counts add up over stages; real detector end to end', () => {
    const real = new UtilizationDetector('ud', utilizationDetectorParams.parse({}));
    const stale = makeEndpoint('p-stale', { role: 'prefill', noMetrics: true }, NOW);
    const s = stageSaturation(real, NOW, [
      stale,
      makeEndpoint('p-ok', { role: 'prefill', waiting: 0, kv: 0 }, NOW),
      makeEndpoint('d-stale', { role: 'decode', waiting: 0, age: 5000 }, NOW),
      makeEndpoint('d-busy', { role: 'decode', waiting: 10, kv: 0.1 }, NOW),
    ]);
    assert.equal(s.stale, 2);
    assert.equal(s.prefill, 0.5);
    assert.equal(s.decode, 1.5);
    assert.equal(s.global, 1.5);
    assert.equal(stageSaturation(real, NOW, []).global, 1);
  });
});

describe('globalSaturation (the flow controller\'s reading)', () => {
  const lists: Array<[string, Endpoint[]]> = [
    ['three stages', [ep('p', 'prefill', 0.5), ep('d', 'decode', 0.2), ep('i', 'both', 1.7)]],
    ['one stage', [ep('d1', 'decode', 0.2), ep('d2', undefined, 0.4)]],
    ['encode only', [ep('e1', 'encode', 0.4), ep('e2', 'encode', 0.6)]],
    ['encode beside decode', [ep('e', 'encode', 5), ep('d', 'decode', 0.2)]],
    ['empty', []],
  ];
  for (const [what, list] of lists) {
    test(`equals stageSaturation().global: ${what}`, () => {
      const d = fakeDetector();
      assert.equal(globalSaturation(d, NOW, list), stageSaturation(d, NOW, list).global);
      assert.equal(globalSaturation(d, NOW, Object.freeze([...list])), stageSaturation(d, NOW, list).global);
    });
  }

  test('a frozen list (the pool\'s) is partitioned once; a new list is partitioned anew', () => {
    const seen: Array<readonly Endpoint[]> = [];
    const d = fakeDetector();
    const spy: SaturationDetector = { ...d, saturation: (now, eps) => (seen.push(eps), d.saturation(now, eps)) };
    const list = Object.freeze([ep('p', 'prefill', 0.5), ep('d', 'decode', 0.2)]);
    globalSaturation(spy, NOW, list);
    globalSaturation(spy, NOW, list);
    assert.equal(seen.length, 4);
    assert.equal(seen[0], seen[2]); // the same prefill sub-list, not a copy
    assert.equal(seen[1], seen[3]);
    const next = Object.freeze([ep('d', 'decode', 0.9)]);
    assert.equal(globalSaturation(spy, NOW, next), 0.9);
    assert.deepEqual(names(seen[4]!), ['d']);
  });
});
