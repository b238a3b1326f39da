import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import type { Scorer } from '../../src/scheduling/framework.js';
import {
  activeRequestScorerDefinition,
  ActiveRequestScorer,
} from '../../src/scheduling/plugins/active-request-scorer.js';
import {
  kvCacheUtilizationScorerDefinition,
  KvCacheUtilizationScorer,
} from '../../src/scheduling/plugins/kv-cache-utilization-scorer.js';
import { QueueScorer, queueScorerDefinition } from '../../src/scheduling/plugins/queue-scorer.js';
import { LoadAwareScorer, loadAwareScorerDefinition } from '../../src/scheduling/plugins/load-aware-scorer.js';
import { makeContext, makeEndpoint, makeRequest } from './helpers.js';

function scores(scorer: Scorer, endpoints: Endpoint[]): number[] {
  const out = new Float64Array(endpoints.length);
  scorer.score(makeContext(), makeRequest(), endpoints, out);
  return [...out];
}

function approx(actual: number[], expected: number[], what = ''): void {
  assert.equal(actual.length, expected.length);
  actual.forEach((v, i) => assert.ok(Math.abs(v - expected[i]!) < 1e-9, `${what} [${i}] ${v} ≠ ${expected[i]}`));
}

describe('queue-scorer', () => {
  test('requests in flight at the scrape are in its running count: not counted twice', () => {
    const a = makeEndpoint('a', { running: 3, inFlight: 3 }); // in the page: inFlightAtScrape 3
    const b = makeEndpoint('b', { running: 0 });
    a.observedSlots = b.observedSlots = 4;
    approx(scores(new QueueScorer('q'), [a, b]), [1, 1], 'a has a free slot');
  });

  const scorer = new QueueScorer('queue-scorer');
  const llmd = new QueueScorer('queue-scorer', false);

  test('llm-d form: (maxQ − q)/(maxQ − minQ) over candidates, q = the scraped waiting queue', () => {
    approx(
      scores(llmd, [makeEndpoint('a', { waiting: 0 }), makeEndpoint('b', { waiting: 5 }), makeEndpoint('c', { waiting: 10 })]),
      [1, 0.5, 0],
    );
    approx(scores(llmd, [makeEndpoint('a', { waiting: 4 }), makeEndpoint('b', { waiting: 8 })]), [1, 0]);
  });

  test('default: q = the queue a request sent now would join (one more than waiting while every slot is taken)', () => {
    approx(
      scores(scorer, [makeEndpoint('a', { waiting: 0 }), makeEndpoint('b', { waiting: 5 }), makeEndpoint('c', { waiting: 10 })]),
      [1, 5 / 11, 0], // q = 0, 6, 11
    );
  });

  test('default: a full server scores below one with a free slot though neither has a queue', () => {
    const full = makeEndpoint('full', { running: 8 });
    const free = makeEndpoint('free', { running: 5 });
    approx(scores(scorer, [full, free]), [1, 1], 'slots unknown until a queue was seen: both assumed free');
    approx(scores(llmd, [full, free]), [1, 1]);
    full.observedSlots = free.observedSlots = 8;
    approx(scores(scorer, [full, free]), [0, 1]);
    approx(scores(llmd, [full, free]), [1, 1], 'llm-d cannot tell them apart');
  });

  test('default: the slots count what Sluice sent and saw finish since the scrape; the waiting queue is the scraped one', () => {
    const a = makeEndpoint('a', { running: 6 });
    const b = makeEndpoint('b', { running: 7 });
    a.observedSlots = b.observedSlots = 8;
    approx(scores(scorer, [a, b]), [1, 1], 'both have a free slot');
    b.inFlight += 1; // b's last slot taken since the scrape
    approx(scores(scorer, [a, b]), [1, 0]);
    const c = makeEndpoint('c', { running: 8 });
    c.observedSlots = 8;
    approx(scores(scorer, [c, b]), [1, 1], 'both full');
    c.inFlight -= 1; // one finished since: a slot is free
    approx(scores(scorer, [c, b]), [1, 0]);
    const d = makeEndpoint('d', { running: 8, waiting: 2 });
    d.observedSlots = 8;
    d.inFlight -= 3; // finished since, but q stays the scraped 2 + 1
    approx(scores(scorer, [d, b, c]), [0, 2 / 3, 1]);
  });

  test('all equal → 1', () => {
    for (const s of [scorer, llmd]) {
      approx(scores(s, [makeEndpoint('a', { waiting: 3 }), makeEndpoint('b', { waiting: 3 })]), [1, 1]);
      approx(scores(s, [makeEndpoint('a', { waiting: 7 })]), [1]);
    }
  });

  test('missing metrics → worst (0), and left out of min/max', () => {
    for (const s of [scorer, llmd]) {
      approx(
        scores(s, [makeEndpoint('a', { waiting: 4 }), makeEndpoint('b', { noMetrics: true }), makeEndpoint('c', { waiting: 8 })]),
        [1, 0, 0],
      );
      approx(scores(s, [makeEndpoint('a', { waiting: 4 }), makeEndpoint('b', { noMetrics: true })]), [1, 0]);
      approx(scores(s, [makeEndpoint('a', { noMetrics: true })]), [0]);
    }
  });

  test('parameters: slotAware (default true), strict', () => {
    assert.deepEqual(queueScorerDefinition.params.parse({}), { slotAware: true });
    assert.deepEqual(queueScorerDefinition.params.parse({ slotAware: false }), { slotAware: false });
    assert.equal(queueScorerDefinition.params.safeParse({ foo: 1 }).success, false);
    assert.equal(queueScorerDefinition.params.safeParse({ slotAware: 'yes' }).success, false);
  });
});

describe('kv-cache-utilization-scorer', () => {
  const scorer = new KvCacheUtilizationScorer('kv');

  test('1 − kvUsage; missing metrics → 0', () => {
    approx(
      scores(scorer, [makeEndpoint('a', { kv: 0 }), makeEndpoint('b', { kv: 0.25 }), makeEndpoint('c', { kv: 1 }), makeEndpoint('d', { noMetrics: true })]),
      [1, 0.75, 0, 0],
    );
  });

  test('strict parameters', () => {
    assert.equal(kvCacheUtilizationScorerDefinition.params.safeParse({ x: true }).success, false);
  });
});

describe('load-aware-scorer', () => {
  test('0.5 for an empty queue, falling to 0 at the threshold; missing metrics → 0', () => {
    approx(
      scores(new LoadAwareScorer('l', 8), [
        makeEndpoint('a', { waiting: 0, running: 8 }),
        makeEndpoint('b', { waiting: 2 }),
        makeEndpoint('c', { waiting: 8 }),
        makeEndpoint('d', { waiting: 100 }),
        makeEndpoint('e', { noMetrics: true }),
      ]),
      [0.5, 0.375, 0, 0, 0],
    );
  });

  test("parameters: threshold 128 by default; not positive → 128 with a warning (llm-d's reading)", () => {
    const p = loadAwareScorerDefinition.params;
    assert.deepEqual(p.parse({}), { threshold: 128 });
    approx(scores(loadAwareScorerDefinition.create('l', p.parse({}), {} as never) as Scorer, [makeEndpoint('a', { waiting: 32 })]), [0.375]);
    approx(scores(new LoadAwareScorer('l', 0), [makeEndpoint('a', { waiting: 64 })]), [0.25]);
    assert.deepEqual(loadAwareScorerDefinition.configWarnings!(p.parse({ threshold: -1 }), { metricsIntervalMs: 50 }), [
      { parameter: 'threshold', message: 'threshold -1 is not positive: read as 128 (as llm-d does)' },
    ]);
    assert.deepEqual(loadAwareScorerDefinition.configWarnings!(p.parse({ threshold: 4 }), { metricsIntervalMs: 50 }), []);
    assert.equal(p.safeParse({ threshold: 1.5 }).success, false);
    assert.equal(p.safeParse({ queueThreshold: 4 }).success, false);
  });
});

describe('active-request-scorer', () => {
  const inflight = (...counts: number[]) => counts.map((n, i) => makeEndpoint(`e${i}`, { inFlight: n }));

  test('defaults: idle (≤ 0) → 1, else (max − count)/max', () => {
    const scorer = new ActiveRequestScorer('ar', activeRequestScorerDefinition.params.parse({}));
    approx(scores(scorer, inflight(0, 2, 4)), [1, 0.5, 0]);
    approx(scores(scorer, inflight(1, 3)), [2 / 3, 0]);
  });

  test('all idle → all 1', () => {
    const scorer = new ActiveRequestScorer('ar', activeRequestScorerDefinition.params.parse({}));
    approx(scores(scorer, inflight(0, 0, 0)), [1, 1, 1]);
  });

  test('idleThreshold and maxBusyScore', () => {
    const scorer = new ActiveRequestScorer('ar', activeRequestScorerDefinition.params.parse({ idleThreshold: 2, maxBusyScore: 0.5 }));
    approx(scores(scorer, inflight(0, 2, 4)), [1, 1, 0]);
    approx(scores(scorer, inflight(3, 6)), [0.25, 0]);
  });

  test('parameters: defaults, deprecated requestTimeout accepted, out-of-range values read as the defaults with a warning (llm-d), bad types rejected', () => {
    const p = activeRequestScorerDefinition.params;
    assert.deepEqual(p.parse({}), { idleThreshold: 0, maxBusyScore: 1 });
    assert.equal(p.safeParse({ requestTimeout: '2m' }).success, true);
    // Accepted, and said to be ignored (sluice validate shows it at the key).
    const warn = (raw: object) => activeRequestScorerDefinition.configWarnings!(p.parse(raw), { metricsIntervalMs: 50 }).map((w) => w.parameter);
    assert.deepEqual(warn({ requestTimeout: '2m' }), ['requestTimeout']);
    assert.deepEqual(warn({}), []);
    assert.deepEqual(warn({ idleThreshold: -1, maxBusyScore: 1.5 }), ['idleThreshold', 'maxBusyScore']);
    assert.deepEqual(warn({ maxBusyScore: -0.1 }), ['maxBusyScore']);
    assert.deepEqual(warn({ idleThreshold: 0, maxBusyScore: 0 }), []);
    // Read as idleThreshold 0 and maxBusyScore 1: the defaults' scores.
    approx(scores(new ActiveRequestScorer('ar', p.parse({ idleThreshold: -1, maxBusyScore: 1.5 })), inflight(0, 2, 4)), [1, 0.5, 0]);
    assert.equal(p.safeParse({ idleThreshold: 0.5 }).success, false);
    assert.equal(p.safeParse({ maxBusyScore: 'high' }).success, false);
    assert.equal(p.safeParse({ idle: 1 }).success, false);
  });
});
