/**
 * An indexed binary min-heap. Each item records its own position in a numeric field named at
 * construction, so `remove` and `update` of an arbitrary item cost O(log n) with no search and no
 * wrapper allocation. One item may live in several heaps at once as long as each heap uses its own
 * field (the flow controller keeps a request in its flow's heap and in the expiry heap).
 *
 * The index field holds -1 while the item is in no heap of that field.
 */

/** Names of `T`'s writable numeric fields: where a heap may store the item's position. */
export type HeapIndexKey<T> = {
  [K in keyof T]-?: T[K] extends number ? K : never;
}[keyof T] &
  string;

/** Negative when `a` must come out before `b`. */
export type HeapComparator<T> = (a: T, b: T) => number;

export const NOT_IN_HEAP = -1;

export class IndexedHeap<T> {
  private items: T[] = [];

  constructor(
    private readonly compare: HeapComparator<T>,
    private readonly indexKey: HeapIndexKey<T>,
  ) {}

  get size(): number {
    return this.items.length;
  }

  /** The least item, or undefined when empty. */
  peek(): T | undefined {
    return this.items[0];
  }

  /** Whether `item` is in this heap (by identity). */
  contains(item: T): boolean {
    const i = this.indexOf(item);
    return i >= 0 && i < this.items.length && this.items[i] === item;
  }

  push(item: T): void {
    this.items.push(item);
    this.siftUp(this.items.length - 1, item);
  }

  /** Removes and returns the least item. */
  pop(): T | undefined {
    const items = this.items;
    const top = items[0];
    if (top === undefined) return undefined;
    const last = items.pop()!;
    if (items.length > 0) this.siftDown(0, last);
    this.setIndex(top, NOT_IN_HEAP);
    return top;
  }

  /** Removes `item` wherever it sits; false when it is not in this heap. */
  remove(item: T): boolean {
    const i = this.indexOf(item);
    const items = this.items;
    if (i < 0 || i >= items.length || items[i] !== item) return false;
    const last = items.pop()!;
    if (i < items.length) this.place(i, last);
    this.setIndex(item, NOT_IN_HEAP);
    return true;
  }

  /** Restores order after `item`'s key changed; false when it is not in this heap. */
  update(item: T): boolean {
    const i = this.indexOf(item);
    if (i < 0 || i >= this.items.length || this.items[i] !== item) return false;
    this.place(i, item);
    return true;
  }

  /**
   * Replaces the contents with `items` (taken over, not copied) and orders them in O(n). Items
   * previously held and not in `items` are marked as out of the heap.
   */
  reset(items: T[]): void {
    for (const old of this.items) this.setIndex(old, NOT_IN_HEAP);
    this.items = items;
    for (let i = 0; i < items.length; i++) this.setIndex(items[i]!, i);
    this.heapify();
  }

  /** Re-orders everything in O(n), e.g. after many keys changed at once. */
  heapify(): void {
    const items = this.items;
    for (let i = (items.length >>> 1) - 1; i >= 0; i--) this.siftDown(i, items[i]!);
  }

  /** Empties the heap and marks every item as out of it. */
  clear(): void {
    for (const old of this.items) this.setIndex(old, NOT_IN_HEAP);
    this.items = [];
  }

  /** The items in heap (not sorted) order; read-only, valid until the next mutation. */
  values(): readonly T[] {
    return this.items;
  }

  private indexOf(item: T): number {
    return (item as unknown as Record<string, number>)[this.indexKey]!;
  }

  private setIndex(item: T, i: number): void {
    (item as unknown as Record<string, number>)[this.indexKey] = i;
  }

  /** Puts `item` into slot `i` and moves it whichever way the order requires. */
  private place(i: number, item: T): void {
    if (i > 0 && this.compare(item, this.items[(i - 1) >>> 1]!) < 0) this.siftUp(i, item);
    else this.siftDown(i, item);
  }

  // Both sifts move a "hole" and write `item` once at its final slot, halving the writes.
  private siftUp(i: number, item: T): void {
    const items = this.items;
    while (i > 0) {
      const parentIndex = (i - 1) >>> 1;
      const parent = items[parentIndex]!;
      if (this.compare(item, parent) >= 0) break;
      items[i] = parent;
      this.setIndex(parent, i);
      i = parentIndex;
    }
    items[i] = item;
    this.setIndex(item, i);
  }

  private siftDown(i: number, item: T): void {
    const items = this.items;
    const n = items.length;
    const half = n >>> 1;
    while (i < half) {
      let childIndex = 2 * i + 1;
      let child = items[childIndex]!;
      const rightIndex = childIndex + 1;
      if (rightIndex < n && this.compare(items[rightIndex]!, child) < 0) {
        childIndex = rightIndex;
        child = items[rightIndex]!;
      }
      if (this.compare(item, child) <= 0) break;
      items[i] = child;
      this.setIndex(child, i);
      i = childIndex;
    }
    items[i] = item;
    this.setIndex(item, i);
  }
}
