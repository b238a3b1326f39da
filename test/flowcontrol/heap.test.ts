import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { IndexedHeap, NOT_IN_HEAP } from '../../src/flowcontrol/heap.js';
import { seededRandom } from '../../src/util/clock.js';

interface Node {
  key: number;
  id: number;
  a: number;
  b: number;
}

const byKey = (x: Node, y: Node) => x.key - y.key || x.id - y.id;
const node = (key: number, id: number): Node => ({ key, id, a: NOT_IN_HEAP, b: NOT_IN_HEAP });

function checkInvariant(heap: IndexedHeap<Node>, field: 'a' | 'b'): void {
  const items = heap.values();
  for (let i = 0; i < items.length; i++) {
    assert.equal(items[i]![field], i, 'every item knows its slot');
    if (i > 0) assert.ok(byKey(items[(i - 1) >>> 1]!, items[i]!) <= 0, 'parent ≤ child');
  }
}

describe('IndexedHeap', () => {
  test('random push/pop/remove/update agree with a sorted-array oracle', () => {
    const random = seededRandom(42);
    const heap = new IndexedHeap<Node>(byKey, 'a');
    let oracle: Node[] = [];
    let nextId = 0;
    for (let step = 0; step < 20_000; step++) {
      const r = random();
      if (r < 0.45 || oracle.length === 0) {
        const n = node(Math.floor(random() * 1000), nextId++);
        heap.push(n);
        oracle.push(n);
        oracle.sort(byKey);
      } else if (r < 0.65) {
        const popped = heap.pop();
        assert.equal(popped, oracle.shift());
        assert.equal(popped!.a, NOT_IN_HEAP);
      } else if (r < 0.85) {
        // Remove an arbitrary item, usually from the middle.
        const victim = oracle[Math.floor(random() * oracle.length)]!;
        assert.equal(heap.remove(victim), true);
        assert.equal(victim.a, NOT_IN_HEAP);
        assert.equal(heap.remove(victim), false, 'a second remove finds nothing');
        oracle = oracle.filter((n) => n !== victim);
      } else {
        const target = oracle[Math.floor(random() * oracle.length)]!;
        target.key = Math.floor(random() * 1000);
        assert.equal(heap.update(target), true);
        oracle.sort(byKey);
      }
      assert.equal(heap.size, oracle.length);
      assert.equal(heap.peek(), oracle[0]);
      if (step % 997 === 0) checkInvariant(heap, 'a');
    }
    checkInvariant(heap, 'a');
    const drained: Node[] = [];
    for (let n = heap.pop(); n !== undefined; n = heap.pop()) drained.push(n);
    assert.deepEqual(drained, oracle);
    assert.equal(heap.pop(), undefined);
    assert.equal(heap.peek(), undefined);
  });

  test('remove from the middle keeps order and indices', () => {
    const heap = new IndexedHeap<Node>(byKey, 'a');
    const nodes = [5, 1, 9, 3, 7, 2, 8, 6, 4, 0].map((k, i) => node(k, i));
    for (const n of nodes) heap.push(n);
    const middle = heap.values()[4]!;
    assert.equal(heap.remove(middle), true);
    assert.equal(heap.contains(middle), false);
    checkInvariant(heap, 'a');
    const order: number[] = [];
    for (let n = heap.pop(); n !== undefined; n = heap.pop()) order.push(n.key);
    assert.deepEqual(
      order,
      [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].filter((k) => k !== middle.key),
    );
  });

  test('removing the last slot and the only item', () => {
    const heap = new IndexedHeap<Node>(byKey, 'a');
    const only = node(1, 0);
    heap.push(only);
    assert.equal(heap.remove(only), true);
    assert.equal(heap.size, 0);
    const x = node(1, 1);
    const y = node(2, 2);
    heap.push(x);
    heap.push(y);
    assert.equal(heap.remove(y), true);
    assert.equal(heap.peek(), x);
    checkInvariant(heap, 'a');
  });

  test('an item can sit in two heaps through separate index fields', () => {
    const byKeyHeap = new IndexedHeap<Node>(byKey, 'a');
    const byIdDesc = new IndexedHeap<Node>((x, y) => y.id - x.id, 'b');
    const nodes = Array.from({ length: 50 }, (_, i) => node((i * 37) % 50, i));
    for (const n of nodes) {
      byKeyHeap.push(n);
      byIdDesc.push(n);
    }
    const victim = nodes[17]!;
    assert.equal(byKeyHeap.remove(victim), true);
    assert.equal(byIdDesc.contains(victim), true, 'the other heap is untouched');
    assert.equal(byIdDesc.remove(victim), true);
    assert.equal(byIdDesc.peek()!.id, 49);
    assert.equal(byKeyHeap.peek()!.key, 0);
    checkInvariant(byKeyHeap, 'a');
  });

  test('a foreign item is not removed, even with a plausible index', () => {
    const heap = new IndexedHeap<Node>(byKey, 'a');
    heap.push(node(1, 0));
    heap.push(node(2, 1));
    const stranger = node(0, 9);
    stranger.a = 0;
    assert.equal(heap.remove(stranger), false);
    assert.equal(heap.update(stranger), false);
    assert.equal(heap.size, 2);
  });

  test('reset takes over an array in O(n) and unmarks dropped items; clear unmarks all', () => {
    const heap = new IndexedHeap<Node>(byKey, 'a');
    const old = node(3, 0);
    heap.push(old);
    const fresh = [9, 4, 7, 1, 8, 2].map((k, i) => node(k, i + 1));
    heap.reset(fresh);
    assert.equal(old.a, NOT_IN_HEAP);
    checkInvariant(heap, 'a');
    assert.equal(heap.peek()!.key, 1);
    // Change many keys at once, then heapify.
    for (const n of heap.values()) n.key = 100 - n.key;
    heap.heapify();
    checkInvariant(heap, 'a');
    assert.equal(heap.peek()!.key, 91);
    heap.clear();
    assert.equal(heap.size, 0);
    for (const n of fresh) assert.equal(n.a, NOT_IN_HEAP);
  });
});
