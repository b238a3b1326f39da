/**
 * A list of items in arrival order (so oldest first), linked through the items themselves.
 *
 * Why not a Set: on the per-request path a Set of request contexts cost ~9 µs of CPU per request in
 * an A/B (79.4 against 70.6 µs), most likely for the identity hash each context got; two fields on
 * an object the request allocates anyway cost nothing measurable.
 */
export interface AgeLinked<T> {
  older: T | undefined;
  newer: T | undefined;
}

export class AgeList<T extends AgeLinked<T>> {
  oldest: T | undefined = undefined;
  private newest: T | undefined = undefined;
  size = 0;

  push(item: T): void {
    item.older = this.newest;
    item.newer = undefined;
    if (this.newest !== undefined) this.newest.newer = item;
    else this.oldest = item;
    this.newest = item;
    this.size++;
  }

  remove(item: T): void {
    const { older, newer } = item;
    if (older !== undefined) older.newer = newer;
    else if (this.oldest === item) this.oldest = newer;
    else return; // not in the list (removed before)
    if (newer !== undefined) newer.older = older;
    else this.newest = older;
    item.older = item.newer = undefined;
    this.size--;
  }
}
