import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockLru } from '../../src/scheduling/prefix-index.js';
import { seededRandom } from '../../src/util/clock.js';

/** An obviously correct LRU: an array, most recent last. */
class OracleLru {
  order: number[] = [];
  touch(h: number): boolean {
    const i = this.order.indexOf(h);
    if (i >= 0) this.order.splice(i, 1);
    this.order.push(h);
    return i < 0;
  }
  evictOldest(): number | undefined {
    return this.order.shift();
  }
}

test('BlockLru evicts in least-recently-used order under random churn (vs an oracle), and compacts its log', () => {
  const rnd = seededRandom(99);
  const lru = new BlockLru();
  const oracle = new OracleLru();
  const capacity = 300;
  for (let step = 0; step < 60_000; step++) {
    const h = Math.floor(rnd() * 1000) * 2_654_435_761; // large, non-Smi keys like real hashes
    assert.equal(lru.touch(h), oracle.touch(h));
    while (lru.size > capacity) assert.equal(lru.evictOldest(), oracle.evictOldest());
    assert.equal(lru.size, oracle.order.length);
  }
  assert.deepEqual([...lru.keys()].sort((a, b) => a - b), [...oracle.order].sort((a, b) => a - b));
  // the log never holds much more than the live set (no unbounded growth under re-touches)
  const log = (lru as unknown as { logHashes: number[]; head: number }).logHashes.length;
  assert.ok(log <= 2 * capacity + 1024 + 4096 * 2, `log length ${log}`);
  while (lru.size > 0) assert.equal(lru.evictOldest(), oracle.evictOldest());
  assert.equal(lru.evictOldest(), undefined);
});
