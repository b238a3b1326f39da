import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Harness, band } from './harness.js';

/**
 * A fleet with `room` free places: the gate is open while room > 0 and each dispatch takes one, so
 * every `release()` lets exactly one request go. `waiting` holds the labels that would rather wait.
 */
function fleet(affinityLookahead: number, opts: { priorities?: number[] } = {}) {
  let room = 0;
  const waiting = new Set<string>();
  const asked: string[] = [];
  const overtakes = { count: 0 };
  const h = new Harness({
    onAffinityOvertake: () => void overtakes.count++,
    saturation: () => (room > 0 ? 0 : 1),
    config: { affinityLookahead, ...(opts.priorities ? { priorityBands: opts.priorities.map((p) => band(p)) } : {}) },
    objectivePriorities: opts.priorities ?? [],
  });
  const submit = (label: string, priority = 0): void => {
    h.submit(label, {
      priority,
      then: (outcome) => {
        if (outcome === 'Dispatched') room--;
      },
      prefersToWait: () => {
        asked.push(label);
        if (label === 'thrower') throw new Error('probe failed');
        return waiting.has(label);
      },
    });
  };
  const release = (n = 1): void => {
    for (let i = 0; i < n; i++) {
      room = 1;
      h.fc.kick();
      h.timers.runImmediates();
    }
  };
  return { h, waiting, asked, overtakes, submit, release };
}

describe('flow control: affinity look-ahead (Sluice, flowControl.affinityLookahead)', () => {
  test('a later request goes before a head that would rather wait, at most K times', () => {
    const { h, waiting, overtakes, submit, release } = fleet(2);
    for (const l of ['a', 'b', 'c', 'd']) submit(l);
    assert.equal(h.fc.queued, 4);
    waiting.add('a');
    release();
    assert.deepEqual(h.labels(), ['b'], 'b overtakes a (1)');
    release();
    assert.deepEqual(h.labels(), ['b', 'c'], 'c overtakes a (2)');
    release();
    assert.deepEqual(h.labels(), ['b', 'c', 'a'], 'a has been overtaken K = 2 times: it goes, though it would still rather wait');
    release();
    assert.deepEqual(h.labels(), ['b', 'c', 'a', 'd']);
    assert.equal(overtakes.count, 2, 'the metrics hook saw the two dispatches out of order');
  });

  test('a reload keeps how often a queued request was passed: the bound K holds across it', () => {
    let room = 0;
    const waiting = new Set(['a']);
    const make = () => new Harness({ saturation: () => (room > 0 ? 0 : 1), config: { affinityLookahead: 2 } });
    const old = make();
    for (const label of ['a', 'b', 'c', 'd']) {
      old.submit(label, { then: (outcome) => void (outcome === 'Dispatched' && room--), prefersToWait: () => waiting.has(label) });
    }
    const release = (h: Harness): void => {
      room = 1;
      h.fc.kick();
      h.timers.runImmediates();
    };
    release(old);
    assert.deepEqual(old.labels(), ['b'], 'b passes a (1)');
    const next = make();
    old.fc.handOver(next.fc);
    release(next);
    assert.deepEqual(old.labels(), ['b', 'c'], 'c passes a (2), after the reload');
    release(next);
    assert.deepEqual(old.labels(), ['b', 'c', 'a'], 'passed K = 2 times in all: a goes, though it would still rather wait');
  });

  test('lookahead 0 keeps the strict order and never asks', () => {
    const { h, waiting, asked, submit, release } = fleet(0);
    for (const l of ['a', 'b', 'c']) submit(l);
    waiting.add('a');
    release(3);
    assert.deepEqual(h.labels(), ['a', 'b', 'c']);
    assert.deepEqual(asked, []);
  });

  test('when everyone in the window would rather wait the head goes; nothing past the window is asked', () => {
    const { h, waiting, asked, overtakes, submit, release } = fleet(2);
    for (const l of ['a', 'b', 'c', 'd']) submit(l);
    for (const l of ['a', 'b', 'c']) waiting.add(l);
    release();
    assert.deepEqual(h.labels(), ['a'], 'd (content) is beyond head + K and is not taken');
    assert.deepEqual(asked, ['a', 'b', 'c']);
    assert.equal(overtakes.count, 0);
  });

  test('the requests passed over keep their order', () => {
    const { h, waiting, submit, release } = fleet(3);
    for (const l of ['a', 'b', 'c', 'd']) submit(l);
    waiting.add('a').add('b');
    release();
    assert.deepEqual(h.labels(), ['c']);
    waiting.clear();
    release(3);
    assert.deepEqual(h.labels(), ['c', 'a', 'b', 'd']);
  });

  test('a request alone in its flow is never held back, and no band is overtaken by a lower one', () => {
    const { h, waiting, submit, release } = fleet(4, { priorities: [10, 0] });
    submit('low-1');
    submit('high', 10);
    submit('low-2');
    waiting.add('high');
    release();
    assert.deepEqual(h.labels(), ['high']);
  });

  test('a probe that throws counts as a callback error and the request goes', () => {
    const { h, submit, release } = fleet(2);
    submit('thrower');
    submit('b');
    release();
    assert.deepEqual(h.labels(), ['thrower']);
    assert.equal(h.fc.snapshot().callbackErrors, 1);
  });

  test('a request passed over is still evicted at its TTL (heap positions stay consistent)', () => {
    const { h, waiting, submit, release } = fleet(2);
    submit('a');
    h.timers.advance(10);
    submit('b');
    submit('c');
    waiting.add('a');
    release();
    assert.deepEqual(h.labels(), ['b']);
    h.timers.advance(60_000 - 10);
    assert.equal(h.outcomeOf('a')?.outcome, 'EvictedTTL');
    assert.equal(h.outcomeOf('c'), undefined, 'c arrived 10 ms later: still queued');
    assert.equal(h.fc.queued, 1);
    release();
    assert.deepEqual(h.labels(), ['b', 'c']);
  });
});
