import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { outcomeToHttp } from '../../src/flowcontrol/outcomes.js';
import type { FlowOutcome, OutcomeCause } from '../../src/flowcontrol/types.js';

type Row = [
  name: string,
  outcome: FlowOutcome,
  cause: OutcomeCause | undefined,
  poolEmptyNow: boolean,
  status: number | undefined,
  reason: string | undefined,
  messagePrefix?: string,
];

/**
 * Reference §6.7 (admission_test.go), llm-d-router column, as far as our outcome vocabulary goes.
 * The rows for Rejected/EvictedOther *wrapping* a TTL expiry or a client cancel have no equivalent
 * here: our controller has no pre-admission buffer, so those arrive as EvictedTTL /
 * EvictedContextCancelled (covered by their own rows); "shutdown + TTL → shutting-down" is the
 * shutting-down cause winning, below.
 */
const TABLE: Row[] = [
  ['dispatched proceeds', 'Dispatched', undefined, false, undefined, undefined],
  ['queue at capacity, pool has endpoints', 'RejectedCapacity', undefined, false, 429, 'rejected-saturated', 'flow control queue is at capacity'],
  ['a body no queue can hold: the same answer, saying a retry cannot help', 'RejectedCapacity', 'larger-than-capacity', false, 429, 'rejected-saturated', 'request body is larger than'],
  ['queue at capacity, pool empty', 'RejectedNoEndpoints', undefined, true, 503, 'rejected-no-endpoints', 'no endpoints available'],
  ['a body no queue can hold, pool empty: endpoints coming back would not help', 'RejectedNoEndpoints', 'larger-than-capacity', true, 429, 'rejected-saturated', 'request body is larger than'],
  ['TTL with endpoints', 'EvictedTTL', undefined, false, 429, 'rejected-ttl-expired', 'request timed out in queue'],
  ['TTL, pool empty when probed', 'EvictedTTL', undefined, true, 503, 'rejected-no-endpoints', 'request timed out in queue and no endpoints'],
  ['timed out with no endpoints', 'EvictedNoEndpoints', undefined, true, 503, 'rejected-no-endpoints', 'request timed out in queue and no endpoints'],
  ['EvictedNoEndpoints is 503 whatever the probe says', 'EvictedNoEndpoints', undefined, false, 503, 'rejected-no-endpoints'],
  ['client disconnected', 'EvictedContextCancelled', undefined, false, 503, 'rejected-context-cancelled', 'client disconnected'],
  ['shutdown while queued', 'EvictedOther', 'shutting-down', false, 503, 'rejected-shutting-down', 'flow controller shutting down'],
  ['shutdown before admission', 'RejectedOther', 'shutting-down', false, 503, 'rejected-shutting-down'],
  ['shutdown wins over an empty pool', 'EvictedOther', 'shutting-down', true, 503, 'rejected-shutting-down'],
  ['internal error (evicted)', 'EvictedOther', 'internal', false, 500, undefined, 'internal flow control error'],
  ['internal error (rejected)', 'RejectedOther', 'internal', true, 500, undefined],
  ['other without a cause', 'RejectedOther', undefined, false, 500, undefined],
];

describe('outcomeToHttp (reference §2.11 / §6.7)', () => {
  for (const [name, outcome, cause, poolEmptyNow, status, reason, prefix] of TABLE) {
    test(name, () => {
      const answer = outcomeToHttp(outcome, cause, poolEmptyNow);
      if (status === undefined) {
        assert.equal(answer, undefined);
        return;
      }
      assert.ok(answer);
      assert.equal(answer.status, status);
      assert.equal(answer.droppedReason, reason);
      assert.ok(answer.message.length > 0);
      if (prefix !== undefined) assert.ok(answer.message.startsWith(prefix), answer.message);
    });
  }

  test('an unknown outcome is a 500 naming it', () => {
    const answer = outcomeToHttp('Bogus' as FlowOutcome, undefined, false);
    assert.deepEqual(answer, { status: 500, droppedReason: undefined, message: 'unhandled flow control outcome: Bogus' });
  });

  test('answers are shared and frozen (no per-request allocation, no accidental mutation)', () => {
    const a = outcomeToHttp('RejectedCapacity', undefined, false);
    assert.equal(a, outcomeToHttp('RejectedCapacity', undefined, true));
    assert.ok(Object.isFrozen(a));
  });
});
