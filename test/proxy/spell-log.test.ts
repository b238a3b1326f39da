/** SpellLog: the news of a spell at once, the rest as sums per window, nothing once it stops. */
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import { SpellLog } from '../../src/proxy/spell-log.js';

test('per key: the first event of each key in a spell is news; the rest are summed per window; a quiet window ends the spell', () => {
  mock.timers.enable({ apis: ['setTimeout'] });
  const sums: [Record<string, number>, number][] = [];
  const log = new SpellLog(1000, true, (counts, total) => sums.push([counts, total]));
  try {
    assert.equal(log.note('a: cut'), true);
    assert.equal(log.note('a: cut'), false);
    assert.equal(log.note('b: cut'), true, 'another endpoint is news of its own');
    for (let i = 0; i < 100; i++) log.note('a: cut');
    mock.timers.tick(1000);
    assert.deepEqual(sums, [[{ 'a: cut': 101 }, 101]]);
    assert.equal(log.note('b: cut'), false, 'the spell goes on: b was news in it already');
    mock.timers.tick(1000);
    assert.deepEqual(sums[1], [{ 'b: cut': 1 }, 1]);
    mock.timers.tick(1000); // a window with nothing: the spell is over
    assert.equal(sums.length, 2);
    assert.equal(log.note('a: cut'), true, 'news again');
    log.note('a: cut');
    log.close();
    assert.deepEqual(sums[2], [{ 'a: cut': 1 }, 1], 'closing logs the window it cuts short');
  } finally {
    mock.timers.reset();
  }
});
