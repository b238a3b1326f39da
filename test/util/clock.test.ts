import { test } from 'node:test';
import assert from 'node:assert/strict';
import { systemClock } from '../../src/util/clock.js';

test('the system clock reads like Date.now() and never steps back', () => {
  // Within a second of the wall clock (they share the process start), on the same epoch scale.
  assert.ok(Math.abs(systemClock.now() - Date.now()) < 1000);
  let last = systemClock.now();
  for (let i = 0; i < 100_000; i++) {
    const t = systemClock.now();
    assert.ok(t >= last, `${t} after ${last}`);
    last = t;
  }
});
