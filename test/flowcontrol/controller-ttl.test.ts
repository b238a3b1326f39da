import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Harness } from './harness.js';
import { parseRequestTtlHeader } from '../../src/flowcontrol/request-ttl.js';
import { compareEdf } from '../../src/flowcontrol/policies/index.js';

const S = 100;
const N = 2000;

/** A gateway whose dispatch is blocked (saturation 1), so requests stay queued until they expire. */
function blocked(over: { S?: number; N?: number; poolEmpty?: boolean; start?: number } = {}): Harness {
  return new Harness({
    config: { defaultRequestTTL: over.S ?? S, noEndpointRequestTTL: over.N ?? N },
    saturation: 1,
    poolEmpty: over.poolEmpty ?? false,
    start: over.start ?? 0,
  });
}

describe('TTL regimes (reference §2.10, §6.5: S = 100 ms, N = 2 s)', () => {
  test('non-empty pool: kept at 99 ms, EvictedTTL at exactly 100 ms', () => {
    const h = blocked();
    h.submit('a');
    assert.deepEqual(h.timers.dueTimes(), [100], 'one timer, at the deadline');
    h.timers.advance(99);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advance(1);
    assert.deepEqual(h.outcomeOf('a'), { label: 'a', outcome: 'EvictedTTL', queuedMs: 100, cause: undefined, at: 100 });
    assert.equal(h.fc.queued, 0);
    assert.equal(h.timers.pendingTimers, 0);
  });

  test('empty pool: kept at 1.999 s, EvictedNoEndpoints at 2 s', () => {
    const h = blocked({ poolEmpty: true });
    h.submit('a');
    h.timers.advance(1999);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advance(1);
    assert.equal(h.outcomeOf('a')!.outcome, 'EvictedNoEndpoints');
    assert.equal(h.outcomeOf('a')!.at, 2000);
  });

  test('N = 0 with an empty pool never expires; neither does S = 0 with endpoints', () => {
    const empty = blocked({ N: 0, poolEmpty: true });
    empty.submit('a');
    assert.equal(empty.timers.pendingTimers, 0, 'no deadline → no timer');
    empty.timers.advance(3_600_000);
    assert.equal(empty.outcomeOf('a'), undefined);

    const full = blocked({ S: 0 });
    full.submit('a');
    assert.equal(full.timers.pendingTimers, 0);
    full.timers.advance(3_600_000);
    assert.equal(full.outcomeOf('a'), undefined);
    assert.equal(full.fc.queued, 1);
  });

  test('pool came up at +1 s: expires at exactly +1 s + 100 ms, not before', () => {
    const h = blocked({ poolEmpty: true });
    h.submit('a');
    h.timers.advance(1000);
    h.poolEmpty = false;
    h.fc.kick(); // the endpoint-set change
    h.timers.runImmediates();
    h.timers.advance(99);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advance(1);
    assert.deepEqual(h.outcomeOf('a'), { label: 'a', outcome: 'EvictedTTL', queuedMs: 1100, cause: undefined, at: 1100 });
  });

  test('a regime flip 100 ms before enqueue does not extend the budget', () => {
    const h = blocked({ poolEmpty: true, start: 0 });
    h.timers.advanceTo(400);
    h.submit('early'); // observes the empty pool
    h.timers.advanceTo(900);
    h.poolEmpty = false;
    h.fc.kick();
    h.timers.runImmediates(); // flip observed at 900: 'early' gets a fresh budget → 1000
    h.timers.advanceTo(1000); // the new request arrives 100 ms after the flip
    assert.equal(h.outcomeOf('early')!.at, 1000);
    h.submit('late');
    h.timers.advance(99);
    assert.equal(h.outcomeOf('late'), undefined);
    h.timers.advance(1);
    assert.equal(h.outcomeOf('late')!.outcome, 'EvictedTTL');
    assert.equal(h.outcomeOf('late')!.at, 1100);
  });

  test('every request expires at its own deadline via the single timer', () => {
    const h = blocked();
    h.submit('a');
    h.clock.advance(30);
    h.submit('b');
    h.clock.advance(30);
    h.submit('c', { fairnessId: 'other', priority: 5 });
    assert.equal(h.timers.pendingTimers, 1);
    h.timers.advance(500);
    assert.deepEqual(
      h.outcomes.map((o) => [o.label, o.outcome, o.at, o.queuedMs]),
      [
        ['a', 'EvictedTTL', 100, 100],
        ['b', 'EvictedTTL', 130, 100],
        ['c', 'EvictedTTL', 160, 100],
      ],
    );
  });

  test('when the earliest request leaves early the timer stays; it re-arms when it fires', () => {
    const h = blocked();
    const a = h.submit('a');
    h.clock.advance(50);
    h.submit('b');
    h.clock.advance(10);
    a.cancel();
    assert.deepEqual(h.timers.dueTimes(), [100], 'no clear/re-arm churn on every removal');
    h.timers.advanceTo(100);
    assert.deepEqual(h.labels('EvictedTTL'), []);
    assert.deepEqual(h.timers.dueTimes(), [150]);
    h.timers.advanceTo(150);
    assert.deepEqual(h.labels('EvictedTTL'), ['b']);
  });

  test('a flip to a shorter budget re-arms the timer earlier', () => {
    const h = blocked({ S: 5000, N: 100 });
    h.submit('a');
    assert.deepEqual(h.timers.dueTimes(), [5000]);
    h.timers.advance(1000);
    h.poolEmpty = true;
    h.fc.kick();
    h.timers.runImmediates();
    assert.deepEqual(h.timers.dueTimes(), [1100]);
    h.timers.advance(100);
    assert.deepEqual(h.outcomeOf('a'), { label: 'a', outcome: 'EvictedNoEndpoints', queuedMs: 1100, cause: undefined, at: 1100 });
  });

  test('S = 0, N = 100: no expiry with endpoints; 100 ms after the pool empties', () => {
    const h = blocked({ S: 0, N: 100 });
    h.submit('a');
    h.timers.advance(10_000);
    assert.equal(h.fc.queued, 1);
    h.poolEmpty = true;
    h.fc.kick();
    h.timers.runImmediates();
    h.timers.advance(100);
    assert.equal(h.outcomeOf('a')!.outcome, 'EvictedNoEndpoints');
    assert.equal(h.outcomeOf('a')!.at, 10_100);
  });

  test('the expiry timer observes the regime itself', () => {
    // The pool empties without anyone kicking; the S deadline's timer notices and starts the N budget.
    const h = blocked({ S: 100, N: 1000 });
    h.submit('a');
    h.poolEmpty = true;
    h.timers.advance(100);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advance(1000);
    assert.equal(h.outcomeOf('a')!.outcome, 'EvictedNoEndpoints');
    assert.equal(h.outcomeOf('a')!.at, 1100);
  });

  test('empty pool, S = 5 min, N = 100 ms → EvictedNoEndpoints', () => {
    const h = blocked({ S: 300_000, N: 100, poolEmpty: true });
    h.submit('a');
    h.timers.advance(100);
    assert.equal(h.outcomeOf('a')!.outcome, 'EvictedNoEndpoints');
  });

  test('empty pool, S = 100 ms, N = 600 ms: not shed at 300 ms, shed later as EvictedNoEndpoints', () => {
    const h = blocked({ S: 100, N: 600, poolEmpty: true });
    h.submit('a');
    h.timers.advance(300);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advance(300);
    assert.equal(h.outcomeOf('a')!.outcome, 'EvictedNoEndpoints');
  });

  test('empty pool, S = 150 ms, N = 5 s: queued at 600 ms; an endpoint appears → dispatched on a fresh budget', () => {
    const h = blocked({ S: 150, N: 5000, poolEmpty: true });
    h.submit('a');
    h.timers.advance(600);
    assert.equal(h.fc.queued, 1);
    h.poolEmpty = false;
    h.unblock(0);
    assert.deepEqual(h.outcomeOf('a'), { label: 'a', outcome: 'Dispatched', queuedMs: 600, cause: undefined, at: 600 });
  });

  test('a pool that keeps flipping between empty and not cannot hold a request past max(S, N) + 2 s', () => {
    const h = blocked({ S: 1000, N: 1000 });
    h.submit('a');
    // Each flip, noticed by the expiry timer just before the budget runs out, starts a fresh one.
    for (let t = 900; t < 2900; t += 1000) {
      h.timers.advanceTo(t);
      h.poolEmpty = !h.poolEmpty;
      h.timers.advanceTo(t + 100);
      assert.equal(h.outcomeOf('a'), undefined, `still queued at ${t + 100}`);
    }
    h.poolEmpty = !h.poolEmpty;
    h.timers.advanceTo(3000);
    assert.deepEqual([h.outcomeOf('a')?.outcome, h.outcomeOf('a')?.at], ['EvictedNoEndpoints', 3000], 'the regime it ends in names it');
    // With one budget 0 (wait while saturated) there is no backstop.
    const patient = blocked({ S: 0, N: 1000 });
    patient.submit('b');
    patient.timers.advanceTo(60_000);
    assert.equal(patient.outcomeOf('b'), undefined);
  });

  test('a huge TTL is armed within setTimeout range and still expires on time', () => {
    const month = 30 * 24 * 3600 * 1000;
    const h = blocked({ S: month });
    h.submit('a');
    const [due] = h.timers.dueTimes();
    assert.ok(due! <= 2_147_483_647);
    h.timers.advance(2_147_483_647);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advanceTo(month - 1);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advanceTo(month);
    assert.equal(h.outcomeOf('a')!.outcome, 'EvictedTTL');
  });
});

describe('cancellation', () => {
  test('cancel removes at once with EvictedContextCancelled and the request never dispatches', () => {
    const h = blocked();
    h.submit('a');
    h.clock.advance(40);
    const b = h.submit('b');
    h.submit('c');
    h.clock.advance(2);
    b.cancel();
    assert.deepEqual(h.outcomeOf('b'), { label: 'b', outcome: 'EvictedContextCancelled', queuedMs: 2, cause: undefined, at: 42 });
    assert.equal(h.fc.queued, 2);
    assert.equal(h.fc.queuedBytes, 200);
    b.cancel();
    h.unblock();
    assert.deepEqual(h.labels(), ['a', 'c'], 'FCFS order of the rest is intact');
    assert.equal(h.outcomes.length, 3);
  });

  test('cancel after the outcome is a no-op', () => {
    const h = new Harness({ saturation: 0 });
    const t = h.submit('a');
    t.cancel();
    assert.deepEqual(h.outcomes.map((o) => o.outcome), ['Dispatched']);
    const e = blocked();
    const u = e.submit('x');
    e.timers.advance(100);
    u.cancel();
    assert.deepEqual(e.outcomes.map((o) => o.outcome), ['EvictedTTL']);
  });

  test('cancelling the last queued request releases the timers', () => {
    const h = new Harness({
      config: { defaultRequestTTL: 100 },
      saturation: 1,
      nextSaturationChangeAt: (hh) => hh.clock.now() + 50,
    });
    const t = h.submit('a');
    assert.equal(h.timers.pendingTimers, 2);
    t.cancel();
    assert.equal(h.timers.pendingTimers, 0);
  });
});

describe('shutdown', () => {
  test('every queued request is answered EvictedOther (shutting-down), timers cleared, later enqueues rejected', () => {
    const h = new Harness({
      config: { defaultRequestTTL: 100, priorityBands: [] },
      saturation: 1,
      nextSaturationChangeAt: (hh) => hh.clock.now() + 50,
    });
    h.submit('a', { priority: 0 });
    h.clock.advance(10);
    h.submit('b', { priority: 3, fairnessId: 'x' });
    h.submit('c', { priority: -2, fairnessId: 'y' });
    h.fc.kick();
    h.fc.shutdown();
    assert.deepEqual(
      h.outcomes.map((o) => [o.label, o.outcome, o.cause, o.queuedMs]),
      [
        ['a', 'EvictedOther', 'shutting-down', 10],
        ['b', 'EvictedOther', 'shutting-down', 0],
        ['c', 'EvictedOther', 'shutting-down', 0],
      ],
    );
    assert.equal(h.fc.queued, 0);
    assert.equal(h.fc.queuedBytes, 0);
    assert.equal(h.timers.pendingTimers, 0);
    h.timers.runImmediates(); // the kick's immediate finds a stopped controller
    h.saturation = 0;
    h.submit('late');
    assert.deepEqual(h.outcomeOf('late'), { label: 'late', outcome: 'RejectedOther', queuedMs: 0, cause: 'shutting-down', at: 10 });
    assert.equal(h.fc.runDispatch(), 0);
    h.timers.advance(10_000);
    assert.equal(h.outcomes.length, 4);
    assert.equal(h.fc.snapshot().shuttingDown, true);
    h.fc.shutdown(); // idempotent
    assert.equal(h.outcomes.length, 4);
  });

  test('an enqueue from a shutdown callback is rejected', () => {
    const h = blocked();
    h.submit('a', { then: () => void h.submit('retry') });
    h.fc.shutdown();
    assert.deepEqual(
      h.outcomes.map((o) => [o.label, o.outcome]),
      [
        ['a', 'EvictedOther'],
        ['retry', 'RejectedOther'],
      ],
    );
  });
});

test('defaultRequestTTL 0 (wait for ever): a pool that comes back does not evict what queued while it was empty', () => {
  const h = new Harness({ saturation: 1, poolEmpty: true, config: { defaultRequestTTL: 0, noEndpointRequestTTL: 1000 } });
  h.submit('a');
  h.timers.advance(100);
  h.poolEmpty = false; // endpoints are back, still saturated: the request's deadline is re-keyed to no deadline
  h.fc.kick();
  h.timers.advance(5000);
  assert.equal(h.outcomeOf('a'), undefined);
  assert.equal(h.fc.queued, 1);
});

describe("a client's own TTL (x-llm-d-inference-ttl, llm-d's admission)", () => {
  test('the header parses as a Go duration; missing, malformed, zero or negative leaves the configured TTL', () => {
    const cases: [string | undefined, number | undefined][] = [
      ['1500ms', 1500],
      ['2s', 2000],
      ['1m30s', 90_000],
      [' 250ms ', 250],
      ['.5s', 500],
      ['1.5h', 5_400_000],
      ['100', undefined], // a bare number: Go refuses it too (no unit)
      ['0s', undefined],
      ['0', undefined],
      ['-1s', undefined],
      ['soon', undefined],
      ['', undefined],
      [undefined, undefined],
    ];
    assert.deepEqual(
      cases.map(([v]) => parseRequestTtlHeader(v)),
      cases.map(([, ms]) => ms),
    );
  });

  test('it shortens a finite defaultRequestTTL and never extends it', () => {
    const h = blocked(); // S = 100 ms
    h.submit('short', { requestTtlMs: 30 });
    h.submit('long', { requestTtlMs: 5000 });
    h.submit('plain');
    h.timers.advance(29);
    assert.equal(h.outcomeOf('short'), undefined);
    h.timers.advance(1);
    assert.deepEqual(h.outcomeOf('short'), { label: 'short', outcome: 'EvictedTTL', queuedMs: 30, cause: undefined, at: 30 });
    h.timers.advance(70);
    assert.deepEqual(
      ['long', 'plain'].map((l) => [h.outcomeOf(l)?.outcome, h.outcomeOf(l)?.at]),
      [
        ['EvictedTTL', 100],
        ['EvictedTTL', 100],
      ],
    );
  });

  test('with defaultRequestTTL 0 (wait for ever) it sets one; without it the request waits', () => {
    const h = blocked({ S: 0 });
    h.submit('own', { requestTtlMs: 250 });
    h.submit('plain');
    h.timers.advance(250);
    assert.equal(h.outcomeOf('own')?.outcome, 'EvictedTTL');
    h.timers.advance(3_600_000);
    assert.equal(h.outcomeOf('plain'), undefined);
    assert.equal(h.fc.queued, 1);
  });

  test('an empty pool waits noEndpointRequestTTL, not the header; endpoints back: the header counts from then', () => {
    const h = blocked({ poolEmpty: true }); // N = 2 s
    h.submit('a', { requestTtlMs: 30 });
    h.timers.advance(1000);
    assert.equal(h.outcomeOf('a'), undefined, 'the scale-from-zero wait is the operator’s');
    h.poolEmpty = false;
    h.fc.kick();
    h.timers.runImmediates();
    h.timers.advance(29);
    assert.equal(h.outcomeOf('a'), undefined);
    h.timers.advance(1);
    assert.deepEqual([h.outcomeOf('a')?.outcome, h.outcomeOf('a')?.at], ['EvictedTTL', 1030]);
  });

  test("it is the ordering policies' TTL deadline (edf-ordering-policy serves the nearest first)", () => {
    const h = new Harness({ saturation: 1, config: { defaultRequestTTL: 10_000 }, ordering: { type: 'edf-ordering-policy', name: 'edf', compare: compareEdf } });
    h.submit('plain');
    h.submit('hurried', { requestTtlMs: 2000 });
    h.saturation = 0;
    h.fc.runDispatch();
    assert.deepEqual(h.labels('Dispatched').slice(0, 2), ['hurried', 'plain']);
  });
});
