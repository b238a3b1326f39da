/** Refusals at warn level: the first of each kind in a spell at once, then one summary per window while they go on. */
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import { captureLogger } from '../helpers/fleet.js';
import { RefusalLog } from '../../src/proxy/refusal-log.js';

const FULL = 'flow control queue is at capacity';
const FILTERED = 'profile default: filter gold-only left no endpoints';
const TTL = 'request timed out in queue';

test('the first refusal of each kind in a quiet spell is logged at once with its message, the rest as counts per window, nothing once they stop', () => {
  mock.timers.enable({ apis: ['setTimeout'] });
  const { logger, lines } = captureLogger('warn');
  const log = new RefusalLog(logger, 1000);
  try {
    log.note('rejected-saturated', 429, 'r-1', FULL);
    assert.deepEqual(
      lines().map((l) => [l.msg, l.droppedReason, l.status, l.requestId, l.error]),
      [['the gateway is refusing requests', 'rejected-saturated', 429, 'r-1', FULL]],
    );
    for (let i = 0; i < 500; i++) log.note('rejected-saturated', 429, `s-${i}`, FULL);
    // The same reason for another cause (a profile that can pick nothing) is news: only its message tells it from a full queue.
    log.note('rejected-saturated', 429, 'f-1', FILTERED);
    log.note('rejected-saturated', 429, 'f-2', FILTERED);
    // Kinds are told apart without the per-request detail: two time-outs with different readings are one kind.
    log.note('rejected-ttl-expired', 429, 't-1', `${TTL}: the pool stayed saturated: decode 1.00`, TTL);
    log.note('rejected-ttl-expired', 429, 't-2', `${TTL}: the pool stayed saturated: decode 1.37`, TTL);
    assert.deepEqual(
      lines().map((l) => [l.requestId, l.error]),
      [
        ['r-1', FULL],
        ['f-1', FILTERED],
        ['t-1', `${TTL}: the pool stayed saturated: decode 1.00`],
      ],
      'a storm is not logged request by request',
    );
    mock.timers.tick(1000);
    assert.deepEqual(lines()[3]?.refused, { [`rejected-saturated: ${FULL}`]: 500, [`rejected-saturated: ${FILTERED}`]: 1, [`rejected-ttl-expired: ${TTL}`]: 1 });
    assert.equal(lines()[3]?.total, 502);
    // A quiet window ends the spell without a line; the next refusal is news again.
    mock.timers.tick(1000);
    assert.equal(lines().length, 4);
    log.note('rejected-saturated', 429, 'r-2', FULL);
    assert.equal(lines().length, 5);
    assert.equal(lines()[4]?.msg, 'the gateway is refusing requests');
    log.note('rejected-saturated', 429, 'r-3', FULL);
    log.note('rejected-saturated', 429, 'r-4', FULL);
    // Closing (the end of a drain) logs the window it cuts short: the last refusals are not lost.
    log.close();
    assert.equal(lines().length, 6);
    assert.deepEqual(lines()[5]?.refused, { [`rejected-saturated: ${FULL}`]: 2 });
    mock.timers.tick(5000);
    log.close();
    assert.equal(lines().length, 6, 'closed: nothing more');
  } finally {
    mock.timers.reset();
  }
});
