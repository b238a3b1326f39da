import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { FlowController, provisionBands } from '../../src/flowcontrol/controller.js';
import type { BandView, FlowView, UsageLimitPolicy } from '../../src/flowcontrol/policies/types.js';
import {
  Harness,
  band,
  ceilingsByPriority,
  defaultBandTemplate,
  fcfsOrdering,
  makeConfig,
  oldestHeadFairness,
  roundRobinFairness,
  sloOrdering,
  staticCeiling,
} from './harness.js';
import { ManualClock } from '../../src/util/clock.js';
import { SoftReflectiveCeilingPolicy } from '../../src/flowcontrol/policies/soft-reflective-ceiling-policy.js';

describe('dispatch gating (reference §2.6, §6.4)', () => {
  test('an unsaturated gateway dispatches synchronously inside enqueue, with zero queue time', () => {
    const h = new Harness({ saturation: 0.2 });
    h.submit('a');
    assert.deepEqual(h.labels(), ['a']);
    assert.equal(h.outcomeOf('a')!.queuedMs, 0);
    assert.equal(h.fc.queued, 0);
    assert.equal(h.fc.queuedBytes, 0);
    assert.equal(h.timers.pendingTimers, 0, 'nothing queued → no timer armed');
  });

  test('saturation at the ceiling stops dispatch; below it dispatches', () => {
    const h = new Harness({ saturation: 1.0 });
    h.submit('a');
    h.submit('b');
    assert.deepEqual(h.labels(), []);
    assert.equal(h.fc.queued, 2);
    h.unblock(0.999);
    assert.deepEqual(h.labels(), ['a', 'b']);
    assert.equal(h.fc.queued, 0);
  });

  test('threshold 0.5 with saturation exactly 0.5 does not dispatch (≥)', () => {
    const h = new Harness({ saturation: 0.5, usageLimit: staticCeiling(0.5) });
    h.submit('a');
    assert.deepEqual(h.labels(), []);
    h.unblock(0.4999);
    assert.deepEqual(h.labels(), ['a']);
  });

  test('a set point reached exactly stops the band whatever the rounding of either side', () => {
    // 4 of 6 in flight against priority-holdback's ceiling 1 − 2 × 0.5/3 for the third of four bands.
    const h = new Harness({ saturation: 4 / 6, usageLimit: staticCeiling(1 - (2 * (1 - 0.5)) / 3) });
    assert.ok(4 / 6 < 1 - (2 * (1 - 0.5)) / 3, 'the two sides differ in their last bit');
    h.submit('a');
    assert.deepEqual(h.labels(), []);
    h.unblock(3 / 6);
    assert.deepEqual(h.labels(), ['a']);
  });

  test('/debug/flowcontrol reads whether the pool is empty now, not at the last dispatch cycle (none run while idle)', () => {
    const h = new Harness({ saturation: 0.2, poolEmpty: true, start: 5000 });
    assert.equal(h.fc.snapshot().poolEmpty, true, 'an empty pool from the start, before any request');
    h.poolEmpty = false;
    h.clock.advance(10);
    assert.deepEqual([h.fc.snapshot().poolEmpty, h.fc.snapshot().poolEmptyChangedAt], [false, 5010]);
  });

  test('saturation above 1 is reported unclamped and passed to the policy as is', () => {
    const seen: number[] = [];
    const policy: UsageLimitPolicy = {
      type: 't',
      name: 't',
      computeCeilings: (s) => void seen.push(s),
    };
    const h = new Harness({ saturation: 2.5, usageLimit: policy });
    h.submit('a');
    assert.deepEqual(seen, [2.5]);
    assert.equal(h.fc.snapshot().saturation, 2.5);
  });

  test('NaN saturation fails closed', () => {
    const h = new Harness({ saturation: NaN });
    h.submit('a');
    assert.deepEqual(h.labels(), []);
  });

  test('head-of-line blocking: the cycle stops at a gated higher band even when it is empty', () => {
    // A (deliberately non-monotone) policy gates band 10 at 0.5 and leaves band 0 at 1.0.
    const h = new Harness({
      config: { priorityBands: [band(10)] },
      usageLimit: ceilingsByPriority({ 10: 0.5 }),
      saturation: 0.7,
    });
    h.submit('low', { priority: 0 });
    assert.deepEqual(h.labels(), [], 'band 0 may not pass empty band 10 whose ceiling is below s');
    h.submit('high', { priority: 10 });
    assert.deepEqual(h.labels(), []);
    h.unblock(0.49);
    assert.deepEqual(h.labels(), ['high', 'low']);
  });

  test('a lower band never passes a waiting higher band whose ceiling is reached', () => {
    // Holdback-like ceilings: band 10 at 1.0, band 0 at 0.5.
    const h = new Harness({
      config: { priorityBands: [band(10)] },
      usageLimit: ceilingsByPriority({ 10: 1.0, 0: 0.5 }),
      saturation: 1.0,
    });
    h.submit('low1', { priority: 0 });
    h.submit('high1', { priority: 10 });
    h.submit('high2', { priority: 10 });
    h.unblock(0.7); // band 10 opens, band 0 stays closed
    assert.deepEqual(h.labels(), ['high1', 'high2']);
    h.submit('high3', { priority: 10 });
    assert.deepEqual(h.labels(), ['high1', 'high2', 'high3']);
    assert.equal(h.fc.queued, 1);
    h.unblock(0.4);
    assert.deepEqual(h.labels(), ['high1', 'high2', 'high3', 'low1']);
  });

  test('strict priority order when unsaturated, FCFS within each band', () => {
    const h = new Harness({
      config: { priorityBands: [band(10), band(5), band(-1)] },
      saturation: 1,
    });
    const plan: [string, number][] = [
      ['m1', -1], ['z1', 0], ['f1', 5], ['t1', 10], ['z2', 0], ['m2', -1], ['t2', 10], ['f2', 5], ['t3', 10],
    ];
    for (const [label, priority] of plan) {
      h.submit(label, { priority, fairnessId: `flow-${label}` });
      h.clock.advance(1);
    }
    h.unblock(0);
    assert.deepEqual(h.labels(), ['t1', 't2', 't3', 'f1', 'f2', 'z1', 'z2', 'm1', 'm2']);
  });

  test('priority 10 queued after priority 0 dispatches first when unblocked', () => {
    const h = new Harness({ config: { priorityBands: [band(10)] }, saturation: 1 });
    h.submit('p0', { priority: 0 });
    h.clock.advance(5);
    h.submit('p10', { priority: 10 });
    h.unblock();
    assert.deepEqual(h.labels(), ['p10', 'p0']);
  });

  test('FCFS within a flow, also for requests enqueued in the same millisecond', () => {
    const h = new Harness({ saturation: 1 });
    for (let i = 0; i < 50; i++) {
      h.submit(`r${i}`);
      if (i % 7 === 0) h.clock.advance(1);
    }
    h.unblock();
    assert.deepEqual(
      h.labels(),
      Array.from({ length: 50 }, (_, i) => `r${i}`),
    );
  });

  test('saturation is re-sampled every cycle: only K dispatch before it reaches the ceiling', () => {
    let inFlight = 0;
    let open = false;
    const h = new Harness({ saturation: () => (open ? inFlight / 5 : 1) });
    for (let i = 0; i < 20; i++) h.submit(`r${i}`, { then: (o) => void (o === 'Dispatched' && inFlight++) });
    assert.equal(inFlight, 0);
    open = true;
    h.saturationSamples = 0;
    assert.equal(h.fc.runDispatch(), 5);
    assert.equal(inFlight as number, 5);
    assert.equal(h.saturationSamples, 6, 'five dispatching cycles and one that stopped');
    assert.equal(h.fc.queued, 15);
    // Two requests complete → two more go.
    inFlight -= 2;
    assert.equal(h.fc.runDispatch(), 2);
    assert.deepEqual(h.labels(), ['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6']);
  });

  test('ceilings are computed once per cycle with priorities highest first and a buffer pre-filled with 1.0', () => {
    const calls: { priorities: number[]; prefilled: number[] }[] = [];
    const policy: UsageLimitPolicy = {
      type: 't',
      name: 't',
      computeCeilings(_s, priorities, out) {
        calls.push({ priorities: [...priorities], prefilled: [...out] });
        out.fill(0.9); // must not leak into the next cycle's pre-fill
      },
    };
    const h = new Harness({
      config: { priorityBands: [band(-3), band(7)] },
      objectivePriorities: [2],
      usageLimit: policy,
      saturation: 0,
    });
    h.submit('a', { priority: 7 });
    h.submit('b', { priority: -3 });
    assert.equal(calls.length, 2, 'one cycle per dispatch; the queue was empty afterwards');
    for (const call of calls) {
      assert.deepEqual(call.priorities, [7, 2, 0, -3]);
      assert.deepEqual(call.prefilled, [1, 1, 1, 1]);
    }
    assert.deepEqual(
      h.fc.snapshot().ceilings,
      [7, 2, 0, -3].map((priority) => ({ priority, ceiling: 0.9 })),
    );
  });

  test('round robin over 3 flows × 3 requests: every chunk of 3 dispatches covers all flows', () => {
    const h = new Harness({ fairness: roundRobinFairness, saturation: 1 });
    for (const flow of ['a', 'b', 'c']) {
      for (let i = 0; i < 3; i++) h.submit(`${flow}${i}`, { fairnessId: flow });
    }
    h.unblock();
    const flows = h.labels().map((l) => l[0]);
    assert.equal(flows.length, 9);
    for (let chunk = 0; chunk < 3; chunk++) {
      assert.deepEqual(flows.slice(chunk * 3, chunk * 3 + 3).sort(), ['a', 'b', 'c']);
    }
  });

  test('SLO-deadline ordering dispatches tight before mid before loose', () => {
    const h = new Harness({ ordering: sloOrdering, saturation: 1 });
    h.submit('loose', { sloTtftMs: 5000 });
    h.submit('none');
    h.submit('mid', { sloTtftMs: 1000 });
    h.submit('tight', { sloTtftMs: 100 });
    h.unblock();
    assert.deepEqual(h.labels(), ['tight', 'mid', 'loose', 'none']);
  });

  test('ordering views carry enqueuedAt, receivedAt, ttlDeadline, sloDeadline, byteSize', () => {
    const views: unknown[] = [];
    const h = new Harness({
      config: { defaultRequestTTL: 300 },
      saturation: 1,
      ordering: {
        type: 'spy',
        name: 'spy',
        compare(a, b) {
          views.push(a, b);
          return a.enqueuedAt - b.enqueuedAt;
        },
      },
    });
    h.clock.set(1000);
    h.submit('a', { receivedAt: 990, sloTtftMs: 50, byteSize: 7 });
    h.submit('b', { receivedAt: 995, byteSize: 8 });
    const view = views.find((v) => (v as { byteSize: number }).byteSize === 7) as Record<string, number>;
    assert.equal(view.enqueuedAt, 1000);
    assert.equal(view.receivedAt, 990);
    assert.equal(view.ttlDeadline, 1300);
    assert.equal(view.sloDeadline, 1040);
    const other = views.find((v) => (v as { byteSize: number }).byteSize === 8) as Record<string, number>;
    assert.equal(other.sloDeadline, Infinity);
  });

  test('ttlDeadline is Infinity when the TTL is 0', () => {
    let seen: number | undefined;
    const h = new Harness({
      config: { defaultRequestTTL: 0 },
      saturation: 1,
      ordering: { type: 's', name: 's', compare: (a, b) => ((seen = a.ttlDeadline), a.enqueuedAt - b.enqueuedAt) },
    });
    h.submit('a');
    h.submit('b');
    assert.equal(seen, Infinity);
  });

  /** Band 10 with `selector` as its fairness policy's, over a band 0 of the usual one; a request queued in each, unsaturated. */
  function highBandWith(select: () => unknown) {
    const policy = { type: 'odd', name: 'odd', newBandSelector: () => ({ select }) };
    const fc = new FlowController({
      config: makeConfig({ priorityBands: [band(10, { fairnessPolicyRef: 'odd' })] }),
      objectivePriorities: [],
      fairness: (name) => (name === 'odd' ? (policy as never) : oldestHeadFairness),
      ordering: () => fcfsOrdering,
      usageLimit: staticCeiling(1),
      clock: new ManualClock(0),
      timers: { setTimeout: () => 0, clearTimeout: () => {}, setImmediate: () => 0 },
      saturation: () => 0,
      poolEmpty: () => false,
    });
    const got: string[] = [];
    fc.enqueue({ fairnessId: 'x', priority: 10, byteSize: 1, receivedAt: 0, onOutcome: (o) => got.push(`high:${o}`) });
    fc.enqueue({ fairnessId: 'x', priority: 0, byteSize: 1, receivedAt: 0, onOutcome: (o) => got.push(`low:${o}`) });
    return { fc, got };
  }

  test('a throwing selector is counted and the next band is tried (work-conserving)', () => {
    const { fc, got } = highBandWith(() => {
      throw new Error('boom');
    });
    assert.deepEqual(got, ['low:Dispatched']);
    assert.ok(fc.policyErrors >= 1);
    assert.equal(fc.queued, 1);
  });

  test("a selector choosing no flow (or one not its band's) skips its band, and the next band is served", () => {
    assert.deepEqual(highBandWith(() => undefined).got, ['low:Dispatched']);
    assert.deepEqual(highBandWith(() => ({})).got, ['low:Dispatched']);
  });

  test('a clock that steps back while a request waits: its queue time is 0, never negative', () => {
    const h = new Harness({ saturation: 1.0 });
    h.clock.set(10_000);
    h.submit('a');
    h.clock.set(9_990);
    h.unblock(0.5);
    assert.equal(h.outcomeOf('a')!.queuedMs, 0);
  });
});

describe('bands', () => {
  test('provisioning: configured bands, band 0 and one per objective priority from the templates', () => {
    const negative = { ...defaultBandTemplate, maxRequests: 17, orderingPolicyRef: 'neg-ordering' };
    const config = makeConfig({
      priorityBands: [band(10, { maxRequests: 99 }), band(-5, { maxBytes: 1234 })],
      defaultNegativePriorityBand: negative,
    });
    const bands = provisionBands(config, [3, -2, 10, 0, 3]);
    assert.deepEqual(
      bands.map((b) => [b.priority, b.maxRequests, b.maxBytes, b.orderingPolicyRef]),
      [
        [10, 99, 1_000_000_000, 'fcfs-ordering-policy'],
        [3, 5000, 1_000_000_000, 'fcfs-ordering-policy'],
        [0, 5000, 1_000_000_000, 'fcfs-ordering-policy'],
        [-2, 17, 1_000_000_000, 'neg-ordering'],
        [-5, 5000, 1234, 'fcfs-ordering-policy'],
      ],
    );
    // Without a negative template, negative objectives use the default template.
    const plain = provisionBands(makeConfig(), [-2]);
    assert.deepEqual(
      plain.map((b) => [b.priority, b.maxRequests]),
      [
        [0, 5000],
        [-2, 5000],
      ],
    );
  });

  test('the controller resolves every band policy by ref and shows them in the snapshot', () => {
    const h = new Harness({
      config: { priorityBands: [band(4, { fairnessPolicyRef: 'round-robin-fairness-policy' })] },
      objectivePriorities: [-1],
    });
    assert.deepEqual(h.fairnessRequests, ['round-robin-fairness-policy', 'global-strict-fairness-policy', 'global-strict-fairness-policy']);
    assert.equal(h.orderingRequests.length, 3);
    assert.deepEqual(
      h.fc.snapshot().bands.map((b) => [b.priority, b.fairnessPolicy, b.orderingPolicy]),
      [
        [4, 'round-robin-fairness-policy', 'fcfs-ordering-policy'],
        [0, 'global-strict-fairness-policy', 'fcfs-ordering-policy'],
        [-1, 'global-strict-fairness-policy', 'fcfs-ordering-policy'],
      ],
    );
  });

  test('each band gets its own selector (per-band state stays separate)', () => {
    let created = 0;
    const h = new Harness({
      config: { priorityBands: [band(1), band(2)] },
      fairness: { ...roundRobinFairness, newBandSelector: () => (created++, roundRobinFairness.newBandSelector()) },
    });
    assert.ok(h.fc);
    assert.equal(created, 3);
  });

  test('an unknown priority is served by band 0 and keeps its own priority', () => {
    const h = new Harness({ config: { priorityBands: [band(5), band(-1)] }, saturation: 1 });
    h.submit('p7', { priority: 7, fairnessId: 'u', byteSize: 10 });
    h.clock.advance(1);
    h.submit('p5', { priority: 5 });
    h.submit('pm1', { priority: -1 });
    h.submit('pm3', { priority: -3 });
    const snap = h.fc.snapshot();
    assert.deepEqual(
      snap.bands.map((b) => [b.priority, b.requests]),
      [
        [5, 1],
        [0, 2],
        [-1, 1],
      ],
    );
    assert.deepEqual(
      h.fc.metricsSnapshot().flows.filter((f) => f.fairnessId === 'u'),
      [{ fairnessId: 'u', priority: 0, requests: 1, bytes: 10 }],
    );
    h.unblock();
    // Band 0 sits below band 5 and above band -1: 7 is demoted, -3 promoted.
    assert.deepEqual(h.labels(), ['p5', 'p7', 'pm3', 'pm1']);
  });
});

describe('kick and timers', () => {
  test('kick is a no-op with nothing queued', () => {
    const h = new Harness();
    h.fc.kick();
    assert.equal(h.timers.pendingImmediates, 0);
  });

  test('many kicks coalesce into one setImmediate dispatch run', () => {
    let runs = 0;
    const h = new Harness({ saturation: 1, onDispatchCycle: () => void runs++ });
    h.submit('a');
    h.submit('b');
    runs = 0;
    const before = h.timers.setImmediateCalls;
    h.saturation = 0;
    for (let i = 0; i < 10; i++) h.fc.kick();
    assert.equal(h.timers.setImmediateCalls - before, 1);
    assert.deepEqual(h.labels(), [], 'nothing happens until the immediate runs');
    h.timers.runImmediates();
    assert.equal(runs, 1);
    assert.deepEqual(h.labels(), ['a', 'b']);
    // A later kick schedules again (when something is queued).
    h.saturation = 1;
    h.submit('c');
    h.fc.kick();
    assert.equal(h.timers.setImmediateCalls - before, 2);
  });

  test('onDispatchCycle reports each run in seconds', () => {
    const seconds: number[] = [];
    const h = new Harness({ saturation: 0, onDispatchCycle: (s) => void seconds.push(s) });
    h.submit('a');
    h.submit('b');
    assert.equal(seconds.length, 2);
    for (const s of seconds) assert.ok(s >= 0 && s < 1);
  });

  test('nextSaturationChangeAt arms a timer that runs dispatch then, while anything is queued', () => {
    // Saturation is 1 until t = 250 (e.g. a stale endpoint leaving), then 0.
    const h = new Harness({
      saturation: (hh) => (hh.clock.now() < 250 ? 1 : 0),
      nextSaturationChangeAt: (hh) => (hh.clock.now() < 250 ? 250 : undefined),
      config: { defaultRequestTTL: 0, noEndpointRequestTTL: 0 },
    });
    h.submit('a');
    assert.deepEqual(h.timers.dueTimes(), [250]);
    h.timers.advance(249);
    assert.deepEqual(h.labels(), []);
    h.timers.advance(1);
    assert.deepEqual(h.labels(), ['a']);
    assert.equal(h.outcomeOf('a')!.queuedMs, 250);
    assert.equal(h.timers.pendingTimers, 0, 'nothing queued → no timer');
  });

  test('no saturation timer when nothing is queued or no change is expected', () => {
    let asked = 0;
    const h = new Harness({
      saturation: 0,
      nextSaturationChangeAt: () => (asked++, undefined),
      config: { defaultRequestTTL: 0, noEndpointRequestTTL: 0 },
    });
    h.submit('a');
    assert.equal(asked, 0, 'dispatched at once: not even asked');
    h.saturation = 1;
    h.submit('b');
    assert.equal(asked, 1);
    assert.equal(h.timers.pendingTimers, 0);
  });

  test('a change time already past retries after 1 ms rather than spinning', () => {
    const h = new Harness({
      saturation: 1,
      nextSaturationChangeAt: (hh) => hh.clock.now() - 5,
      config: { defaultRequestTTL: 0, noEndpointRequestTTL: 0 },
    });
    h.submit('a');
    assert.deepEqual(h.timers.dueTimes(), [1]);
  });
});

describe('re-entrancy and callback failures', () => {
  test('an enqueue from inside onOutcome joins the running loop (no nested run)', () => {
    let runs = 0;
    const h = new Harness({ saturation: 0, onDispatchCycle: () => void runs++ });
    h.submit('outer', { then: () => void h.submit('inner') });
    assert.deepEqual(h.labels(), ['outer', 'inner']);
    assert.equal(runs, 1);
    assert.equal(h.fc.queued, 0);
  });

  test('a throwing onOutcome is counted and the controller carries on', () => {
    const h = new Harness({ saturation: 1 });
    h.submit('a', {
      then: () => {
        throw new Error('caller bug');
      },
    });
    h.submit('b');
    h.unblock();
    assert.deepEqual(h.labels(), ['a', 'b']);
    assert.equal(h.fc.callbackErrors, 1);
    assert.equal(h.fc.queued, 0);
  });

  test('cancelling another queued request from inside onOutcome', () => {
    const h = new Harness({ saturation: 1 });
    let victim: { cancel(): void } | undefined;
    h.submit('a', { then: () => victim?.cancel() });
    victim = h.submit('b');
    h.submit('c');
    h.unblock();
    assert.deepEqual(h.labels(), ['a', 'c']);
    assert.deepEqual(h.labels('EvictedContextCancelled'), ['b']);
  });

  test('shutdown from inside onOutcome stops the running loop and answers the rest', () => {
    const h = new Harness({ saturation: 1 });
    h.submit('a', { then: () => h.fc.shutdown() });
    h.submit('b');
    h.submit('c');
    h.unblock();
    assert.deepEqual(h.labels(), ['a']);
    assert.deepEqual(h.labels('EvictedOther'), ['b', 'c']);
    assert.equal(h.fc.queued, 0);
  });

  test('a throwing saturation function fails closed and is counted', () => {
    const h = new Harness({
      saturation: () => {
        throw new Error('detector bug');
      },
    });
    h.submit('a');
    assert.deepEqual(h.labels(), []);
    assert.equal(h.fc.queued, 1);
    assert.ok(h.fc.policyErrors >= 1);
  });
});

describe('snapshots', () => {
  test('snapshot and metricsSnapshot describe bands, flows, totals and limits', () => {
    const h = new Harness({
      config: {
        priorityBands: [band(10, { maxRequests: 4, maxBytes: 1000 })],
        maxRequests: 100,
        maxBytes: 0,
        defaultRequestTTL: 30_000,
        noEndpointRequestTTL: 5_000,
      },
      saturation: 1.25,
      start: 1000,
    });
    h.submit('b1', { fairnessId: 'beta', byteSize: 100 });
    h.clock.advance(10);
    h.submit('a1', { fairnessId: 'alpha', byteSize: 50 });
    h.submit('h1', { fairnessId: 'hi', priority: 10, byteSize: 250 });
    h.clock.advance(40);
    h.submit('b2', { fairnessId: 'beta', byteSize: 30 });
    h.clock.advance(5);

    const snap = h.fc.snapshot();
    assert.equal(snap.saturation, 1.25);
    assert.equal(snap.saturationSampledAt, 1050, 'the cycle of the last arrival');
    assert.equal(snap.poolEmpty, false);
    assert.equal(snap.poolEmptyChangedAt, 1000);
    assert.deepEqual(snap.ceilings, [
      { priority: 10, ceiling: 1 },
      { priority: 0, ceiling: 1 },
    ]);
    assert.deepEqual(snap.totals, { requests: 4, bytes: 430 });
    assert.deepEqual(snap.limits, { maxRequests: 100, maxBytes: 0, defaultRequestTTLMs: 30_000, noEndpointRequestTTLMs: 5_000 });
    assert.equal(snap.shuttingDown, false);
    assert.deepEqual(snap.bands, [
      {
        priority: 10,
        maxRequests: 4,
        maxBytes: 1000,
        fairnessPolicy: 'global-strict-fairness-policy',
        orderingPolicy: 'fcfs-ordering-policy',
        requests: 1,
        bytes: 250,
        flows: [{ fairnessId: 'hi', requests: 1, bytes: 250, oldestWaitMs: 45 }],
      },
      {
        priority: 0,
        maxRequests: 5000,
        maxBytes: 1_000_000_000,
        fairnessPolicy: 'global-strict-fairness-policy',
        orderingPolicy: 'fcfs-ordering-policy',
        requests: 3,
        bytes: 180,
        flows: [
          { fairnessId: 'alpha', requests: 1, bytes: 50, oldestWaitMs: 45 },
          { fairnessId: 'beta', requests: 2, bytes: 130, oldestWaitMs: 55 },
        ],
      },
    ]);
    // The metrics snapshot lists flows band by band in no set order (gauges need none).
    const metricsSnapshot = h.fc.metricsSnapshot();
    metricsSnapshot.flows.sort((a, b) => b.priority - a.priority || (a.fairnessId < b.fairnessId ? -1 : 1));
    assert.deepEqual(metricsSnapshot, {
      flows: [
        { fairnessId: 'hi', priority: 10, requests: 1, bytes: 250 },
        { fairnessId: 'alpha', priority: 0, requests: 1, bytes: 50 },
        { fairnessId: 'beta', priority: 0, requests: 2, bytes: 130 },
      ],
      bands: [
        { priority: 10, requestsUtilization: 0.25, bytesUtilization: 0.25 },
        { priority: 0, requestsUtilization: 3 / 5000, bytesUtilization: 180 / 1_000_000_000 },
      ],
    });
    // Empty flows disappear at once.
    h.unblock();
    assert.deepEqual(h.fc.metricsSnapshot().flows, []);
    assert.deepEqual(h.fc.snapshot().bands.map((b) => b.flows.length), [0, 0]);
  });

  test('before any cycle: saturation and ceilings are null', () => {
    const h = new Harness();
    const snap = h.fc.snapshot();
    assert.equal(snap.saturation, null);
    assert.equal(snap.saturationSampledAt, null);
    assert.deepEqual(snap.ceilings, [{ priority: 0, ceiling: null }]);
    assert.equal(JSON.parse(JSON.stringify(snap)).saturation, null);
  });
});

describe('an arrival at an empty controller (the idle fast path)', () => {
  test('one cycle decides it: one saturation sample, one ceiling computation, nothing left queued', () => {
    let ceilingCalls = 0;
    const usageLimit: UsageLimitPolicy = {
      type: 'counting',
      name: 'counting',
      computeCeilings(_s, _p, out) {
        ceilingCalls++;
        out.fill(1);
      },
    };
    let runs = 0;
    const h = new Harness({ saturation: 0.5, usageLimit, onDispatchCycle: () => void runs++ });
    h.submit('a');
    assert.deepEqual(h.labels(), ['a']);
    assert.equal(h.outcomeOf('a')!.queuedMs, 0);
    assert.deepEqual([h.saturationSamples, ceilingCalls, runs], [1, 1, 1]);
    const snap = h.fc.snapshot();
    assert.equal(snap.saturation, 0.5);
    assert.deepEqual(snap.bands[0]!.flows, []);
    assert.equal(h.timers.pendingTimers, 0);
  });

  test('the fairness selector sees the request alone in its flow, with its deadlines', () => {
    const seen: unknown[] = [];
    const h = new Harness({
      saturation: 0,
      fairness: {
        type: 'spy',
        name: 'spy',
        newBandSelector: () => ({
          select(band) {
            const flow = band.flowAfter(undefined)!;
            const alone = band.flowAfter(flow.id) === undefined && band.bestHead() === flow;
            seen.push({ alone, id: flow.id, len: flow.length, priority: flow.priority, head: { ...flow.head()! } });
            return flow;
          },
        }),
      },
      config: { defaultRequestTTL: 1000 },
      start: 100,
    });
    h.submit('a', { fairnessId: 'tenant-x', byteSize: 42, receivedAt: 90, sloTtftMs: 500 });
    assert.deepEqual(h.labels(), ['a']);
    assert.equal(seen.length, 1);
    const s = seen[0] as { alone: boolean; id: string; len: number; priority: number; head: Record<string, number> };
    assert.deepEqual([s.alone, s.id, s.len, s.priority], [true, 'tenant-x', 1, 0]);
    assert.equal(s.head.enqueuedAt, 100);
    assert.equal(s.head.receivedAt, 90);
    assert.equal(s.head.ttlDeadline, 1100);
    assert.equal(s.head.sloDeadline, 590);
    assert.equal(s.head.byteSize, 42);
  });

  test('a selector that declines, throws or names a flow not of its band leaves the request queued, as a queued cycle would', () => {
    let answer: (band: BandView) => FlowView | undefined = () => undefined;
    const h = new Harness({
      saturation: 0,
      fairness: { type: 'odd', name: 'odd', newBandSelector: () => ({ select: (band) => answer(band) }) },
    });
    h.submit('declined');
    assert.deepEqual(h.labels(), []);
    assert.equal(h.fc.queued, 1);
    // A look-alike of the queued flow (same id and head) is not the flow.
    answer = (band) => {
      const real = band.bestHead()!;
      return { id: real.id, priority: real.priority, length: real.length, head: () => real.head() };
    };
    h.unblock(0);
    assert.equal(h.fc.queued, 1);
    answer = () => {
      throw new Error('policy bug');
    };
    const errorsBefore = h.fc.policyErrors;
    h.unblock(0);
    assert.equal(h.fc.policyErrors, errorsBefore + 1);
    answer = (band) => band.bestHead();
    h.unblock(0);
    assert.deepEqual(h.labels(), ['declined']);
    assert.equal(h.fc.queued, 0);
  });

  test('round robin: a request dispatched at once moves the cursor like a queued one', () => {
    const h = new Harness({ saturation: 0, fairness: roundRobinFairness });
    h.submit('b0', { fairnessId: 'b' }); // dispatched at once: the cursor is now at "b"
    h.saturation = 2;
    h.submit('a1', { fairnessId: 'a' });
    h.submit('b1', { fairnessId: 'b' });
    h.submit('c1', { fairnessId: 'c' });
    h.saturation = 0;
    h.fc.kick();
    h.timers.runImmediates();
    // After "b" comes "c", then wrap to "a", then "b".
    assert.deepEqual(h.labels(), ['b0', 'c1', 'a1', 'b1']);
  });

  test('each band keeps its own ceiling on the fast path', () => {
    const h = new Harness({
      saturation: 0.7,
      objectivePriorities: [10, 0],
      usageLimit: ceilingsByPriority({ 10: 1, 0: 0.6 }),
    });
    h.submit('high', { priority: 10 });
    assert.deepEqual(h.labels(), ['high']);
    h.fc.kick(); // nothing queued: no-op
    h.submit('low', { priority: 0 });
    assert.deepEqual(h.labels(), ['high']);
    assert.equal(h.fc.queued, 1);
    assert.equal(h.timers.dueTimes().length, 1); // its TTL timer is armed
  });
});

describe('soft-reflective alternation runs on time, as llm-d’s 1 ms dispatch loop', () => {
  test('a request in an alternating band is dispatched within a few ms with no event at all; none waits once s ≥ 1', () => {
    const h = new Harness({ usageLimit: new SoftReflectiveCeilingPolicy('sr'), objectivePriorities: [-1], saturation: 0.7, config: { defaultRequestTTL: 0, noEndpointRequestTTL: 0 } });
    // s = 0.7: the lower band alternates with period round(0.7 / 0.3) = 2, so a cycle 1 ms later opens it.
    h.submit('a', { priority: -1 });
    h.submit('b', { priority: -1 });
    assert.ok(h.labels().length < 2, 'one closed cycle at enqueue');
    h.timers.advance(10);
    assert.deepEqual(h.labels().sort(), ['a', 'b']);
    assert.equal(h.timers.pendingTimers, 0, 'no cycle is asked for with nothing waiting');

    // Arrivals between two cycles keep the one timer already due (no new timer per enqueue).
    const busy = new Harness({ usageLimit: new SoftReflectiveCeilingPolicy('sr'), objectivePriorities: [-1], saturation: 0.9, config: { defaultRequestTTL: 0, noEndpointRequestTTL: 0 } });
    busy.submit('first', { priority: -1 });
    const timersSet = busy.timers.setTimeoutCalls;
    for (let i = 0; i < 5; i++) {
      busy.clock.advance(0.1);
      busy.submit(`next${i}`, { priority: -1 });
    }
    assert.equal(busy.timers.setTimeoutCalls, timersSet);
    assert.equal(busy.timers.pendingTimers, 1);

    // Saturated (s ≥ 1): every lower band is closed, nothing alternates, so no 1 ms cycle spins.
    const full = new Harness({ usageLimit: new SoftReflectiveCeilingPolicy('sr'), objectivePriorities: [-1], saturation: 1, config: { defaultRequestTTL: 0, noEndpointRequestTTL: 0 } });
    full.submit('c', { priority: -1 });
    assert.equal(full.timers.pendingTimers, 0);
  });
});
