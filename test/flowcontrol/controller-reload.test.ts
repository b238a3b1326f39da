import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Harness } from './harness.js';
import type { UsageLimitPolicy } from '../../src/flowcontrol/policies/types.js';

/** Config reload keeps queued requests (SPEC §3.7): they move into the new configuration's controller. */
describe('reload', () => {
  test('handOver moves queued requests with their tickets; the new bands decide the order', () => {
    const old = new Harness({ saturation: 1 });
    old.submit('a');
    old.submit('b', { priority: 5 }); // no band 5 in the old config: band 0
    const c = old.submit('c');
    assert.equal(old.fc.queued, 3);

    const next = new Harness({ saturation: 1, objectivePriorities: [5] });
    old.fc.handOver(next.fc);
    assert.equal(old.fc.queued, 0);
    assert.equal(next.fc.queued, 3);
    assert.equal(old.outcomes.length, 0, 'nothing was answered by the move');

    c.cancel(); // the caller's ticket follows the request
    assert.equal(old.outcomeOf('c')?.outcome, 'EvictedContextCancelled');
    assert.equal(next.fc.queued, 2);

    old.submit('late');
    assert.deepEqual(
      [old.outcomeOf('late')?.outcome, old.outcomeOf('late')?.cause],
      ['RejectedOther', 'shutting-down'],
      'the retired controller takes nothing new',
    );

    next.unblock(0);
    assert.deepEqual(old.labels('Dispatched'), ['b', 'a'], 'band 5 of the new config goes first');
    assert.equal(next.fc.queued, 0);
  });

  test('a queued priority whose objective left the configuration keeps a band from the template (negative: defaultNegativePriorityBand), not band 0', () => {
    // Held back: negative bands open only below 0.5, the others below 1.
    const holdNegative: UsageLimitPolicy = {
      type: 'hold-negative',
      name: 'hold-negative',
      computeCeilings(_s, priorities, out) {
        priorities.forEach((p, i) => (out[i] = p < 0 ? 0.5 : 1));
      },
    };
    const old = new Harness({ saturation: 1, objectivePriorities: [-1], usageLimit: holdNegative });
    old.submit('batch', { priority: -1 });
    old.submit('plain');
    assert.deepEqual(old.fc.queuedPriorities().sort(), [-1, 0]);
    // The reload renumbered the objective to -2; the gateway provisions bands for what is queued.
    const next = new Harness({ saturation: 1, objectivePriorities: [-2, ...old.fc.queuedPriorities()], usageLimit: holdNegative });
    old.fc.handOver(next.fc);
    assert.deepEqual(next.fc.snapshot().bands.filter((b) => b.requests > 0).map((b) => b.priority), [0, -1]);
    next.saturation = 0.7;
    next.fc.runDispatch();
    assert.deepEqual(old.labels('Dispatched'), ['plain'], 'the sheddable one is still held back');
  });

  test('a band kept only for queued requests leaves the configured bands\' ceilings as the new configuration gives them', () => {
    // Rank-based, like priority-holdback-policy: every ceiling depends on how many bands there are.
    const seen: number[][] = [];
    const rank: UsageLimitPolicy = {
      type: 'rank',
      name: 'rank',
      computeCeilings(_s, priorities, out) {
        seen.push([...priorities]);
        priorities.forEach((_p, i) => (out[i] = 1 - i / priorities.length));
      },
    };
    const old = new Harness({ saturation: 1, objectivePriorities: [5, -1], usageLimit: rank });
    old.submit('batch', { priority: -1 });
    old.submit('urgent', { priority: 5 });
    // The reload dropped both objectives and added one at -2.
    const next = new Harness({ saturation: 1, objectivePriorities: [-2], carriedPriorities: old.fc.queuedPriorities(), usageLimit: rank });
    old.fc.handOver(next.fc);
    assert.deepEqual(seen.at(-1), [0, -2], 'the policy sees the configured bands only');
    assert.deepEqual(
      next.fc.snapshot().ceilings.map((c) => [c.priority, c.ceiling]),
      [
        [5, 1], // above every configured band: the highest one's ceiling below it, band 0's
        [0, 1],
        [-1, 0.5], // the nearest configured band below it: -2's
        [-2, 0.5],
      ],
    );
    next.saturation = 0.7;
    next.fc.runDispatch();
    assert.deepEqual(old.labels('Dispatched'), ['urgent'], 'band -1 is held like the band below it');
  });

  // [old TTL, new TTL, the client's x-llm-d-inference-ttl]: 800 ms queued, then 200 ms left either way.
  for (const [before, after, own] of [
    [0, 1000, undefined],
    [1000, 5000, 1000],
  ] as const) {
    test(`handOver keeps the original enqueue time: the new TTL counts from it${own === undefined ? '' : ", and the client's own TTL goes with the request"}`, () => {
      const old = new Harness({ saturation: 1, config: { defaultRequestTTL: before } });
      old.submit('a', own === undefined ? {} : { requestTtlMs: own });
      old.clock.advance(800);
      const next = new Harness({ saturation: 1, config: { defaultRequestTTL: after }, start: old.clock.now() });
      old.fc.handOver(next.fc);
      next.timers.advance(199);
      assert.equal(old.outcomeOf('a'), undefined);
      next.timers.advance(1);
      assert.equal(old.outcomeOf('a')?.outcome, 'EvictedTTL');
    });
  }

  test('dispatchAll (flow control turned off) dispatches everything queued, in arrival order', () => {
    const h = new Harness({ saturation: 5 });
    h.submit('a', { priority: -1 });
    h.submit('b', { priority: 3 });
    h.fc.dispatchAll();
    assert.deepEqual(h.labels('Dispatched'), ['a', 'b']);
    assert.equal(h.fc.queued, 0);
  });
});

test('a carried band below every configured band takes the lowest configured ceiling (a dropped sheddable objective stays held back)', () => {
  const rank: UsageLimitPolicy = { type: 'rank', name: 'rank', computeCeilings(_s, p, out) { p.forEach((_x, i) => (out[i] = 1 - i / p.length)); } };
  const old = new Harness({ saturation: 1, objectivePriorities: [-3], usageLimit: rank });
  old.submit('low', { priority: -3 });
  const next = new Harness({ saturation: 1, objectivePriorities: [-2], carriedPriorities: old.fc.queuedPriorities(), usageLimit: rank });
  old.fc.handOver(next.fc);
  assert.deepEqual(next.fc.snapshot().ceilings.map((c) => [c.priority, c.ceiling]), [[0, 1], [-2, 0.5], [-3, 0.5]]);
  next.saturation = 0.7;
  next.fc.runDispatch();
  assert.deepEqual(old.labels('Dispatched'), []);
});
