/** Outlier detection: pure policy (outlier.ts) and the pool that applies it, with an explicit clock. */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { Pool, type OutlierEvent, type PoolChangeReason } from '../../src/datalayer/pool.js';
import type { Endpoint, EndpointSpec, InFlightAttempt } from '../../src/datalayer/endpoint.js';
import { DEFAULT_OUTLIER_POLICY, ejectionTime, maxEjected, stalledMs, type OutlierPolicy } from '../../src/datalayer/outlier.js';
import { UtilizationDetector, utilizationDetectorParams } from '../../src/saturation/utilization-detector.js';
import { ConcurrencyDetector, concurrencyDetectorParams } from '../../src/saturation/concurrency-detector.js';
import { globalSaturation, stageSaturation } from '../../src/saturation/stages.js';

const spec = (name: string, port: number, role?: string): EndpointSpec => ({ name, address: '10.0.0.1', port, labels: role === undefined ? {} : { 'llm-d.ai/role': role } });
const POLICY: OutlierPolicy = { consecutiveFailures: 3, baseEjectionTime: 1000, maxEjectionTime: 3500, maxEjectionPercent: 50, stallTimeout: 0, rescueInFlight: true };

function poolOf(n: number, policy: OutlierPolicy = POLICY) {
  const events: [string, OutlierEvent][] = [];
  const changes: PoolChangeReason[] = [];
  const pool = new Pool(
    Array.from({ length: n }, (_, i) => spec(`ep${i}`, i + 1)),
    { outlierPolicy: policy, onOutlier: (ep, e) => events.push([ep.name, e]) },
  );
  pool.onChange((reason) => changes.push(reason));
  return { pool, events, changes, ep: (i: number) => pool.endpoints[i]! };
}

/** One request on `ep` that ends in a failure (`ok` false) or a whole 2xx answer. */
function request(pool: Pool, ep: Endpoint, ok: boolean, now: number): void {
  const probe = pool.acquire(ep);
  if (ok) pool.upstreamSucceeded(ep);
  else pool.upstreamFailed(ep, 'http_5xx', now);
  pool.release(ep, ok, probe);
}

const names = (eps: readonly Endpoint[]) => eps.map((e) => e.name);

describe('outlier policy', () => {
  test('ejection time doubles per ejection in a row, capped; the cap on ejected endpoints rounds down', () => {
    assert.deepEqual([1, 2, 3, 4].map((t) => ejectionTime(POLICY, t)), [1000, 2000, 3500, 3500]);
    assert.equal(ejectionTime(DEFAULT_OUTLIER_POLICY, 1000), DEFAULT_OUTLIER_POLICY.maxEjectionTime, 'no overflow on a long run');
    assert.deepEqual([1, 2, 3, 4, 5].map((n) => maxEjected(POLICY, n)), [0, 1, 1, 2, 2]);
    assert.equal(maxEjected({ ...POLICY, maxEjectionPercent: 100 }, 3), 3);
  });
});

describe('Pool: outlier detection', () => {
  test('consecutive failures eject an endpoint: it leaves the eligible list until the ejection runs out', () => {
    const { pool, events, changes, ep } = poolOf(3);
    assert.equal(pool.eligible(0), pool.endpoints, 'none ejected: the list itself');
    request(pool, ep(1), false, 10);
    request(pool, ep(1), false, 20);
    assert.equal(pool.eligible(25), pool.endpoints, 'two failures: still eligible');
    request(pool, ep(1), false, 30);
    assert.deepEqual(events, [['ep1', { kind: 'ejected', ms: 1000, reason: '3 failed requests in a row, the last: http_5xx' }]]);
    assert.ok(changes.includes('outlier'), 'listeners hear of it (flow control re-reads saturation)');
    const eligible = pool.eligible(31);
    assert.deepEqual(names(eligible), ['ep0', 'ep2']);
    assert.ok(Object.isFrozen(eligible));
    assert.equal(pool.eligible(500), eligible, 'the same array while nothing changes');
    assert.deepEqual(names(pool.eligible(1029)), ['ep0', 'ep2'], 'still out 1 ms before the end');
    assert.equal(pool.eligible(1030), pool.endpoints, 'back when its time is up');
    assert.deepEqual(events[1], ['ep1', { kind: 'returned' }]);
  });

  test('a whole 2xx answer ends the run; a 4xx or a client that left (even after a 2xx status line) counts neither way', () => {
    const { pool, events, ep } = poolOf(2);
    request(pool, ep(0), false, 1);
    request(pool, ep(0), false, 2);
    request(pool, ep(0), true, 3);
    assert.equal(ep(0).failureStreak, 0);
    request(pool, ep(0), false, 4);
    request(pool, ep(0), false, 5);
    // A 4xx answer or a cancelled request: released, not answered 2xx, no failure.
    pool.acquire(ep(0));
    pool.release(ep(0), false);
    // A client that left after a 2xx status line: released as answered (slow start), no success.
    pool.acquire(ep(0));
    pool.release(ep(0), true);
    assert.equal(ep(0).failureStreak, 2);
    assert.equal(events.length, 0);
    request(pool, ep(0), false, 6);
    assert.equal(events.length, 1, 'the third failure in a row');
  });

  test('back from ejection, one more failure ejects it again for twice as long; a success resets the backoff', () => {
    const { pool, events, ep } = poolOf(2);
    for (let i = 0; i < 3; i++) request(pool, ep(0), false, 0);
    assert.equal(ep(0).ejectedUntil, 1000);
    // Requests already in flight that fail while it is out neither lengthen nor repeat the ejection.
    request(pool, ep(0), false, 500);
    assert.equal(ep(0).ejectedUntil, 1000);
    // Back: the next failure ejects it again (half-open).
    pool.eligible(1000);
    request(pool, ep(0), false, 1000);
    assert.equal(ep(0).ejectedUntil, 3000, 'second ejection in a row: 2 s');
    pool.eligible(3000);
    request(pool, ep(0), false, 3000);
    assert.equal(ep(0).ejectedUntil, 6500, 'third: capped at maxEjectionTime');
    assert.deepEqual(
      events.filter(([, e]) => e.kind === 'ejected').map(([, e]) => (e as { ms: number }).ms),
      [1000, 2000, 3500],
    );
    pool.eligible(6500);
    request(pool, ep(0), true, 6500);
    for (let i = 0; i < 3; i++) request(pool, ep(0), false, 7000);
    assert.equal(ep(0).ejectedUntil, 8000, 'after a success the backoff starts over');
  });

  test('back from an ejection, it takes one request at a time (a probe) until a whole 2xx answer', () => {
    const { pool, ep } = poolOf(3);
    // A long stream sent before the ejection is still in flight: it is no probe.
    assert.equal(pool.acquire(ep(0)), false);
    for (let k = 0; k < 3; k++) request(pool, ep(0), false, 0);
    assert.deepEqual(names(pool.eligible(1000)), ['ep0', 'ep1', 'ep2'], 'back, though a request from before is in flight');
    assert.equal(pool.acquire(ep(0)), true, 'a probe');
    assert.deepEqual(names(pool.eligible(1001)), ['ep1', 'ep2'], 'its probe is in flight: no second request');
    pool.release(ep(0), false, true); // the probe's client left: no answer either way
    assert.deepEqual(names(pool.eligible(1002)), ['ep0', 'ep1', 'ep2'], 'another probe may go');
    const probe = pool.acquire(ep(0));
    pool.upstreamSucceeded(ep(0));
    pool.release(ep(0), true, probe);
    assert.equal(pool.acquire(ep(0)), false);
    assert.equal(pool.acquire(ep(0)), false);
    assert.deepEqual(names(pool.eligible(1003)), ['ep0', 'ep1', 'ep2'], 'answered: off probation');
  });

  test('at most maxEjectionPercent of a stage is out at once; past it, failing endpoints keep serving', () => {
    const { pool, ep } = poolOf(4);
    for (const i of [0, 1, 2]) for (let k = 0; k < 3; k++) request(pool, ep(i), false, 10);
    assert.deepEqual(names(pool.eligible(11)), ['ep2', 'ep3'], 'two of four');
    assert.equal(ep(2).ejectedUntil, 0);
    // When one comes back, the next failure of the third may take its place.
    pool.eligible(1010);
    request(pool, ep(2), false, 1010);
    assert.equal(ep(2).ejectedUntil, 2010);
  });

  test('the cap is per stage: two prefill and two decode endpoints all failing leave one of each', () => {
    const events: string[] = [];
    const pool = new Pool([spec('p1', 1, 'prefill'), spec('p2', 2, 'prefill'), spec('d1', 3, 'decode'), spec('d2', 4, 'decode')], {
      outlierPolicy: POLICY,
      onOutlier: (e, ev) => events.push(`${e.name} ${ev.kind}`),
    });
    for (const e of pool.endpoints) for (let k = 0; k < 3; k++) request(pool, e, false, 10);
    assert.deepEqual(events, ['p1 ejected', 'd1 ejected']);
    assert.deepEqual(names(pool.eligible(11)), ['p2', 'd2']);
  });

  test('a pool of one never ejects; a policy of 0 failures never ejects; a removed endpoint is not ejected', () => {
    const one = poolOf(1);
    for (let k = 0; k < 10; k++) request(one.pool, one.ep(0), false, 1);
    assert.equal(one.events.length, 0);
    const off = poolOf(2, { ...POLICY, consecutiveFailures: 0 });
    for (let k = 0; k < 10; k++) request(off.pool, off.ep(0), false, 1);
    assert.equal(off.events.length, 0);
    const { pool, events, ep } = poolOf(3);
    const gone = ep(2);
    pool.acquire(gone);
    pool.setEndpoints([spec('ep0', 1), spec('ep1', 2)]);
    for (let k = 0; k < 3; k++) pool.upstreamFailed(gone, 'cut', 1);
    pool.release(gone);
    assert.equal(events.length, 0);
  });

  test('every endpoint of a stage set aside: that stage keeps them all rather than none, but for the prefill stage (P/D then serves decode-only); the others stay out', () => {
    const { pool, ep } = poolOf(2, { ...POLICY, maxEjectionPercent: 100 });
    for (const i of [0, 1]) for (let k = 0; k < 3; k++) request(pool, ep(i), false, 0);
    assert.equal(pool.eligible(1), pool.endpoints);
    const pd = new Pool([spec('p1', 1, 'prefill'), spec('d1', 3, 'decode'), spec('d2', 4, 'decode')], { outlierPolicy: { ...POLICY, maxEjectionPercent: 100 } });
    const [p1, d1] = pd.endpoints;
    for (let k = 0; k < 3; k++) request(pd, p1!, false, 0);
    for (let k = 0; k < 3; k++) request(pd, d1!, false, 0);
    assert.deepEqual(names(pd.eligible(1)), ['d2'], 'the prefill tier set aside whole is left out: no prefill leg waits on it');
    for (let k = 0; k < 3; k++) request(pd, pd.endpoints[2]!, false, 0);
    assert.deepEqual(names(pd.eligible(2)), ['d1', 'd2'], 'the decode tier set aside whole keeps both');
  });

  test('when the first of a stage set aside whole returns, the ones still ejected leave the list', () => {
    const pool = new Pool([spec('d1', 1, 'decode'), spec('d2', 2, 'decode'), spec('p1', 3, 'prefill')], { outlierPolicy: { ...POLICY, maxEjectionPercent: 100 } });
    const [d1, d2] = pool.endpoints as Endpoint[];
    for (let k = 0; k < 3; k++) request(pool, d1!, false, 0); // out until 1000
    for (let k = 0; k < 3; k++) request(pool, d2!, false, 500); // out until 1500
    assert.deepEqual(names(pool.eligible(600)), ['d1', 'd2', 'p1'], 'all of the stage set aside: it keeps both');
    assert.deepEqual(names(pool.eligible(1200)), ['d1', 'p1'], 'd1 is back, d2 ejected until 1500');
  });

  test('an endpoint whose probe is in flight counts toward maxEjectionPercent', () => {
    const { pool, ep } = poolOf(4);
    for (let k = 0; k < 3; k++) request(pool, ep(0), false, 0); // out until 1000
    for (let k = 0; k < 3; k++) request(pool, ep(1), false, 500); // out until 1500
    pool.eligible(1000);
    assert.equal(pool.acquire(ep(0)), true); // its probe, still out
    assert.deepEqual(names(pool.eligible(1001)), ['ep2', 'ep3']);
    for (let k = 0; k < 3; k++) request(pool, ep(2), false, 1100);
    assert.deepEqual(names(pool.eligible(1100)), ['ep2', 'ep3'], 'two of four out already');
  });

  test('a reload keeps an ejection (same endpoint object), drops it with the endpoint, and applies a new policy', () => {
    const { pool, ep } = poolOf(3);
    for (let k = 0; k < 3; k++) request(pool, ep(1), false, 0);
    assert.deepEqual(names(pool.eligible(1)), ['ep0', 'ep2']);
    pool.setEndpoints([spec('ep0', 1), spec('ep1', 2), spec('ep2', 3), spec('ep3', 4)]);
    assert.deepEqual(names(pool.eligible(2)), ['ep0', 'ep2', 'ep3'], 'still out after a reload that kept it');
    pool.setEndpoints([spec('ep0', 1), spec('ep2', 3)]);
    assert.equal(pool.eligible(3), pool.endpoints, 'gone with the endpoint');
    pool.setOutlierPolicy({ ...POLICY, consecutiveFailures: 1 }, 4);
    request(pool, ep(0), false, 4);
    assert.deepEqual(names(pool.eligible(5)), ['ep2']);
  });

  test('an ejected endpoint removed with a request in flight, then taken back by a reload, is still out', () => {
    const { pool, ep } = poolOf(4);
    const b = ep(1);
    pool.acquire(b);
    for (let k = 0; k < 3; k++) pool.upstreamFailed(b, 'http_5xx', 0);
    assert.deepEqual(names(pool.eligible(1)), ['ep0', 'ep2', 'ep3']);
    pool.setEndpoints([spec('ep0', 1), spec('ep2', 3), spec('ep3', 4)]);
    assert.equal(pool.eligible(2), pool.endpoints);
    pool.setEndpoints([spec('ep0', 1), spec('ep1', 2), spec('ep2', 3), spec('ep3', 4)]);
    assert.equal(pool.byName('ep1'), b, 'the same object, taken back from draining');
    assert.deepEqual(names(pool.eligible(3)), ['ep0', 'ep2', 'ep3']);
  });

  test('a reload that turns detection off ends every ejection and forgets the runs; a shorter maxEjectionTime cuts one short', () => {
    const { pool, ep } = poolOf(4, { ...POLICY, maxEjectionTime: 60_000, baseEjectionTime: 60_000 });
    for (let k = 0; k < 3; k++) request(pool, ep(0), false, 0);
    pool.setOutlierPolicy({ ...POLICY, maxEjectionTime: 10_000, baseEjectionTime: 1000 }, 100);
    assert.equal(ep(0).ejectedUntil, 10_100);
    pool.setOutlierPolicy({ ...POLICY, consecutiveFailures: 0 }, 200);
    assert.equal(pool.eligible(200), pool.endpoints);
    assert.deepEqual([ep(0).failureStreak, ep(0).ejections], [0, 0]);
    for (let k = 0; k < 5; k++) request(pool, ep(1), false, 300);
    assert.equal(ep(1).failureStreak, 0, 'nothing counted while off');
  });

  test('saturation read over the eligible endpoints: the idle page or idle slots of an ejected endpoint are no room', () => {
    const two = new Pool([spec('a', 1), spec('b', 2)], { outlierPolicy: POLICY });
    const [a, b] = two.endpoints as Endpoint[];
    two.recordScrape(a!, { metrics: { waiting: 5, running: 8, kvUsage: 0.5 } }, 1); // (0 reads as never)
    two.recordScrape(b!, { metrics: { waiting: 0, running: 0, kvUsage: 0 } }, 1);
    for (let k = 0; k < 3; k++) request(two, b!, false, 1);
    const detector = new UtilizationDetector('d', utilizationDetectorParams.parse({ metricsStalenessThreshold: '10s' }));
    assert.deepEqual(stageSaturation(detector, 2, two.eligible(2)), { global: 1, stale: 0, decode: 1 });
    assert.equal(globalSaturation(detector, 2, two.endpoints), 0.5, 'what b would add');
    two.acquire(a!);
    two.acquire(a!);
    const cd = new ConcurrencyDetector('c', concurrencyDetectorParams.parse({ maxConcurrency: 2 }));
    assert.equal(globalSaturation(cd, 2, two.eligible(2)), 1);
    assert.equal(globalSaturation(cd, 2, two.endpoints), 0.5);
    assert.equal(two.nextReturnTime(2), 1001, 'the gate is looked at again when the ejection ends');
    assert.equal(two.nextReturnTime(1001), undefined);
  });
});

describe('Pool: stalled endpoints (work owed, metrics page unchanged)', () => {
  const page = (running: number, progress?: number, kvUsage = 0.1, waiting = 0) => ({ metrics: { waiting, running, kvUsage, ...(progress === undefined ? {} : { progress }) } });

  test('stalledMs counts from the last page that moved, or owed nothing', () => {
    const state = { progressAt: 0 };
    assert.equal(stalledMs(state, true, true, 1000), 0);
    assert.equal(stalledMs(state, false, true, 4000), 3000);
    assert.equal(stalledMs(state, true, true, 5000), 0, 'moved');
    assert.equal(stalledMs(state, false, false, 9000), 0, 'owes nothing');
    assert.equal(stalledMs(state, false, true, 9500), 500);
  });

  test('set aside once it runs requests with an unchanged page for stallTimeout; back when a page changes', () => {
    const { pool, events, ep } = poolOf(3, { ...POLICY, stallTimeout: 30_000 });
    const hung = ep(1);
    pool.recordScrape(hung, page(4, 500), 1000);
    pool.recordScrape(hung, page(4, 500), 30_999);
    assert.equal(pool.eligible(31_000), pool.endpoints, 'not yet: 29.999 s');
    pool.recordScrape(hung, page(4, 500), 31_000);
    assert.deepEqual(names(pool.eligible(31_000)), ['ep0', 'ep2']);
    const reason = '4 running, and its metrics page unchanged for 30s';
    assert.deepEqual(events, [['ep1', { kind: 'stalled', reason }]]);
    assert.equal(hung.isSetAside(31_000), true);
    assert.equal(hung.stalledFor, reason);
    // Further pages of the same stall say nothing new.
    pool.recordScrape(hung, page(4, 500), 60_000);
    assert.equal(events.length, 1);
    pool.recordScrape(hung, page(4, 501), 61_000);
    assert.equal(pool.eligible(61_000), pool.endpoints);
    assert.deepEqual(events[1], ['ep1', { kind: 'progressing' }]);
    assert.equal(hung.isSetAside(61_000), false);
  });

  test('a hung engine whose page froze idle is stalled once Sluice has requests on it whose answer has not begun', () => {
    const { pool, events, ep } = poolOf(2, { ...POLICY, stallTimeout: 1000 });
    const hung = ep(0);
    for (let t = 1; t < 5000; t += 500) pool.recordScrape(hung, page(0, 7, 0), t);
    assert.equal(events.length, 0, 'idle with an unchanged page: nothing owed');
    pool.acquire(hung);
    pool.promptSent(hung, 100);
    // (The last idle page was at 4501: the time owed counts from there, a scrape interval at most.)
    pool.recordScrape(hung, page(0, 7, 0), 4550);
    pool.recordScrape(hung, page(0, 7, 0), 5450);
    assert.equal(events.length, 0, 'the idle time before the request does not count');
    pool.recordScrape(hung, page(0, 7, 0), 5501);
    assert.deepEqual(events, [['ep0', { kind: 'stalled', reason: 'requests sent and not answered, and its metrics page unchanged for 1s' }]]);
    // Its answer begins (a slow client may drain it for long): nothing owed any more.
    pool.promptDone(hung, 100);
    pool.recordScrape(hung, page(0, 7, 0), 6500);
    assert.deepEqual(events[1], ['ep0', { kind: 'progressing' }]);
    pool.recordScrape(hung, page(0, 7, 0), 9000);
    assert.equal(events.length, 2, 'a stream a slow client drains is not work the engine owes');
  });

  test('any change of the page is progress: KV usage (a long prefill), running, waiting; a page without work counters is never stalled', () => {
    const { pool, events, ep } = poolOf(4, { ...POLICY, stallTimeout: 1000 });
    for (let t = 1; t < 10_000; t += 500) {
      pool.recordScrape(ep(0), page(8, t), t);
      pool.recordScrape(ep(1), page(1, 7, t / 1e5), t); // a prefill filling KV blocks, no token out yet
      pool.recordScrape(ep(2), page(8), t);
      pool.recordScrape(ep(3), page(2 + (t % 2), 7, 0.1, t % 3), t);
    }
    const off = poolOf(2, { ...POLICY, stallTimeout: 0 });
    for (let t = 1; t < 10_000; t += 500) off.pool.recordScrape(off.ep(0), page(8, 7), t);
    assert.deepEqual([events.length, off.events.length], [0, 0]);
  });

  test('an ejection that runs out while the endpoint is stalled: back from ejection, still set aside', () => {
    const { pool, events, ep } = poolOf(3, { ...POLICY, stallTimeout: 1000 });
    for (let k = 0; k < 3; k++) request(pool, ep(0), false, 10);
    pool.recordScrape(ep(0), page(2, 9), 20);
    pool.recordScrape(ep(0), page(2, 9), 1020);
    assert.deepEqual(names(pool.eligible(1030)), ['ep1', 'ep2']);
    assert.deepEqual(names(pool.eligible(1500)), ['ep1', 'ep2'], 'the ejection ended at 1010, the stall goes on');
    assert.deepEqual(events.map(([, e]) => e.kind), ['ejected', 'stalled', 'returned']);
    pool.recordScrape(ep(0), page(2, 10), 1600);
    assert.equal(pool.eligible(1600), pool.endpoints);
  });

  test('a reload with stallTimeout 0 ends every stall', () => {
    const { pool, events, ep } = poolOf(2, { ...POLICY, stallTimeout: 1000 });
    pool.recordScrape(ep(0), page(1, 5), 1);
    pool.recordScrape(ep(0), page(1, 5), 1001);
    assert.deepEqual(names(pool.eligible(1002)), ['ep1']);
    pool.setOutlierPolicy({ ...POLICY, stallTimeout: 0 }, 1003);
    assert.equal(pool.eligible(1003), pool.endpoints);
    assert.deepEqual(events.map(([, e]) => e.kind), ['stalled', 'progressing']);
  });
});

describe('Pool: what is in flight on a stalled or silent endpoint is given up on (rescueInFlight)', () => {
  const page = (running: number, progress: number) => ({ metrics: { waiting: 0, running, kvUsage: 0.1, progress } });

  /** An attempt on `ep` heard of last at `heardAt`; it leaves the endpoint when given up on, as the proxy's do. */
  function attempt(ep: Endpoint, heardAt: number, gaveUp: string[]): InFlightAttempt {
    const a: InFlightAttempt = { older: undefined, newer: undefined, heardAt, abandon: (why) => (gaveUp.push(`${heardAt}: ${why}`), ep.attempts.remove(a), true) };
    ep.attempts.push(a);
    return a;
  }

  /** Whether `a` is in `ep`'s list of attempts. */
  function listed(ep: Endpoint, a: InFlightAttempt): boolean {
    for (let x = ep.attempts.oldest; x !== undefined; x = x.newer) if (x === a) return true;
    return false;
  }

  test('stalled: those not heard of for stallTimeout, at each scrape; the stall holds until the page moves, or for one more stallTimeout', () => {
    const { pool, events, ep } = poolOf(2, { ...POLICY, stallTimeout: 1000 });
    const hung = ep(0);
    const gaveUp: string[] = [];
    /** A request with its prompt sent (work owed), released when given up on, as the proxy's are. */
    const sent = (heardAt: number) => {
      const probe = pool.acquire(hung);
      pool.promptSent(hung, 100);
      const a = attempt(hung, heardAt, gaveUp);
      a.abandon = (why: string) => {
        gaveUp.push(`${heardAt}: ${why}`);
        hung.attempts.remove(a);
        pool.promptDone(hung, 100);
        pool.release(hung, false, probe);
        return true;
      };
      return a;
    };
    // Its page froze idle: what it owes is what Sluice sent it.
    pool.recordScrape(hung, page(0, 7), 0);
    sent(0);
    const late = sent(600);
    pool.recordScrape(hung, page(0, 7), 1000);
    assert.deepEqual(events.map(([, e]) => e.kind), ['stalled']);
    assert.deepEqual(gaveUp, ['0: stalled (requests sent and not answered, and its metrics page unchanged for 1s)']);
    assert.equal(hung.attempts.size, 1, 'the one heard of 400 ms ago stays');
    late.heardAt = 900; // a chunk came
    pool.recordScrape(hung, page(0, 7), 1850);
    assert.equal(gaveUp.length, 1, 'heard of 950 ms ago');
    pool.recordScrape(hung, page(0, 7), 1900);
    assert.equal(gaveUp.length, 2);
    assert.deepEqual([hung.attempts.size, hung.inFlight, hung.inFlightTokens], [0, 0, 0]);
    // Sluice has nothing there now, and its page has not moved: still stalled for one more
    // stallTimeout after the last give-up (1900), so that the next requests do not wait as long again…
    pool.recordScrape(hung, page(0, 7), 2500);
    assert.deepEqual(names(pool.eligible(2500)), ['ep1']);
    pool.recordScrape(hung, page(0, 7), 2899);
    assert.deepEqual(names(pool.eligible(2899)), ['ep1']);
    // …not for good: an idle server that recovered shows the same page for ever (and gets no request to change it).
    pool.recordScrape(hung, page(0, 7), 2900);
    assert.equal(pool.eligible(2900), pool.endpoints);
    assert.deepEqual(events.map(([, e]) => e.kind), ['stalled', 'progressing']);
    // Given up on again: the hold again; a page that moves ends it at once.
    sent(2900);
    pool.recordScrape(hung, page(0, 7), 3900);
    assert.deepEqual(events.map(([, e]) => e.kind), ['stalled', 'progressing', 'stalled']);
    assert.equal(gaveUp.length, 3);
    pool.recordScrape(hung, page(0, 8), 4000);
    assert.equal(pool.eligible(4000), pool.endpoints);
    // A reload turning rescueInFlight off ends a hold.
    sent(4000);
    pool.recordScrape(hung, page(0, 8), 5000);
    assert.equal(gaveUp.length, 4);
    pool.setOutlierPolicy({ ...POLICY, stallTimeout: 1000, rescueInFlight: false }, 5001);
    pool.recordScrape(hung, page(0, 8), 5002);
    assert.equal(pool.eligible(5002), pool.endpoints);
  });

  test('silent: its scrapes get no answer at all for the silence window; those not heard of for as long', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)], { outlierPolicy: POLICY, silenceMs: 5000 });
    const [a, b] = pool.endpoints as [Endpoint, Endpoint];
    const gaveUp: string[] = [];
    pool.recordScrape(a, page(1, 1), 1000);
    attempt(a, 2000, gaveUp);
    // An HTTP error is an answer: the server is there (a wrong metrics path, a broken exporter).
    for (let t = 2000; t <= 20_000; t += 1000) pool.recordScrape(a, { error: 'HTTP 404 from /metrics', answered: true }, t);
    assert.deepEqual(gaveUp, []);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 21_000);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 25_999);
    assert.deepEqual(gaveUp, [], 'no answer for 4.999 s');
    // Sent there during the silence (a detector that reads no staleness).
    attempt(a, 24_000, gaveUp);
    pool.recordScrape(a, { error: 'connect ECONNREFUSED' }, 26_000);
    assert.deepEqual(gaveUp, ['2000: silent (no answer to its metrics scrapes for 5s)']);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 28_999);
    assert.equal(gaveUp.length, 1, 'heard of 4.999 s ago');
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 31_000);
    assert.deepEqual(gaveUp.at(-1), '24000: silent (no answer to its metrics scrapes for 10s)');
    // Any answer ends a silence; the next one counts from its own first unanswered scrape.
    const later = attempt(a, 31_000, gaveUp);
    pool.recordScrape(a, { error: 'HTTP 500 from /metrics', answered: true }, 31_500);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 33_000);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 37_999);
    assert.ok(listed(a, later));
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 38_000);
    assert.ok(!listed(a, later));
    // A server that answers its scrapes keeps what it holds, however long.
    const kept = attempt(b, 0, gaveUp);
    pool.recordScrape(b, page(1, 2), 100);
    pool.recordScrape(b, page(1, 3), 60_000);
    assert.ok(listed(b, kept));
  });

  test('an endpoint a reload took out while it was silent starts afresh when it is back: no silence carried over', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)], { outlierPolicy: POLICY, silenceMs: 5000 });
    const a = pool.endpoints[0]!;
    const gaveUp: string[] = [];
    pool.acquire(a); // in flight: a removed endpoint drains, and is taken back as it was
    attempt(a, 0, gaveUp);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 1000);
    pool.setEndpoints([spec('b', 2)]);
    pool.setEndpoints([spec('a', 1), spec('b', 2)]);
    assert.equal(pool.endpoints[0], a, 'the same endpoint, taken back from draining');
    // Not scraped while out: its silence counts from its first unanswered scrape since it is back.
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 6500);
    assert.deepEqual(gaveUp, []);
    pool.recordScrape(a, { error: 'timed out after 1000 ms' }, 11_500);
    assert.deepEqual(gaveUp, ['0: silent (no answer to its metrics scrapes for 5s)']);
  });

  test('rescueInFlight false: nothing is given up on (a reload applies it)', () => {
    const pool = new Pool([spec('a', 1)], { outlierPolicy: { ...POLICY, stallTimeout: 1000, rescueInFlight: false }, silenceMs: 5000 });
    const a = pool.endpoints[0]!;
    const gaveUp: string[] = [];
    attempt(a, 0, gaveUp);
    pool.recordScrape(a, page(1, 1), 0);
    pool.recordScrape(a, page(1, 1), 2000);
    pool.recordScrape(a, { error: 'timeout' }, 9000);
    assert.equal(a.stalledFor !== undefined, true);
    assert.deepEqual(gaveUp, []);
    pool.setOutlierPolicy({ ...POLICY, stallTimeout: 1000, rescueInFlight: true }, 9000);
    pool.recordScrape(a, { error: 'timeout' }, 10_000);
    assert.equal(gaveUp.length, 1);
  });
});
