import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Harness } from './harness.js';

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

  test('handOver keeps the original enqueue time: the new TTL counts from it', () => {
    const old = new Harness({ saturation: 1, config: { defaultRequestTTL: 0 } });
    old.submit('a');
    old.clock.advance(800);
    const next = new Harness({ saturation: 1, config: { defaultRequestTTL: 1000 }, start: old.clock.now() });
    old.fc.handOver(next.fc);
    next.timers.advance(199);
    assert.equal(old.outcomeOf('a'), undefined);
    next.timers.advance(1);
    assert.equal(old.outcomeOf('a')?.outcome, 'EvictedTTL');
  });

  test('dispatchAll (flow control turned off) dispatches everything queued, in arrival order', () => {
    const h = new Harness({ saturation: 5 });
    h.submit('a', { priority: -1 });
    h.submit('b', { priority: 3 });
    h.fc.dispatchAll();
    assert.deepEqual(h.labels('Dispatched'), ['a', 'b']);
    assert.equal(h.fc.queued, 0);
  });
});
