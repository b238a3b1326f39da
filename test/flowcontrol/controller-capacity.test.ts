import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Harness, band } from './harness.js';

/** Reference §2.9 / §6.6: capacity bounds the queue; exactly at the limit fits, one over is rejected. */
describe('capacity', () => {
  test('global maxRequests 3 with a band of 10: the 4th is RejectedCapacity, synchronously', () => {
    const h = new Harness({ config: { maxRequests: 3, priorityBands: [band(0, { maxRequests: 10 })] }, saturation: 1 });
    for (const label of ['a', 'b', 'c']) h.submit(label);
    assert.equal(h.fc.queued, 3);
    const ticket = h.submit('d');
    assert.deepEqual(h.outcomeOf('d'), { label: 'd', outcome: 'RejectedCapacity', queuedMs: 0, cause: undefined, at: 0 });
    ticket.cancel(); // a rejected request's ticket is inert
    assert.equal(h.outcomes.length, 1);
    assert.equal(h.fc.queued, 3);
  });

  test('global maxBytes: exact fit allowed, one byte over rejected', () => {
    const h = new Harness({ config: { maxBytes: 1000 }, saturation: 1 });
    h.submit('a', { byteSize: 600 });
    h.submit('b', { byteSize: 400, priority: 5 }); // other band, same global budget
    assert.equal(h.fc.queuedBytes, 1000);
    h.submit('c', { byteSize: 1 });
    assert.equal(h.outcomeOf('c')!.outcome, 'RejectedCapacity');
    h.submit('zero', { byteSize: 0 });
    assert.equal(h.outcomeOf('zero'), undefined, 'a 0-byte request still fits exactly');
  });

  test('band maxBytes 1000: three 300-byte requests fit, the 4th is rejected', () => {
    const h = new Harness({ config: { priorityBands: [band(0, { maxBytes: 1000 })] }, saturation: 1 });
    for (const label of ['a', 'b', 'c']) h.submit(label, { byteSize: 300 });
    h.submit('d', { byteSize: 300 });
    assert.equal(h.outcomeOf('d')!.outcome, 'RejectedCapacity');
    h.submit('e', { byteSize: 100 });
    assert.equal(h.outcomeOf('e'), undefined, '300 × 3 + 100 = 1000 fits exactly');
    h.submit('f', { byteSize: 1 });
    assert.equal(h.outcomeOf('f')!.outcome, 'RejectedCapacity');
  });

  test('a request larger than a byte limit it must fit in is rejected as one that can never be queued, even into an empty queue', () => {
    const h = new Harness({ config: { maxBytes: 5000, priorityBands: [band(0, { maxBytes: 1000 })] }, saturation: 1 });
    h.submit('band', { byteSize: 1001 });
    h.submit('global', { byteSize: 5001, priority: 5 });
    h.submit('fits', { byteSize: 1000 });
    h.submit('full', { byteSize: 1 });
    assert.deepEqual(
      ['band', 'global', 'full'].map((l) => [h.outcomeOf(l)?.outcome, h.outcomeOf(l)?.cause]),
      [
        ['RejectedCapacity', 'larger-than-capacity'],
        ['RejectedCapacity', 'larger-than-capacity'],
        ['RejectedCapacity', undefined],
      ],
    );
  });

  test('the same with an empty pool answers RejectedNoEndpoints (a body larger than the band, saying so)', () => {
    const h = new Harness({ config: { priorityBands: [band(0, { maxBytes: 1000 })] }, poolEmpty: true, saturation: 1 });
    for (const label of ['a', 'b', 'c']) h.submit(label, { byteSize: 300 });
    h.submit('d', { byteSize: 300 });
    assert.equal(h.outcomeOf('d')!.outcome, 'RejectedNoEndpoints');
    h.submit('huge', { byteSize: 1001 });
    assert.deepEqual([h.outcomeOf('huge')!.outcome, h.outcomeOf('huge')!.cause], ['RejectedNoEndpoints', 'larger-than-capacity']);
    assert.equal(h.fc.queued, 3);
  });

  test('band maxRequests: exact fit, one over rejected; other bands unaffected', () => {
    const h = new Harness({ config: { priorityBands: [band(0, { maxRequests: 2 }), band(1, { maxRequests: 1 })] }, saturation: 1 });
    h.submit('a');
    h.submit('b');
    h.submit('c');
    h.submit('x', { priority: 1 });
    h.submit('y', { priority: 1 });
    assert.deepEqual(h.labels('RejectedCapacity'), ['c', 'y']);
    assert.equal(h.fc.queued, 3);
  });

  test('zero global limits are ignored (only the band limits bind)', () => {
    const h = new Harness({
      config: { maxBytes: 0, maxRequests: 0, priorityBands: [band(0, { maxRequests: 10_000, maxBytes: 10_000 * 1000 })] },
      saturation: 1,
    });
    for (let i = 0; i < 10_000; i++) h.submit(`r${i}`, { byteSize: 1000, fairnessId: `f${i % 7}` });
    assert.equal(h.outcomes.length, 0);
    assert.equal(h.fc.queued, 10_000);
    h.submit('over', { byteSize: 0 });
    assert.equal(h.outcomeOf('over')!.outcome, 'RejectedCapacity');
  });

  test('an unprovisioned priority counts against band 0', () => {
    const h = new Harness({ config: { priorityBands: [band(0, { maxRequests: 1 })] }, saturation: 1 });
    h.submit('a', { priority: 0 });
    h.submit('b', { priority: 42 });
    assert.equal(h.outcomeOf('b')!.outcome, 'RejectedCapacity');
  });

  test('dispatched and cancelled requests stop counting at once', () => {
    const h = new Harness({ config: { maxRequests: 2 }, saturation: 1 });
    const a = h.submit('a');
    h.submit('b');
    a.cancel();
    h.submit('c');
    assert.equal(h.outcomeOf('c'), undefined, 'the cancelled slot is free (no zombie)');
    h.unblock();
    h.saturation = 1;
    h.submit('d');
    h.submit('e');
    assert.equal(h.fc.queued, 2);
    assert.deepEqual(h.labels('RejectedCapacity'), []);
  });

  test('the rejection regime follows the pool as sampled at enqueue', () => {
    const h = new Harness({ config: { maxRequests: 1 }, saturation: 1 });
    h.submit('a');
    h.submit('b');
    h.poolEmpty = true;
    h.submit('c');
    h.poolEmpty = false;
    h.submit('d');
    assert.deepEqual(
      h.outcomes.map((o) => [o.label, o.outcome]),
      [
        ['b', 'RejectedCapacity'],
        ['c', 'RejectedNoEndpoints'],
        ['d', 'RejectedCapacity'],
      ],
    );
  });
});
