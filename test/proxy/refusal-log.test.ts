/** Refusals at warn level: the first of a spell at once, then one summary per window while they go on. */
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import { captureLogger } from '../helpers/fleet.js';
import { RefusalLog } from '../../src/proxy/refusal-log.js';

test('the first refusal of a quiet spell is logged at once, the rest as counts per window, nothing once they stop', () => {
  mock.timers.enable({ apis: ['setTimeout'] });
  const { logger, lines } = captureLogger('warn');
  const log = new RefusalLog(logger, 1000);
  try {
    log.note('rejected-saturated', 429, 'r-1');
    assert.deepEqual(
      lines().map((l) => [l.msg, l.droppedReason, l.status, l.requestId]),
      [['the gateway is refusing requests', 'rejected-saturated', 429, 'r-1']],
    );
    for (let i = 0; i < 500; i++) log.note('rejected-saturated', 429, `s-${i}`);
    log.note('rejected-ttl-expired', 429, 't-1');
    assert.equal(lines().length, 1, 'a storm is not logged request by request');
    mock.timers.tick(1000);
    assert.deepEqual(lines()[1]?.refused, { 'rejected-saturated': 500, 'rejected-ttl-expired': 1 });
    assert.equal(lines()[1]?.total, 501);
    // A quiet window ends the spell without a line; the next refusal is news again.
    mock.timers.tick(1000);
    assert.equal(lines().length, 2);
    log.note('rejected-no-endpoints', 503, 'n-1');
    assert.equal(lines().length, 3);
    assert.equal(lines()[2]?.msg, 'the gateway is refusing requests');
    log.note('rejected-no-endpoints', 503, 'n-2');
    log.note('rejected-shutting-down', 503, 'd-1');
    // Closing (the end of a drain) logs the window it cuts short: the last refusals are not lost.
    log.close();
    assert.equal(lines().length, 4);
    assert.deepEqual(lines()[3]?.refused, { 'rejected-no-endpoints': 1, 'rejected-shutting-down': 1 });
    mock.timers.tick(5000);
    log.close();
    assert.equal(lines().length, 4, 'closed: nothing more');
  } finally {
    mock.timers.reset();
  }
});
