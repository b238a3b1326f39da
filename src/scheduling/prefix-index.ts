/**
 * Approximate prefix-cache index (reference pd-and-vllm §3.2, GIE "estimate" mode).
 *
 * The prompt text is cut into blocks of `blockChars` characters (≈ blockSizeTokens × 4), each block
 * hashed together with the previous block's hash, so a block hash stands for the whole prefix up to
 * it. After each scheduling decision the chosen endpoint "learns" the request's block hashes; for a
 * new request, an endpoint's match is the number of leading blocks it has learned. This estimates
 * what vLLM's prefix cache holds without asking it.
 *
 * Storage: per endpoint an LRU set of hashes (insertion order of a JS Set = recency), plus a reverse
 * map hash → owner(s) so a block nobody has ends the walk at once. An owner entry is a bare name
 * when one endpoint has the block (the common case) and a Set only when several do, to keep memory
 * per hash small.
 */
import type { Endpoint } from '../datalayer/endpoint.js';

/** Hash-chain parameters. */
export interface PrefixHashOptions {
  /** Characters per block (blockSizeTokens × 4 unless the deprecated `blockSize` is given). */
  blockChars: number;
  /** At most this many blocks are hashed (0 = unlimited). */
  maxBlocks: number;
}

const TWO_POW_32 = 4294967296;

/** Final avalanche of the two 32-bit lanes (length mixed in) into one safe integer. */
function finish(h1: number, h2: number, length: number): number {
  // The length goes in too, so a trailing partial block differs from any full one.
  h1 ^= length;
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return TWO_POW_32 * (0x1fffff & h2) + (h1 >>> 0);
}

/**
 * 53-bit non-cryptographic hash of `text[start, end)` seeded with a previous 53-bit hash: two
 * 32-bit multiplicative lanes (cyrb53-style) over UTF-16 code units taken two at a time (one 32-bit
 * word per step; an odd last unit alone), finalised and combined into one safe integer. No
 * substring is allocated.
 */
export function hashRange(text: string, start: number, end: number, seed: number): number {
  let h1 = 0xdeadbeef ^ (seed >>> 0);
  let h2 = 0x41c6ce57 ^ (Math.floor(seed / TWO_POW_32) >>> 0);
  const pairsEnd = end - ((end - start) & 1);
  let i = start;
  for (; i < pairsEnd; i += 2) {
    const w = text.charCodeAt(i) | (text.charCodeAt(i + 1) << 16);
    h1 = Math.imul(h1 ^ w, 2654435761);
    h2 = Math.imul(h2 ^ w, 1597334677);
  }
  if (i < end) {
    const w = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ w, 2654435761);
    h2 = Math.imul(h2 ^ w, 1597334677);
  }
  return finish(h1, h2, end - start);
}

/** hashRange over code units already copied out of the string (same result, about twice as fast). */
function hashUnits(units: Uint16Array, start: number, end: number, seed: number): number {
  let h1 = 0xdeadbeef ^ (seed >>> 0);
  let h2 = 0x41c6ce57 ^ (Math.floor(seed / TWO_POW_32) >>> 0);
  const pairsEnd = end - ((end - start) & 1);
  let i = start;
  for (; i < pairsEnd; i += 2) {
    const w = units[i]! | (units[i + 1]! << 16);
    h1 = Math.imul(h1 ^ w, 2654435761);
    h2 = Math.imul(h2 ^ w, 1597334677);
  }
  if (i < end) {
    const w = units[i]!;
    h1 = Math.imul(h1 ^ w, 2654435761);
    h2 = Math.imul(h2 ^ w, 1597334677);
  }
  return finish(h1, h2, end - start);
}

/** Hash of the whole string (e.g. the chain seed from model and cache salt). */
export function hashString(text: string, seed = 0): number {
  return hashRange(text, 0, text.length, seed);
}

/**
 * Scratch space for the code units being hashed. Scheduling is synchronous, so one buffer serves
 * every request; it only grows, to 2 MiB at most. Reading a typed array in the hash loop is about
 * twice as fast as String#charCodeAt, and Buffer#write copies the units in native code.
 */
let unitBytes = Buffer.alloc(0);
let units = new Uint16Array(0);
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
/** Longer texts (unlimited matching of a huge prompt) are hashed from the string, not kept in scratch. */
const MAX_SCRATCH_UNITS = 1 << 20;

/**
 * The first `end` UTF-16 code units of `text` (in scratch space), or undefined when the text is
 * hashed straight from the string: too long to keep a copy of, or Buffer's utf16le is not the
 * platform's byte order.
 */
function codeUnits(text: string, end: number): Uint16Array | undefined {
  if (!LITTLE_ENDIAN || end > MAX_SCRATCH_UNITS) return undefined;
  if (units.length < end) {
    unitBytes = Buffer.allocUnsafeSlow(Math.min(MAX_SCRATCH_UNITS, Math.max(end, units.length * 2)) * 2);
    units = new Uint16Array(unitBytes.buffer, unitBytes.byteOffset, unitBytes.length >> 1);
  }
  unitBytes.write(text, 0, end * 2, 'utf16le');
  return units;
}

/**
 * Chained block hashes of `text`: full blocks, then a trailing partial block, truncated to
 * `maxBlocks` blocks. A text shorter than one block yields no hashes (too short to be worth
 * caching, as in GIE). Block i's hash is `hashRange(text, i × blockChars, …, hash of block i − 1)`.
 */
export function blockHashes(text: string, seed: number, opts: PrefixHashOptions): number[] {
  const { blockChars } = opts;
  if (text.length < blockChars) return [];
  let end = text.length;
  if (opts.maxBlocks > 0 && end > opts.maxBlocks * blockChars) end = opts.maxBlocks * blockChars;
  const hashes: number[] = new Array(Math.ceil(end / blockChars));
  const copied = codeUnits(text, end);
  let previous = seed;
  let i = 0;
  for (let start = 0; start < end; start += blockChars) {
    const blockEnd = Math.min(start + blockChars, end);
    previous = copied ? hashUnits(copied, start, blockEnd, previous) : hashRange(text, start, blockEnd, previous);
    hashes[i++] = previous;
  }
  return hashes;
}

type Owners = string | Set<string>;

function ownedBy(owners: Owners, name: string): boolean {
  return typeof owners === 'string' ? owners === name : owners.has(name);
}

/**
 * An LRU set of block hashes. Not a JS Set used as a queue: V8 leaves a tombstone per deleted entry
 * and `values().next()` walks over them, so evicting from the front of a churning Set costs
 * O(capacity) per eviction (≈ 1 ms per request at the default 31 250 blocks). Instead: a map
 * hash → last-use number plus an append-only log of (hash, use); an eviction pops log entries
 * until one is still current. The log is compacted when stale entries outnumber live ones.
 */
export class BlockLru {
  private readonly lastUse = new Map<number, number>();
  private logHashes: number[] = [];
  private logUses: number[] = [];
  private head = 0;
  private nextUse = 0;

  get size(): number {
    return this.lastUse.size;
  }

  has(hash: number): boolean {
    return this.lastUse.has(hash);
  }

  /** Marks `hash` most recently used; true when it was not held before. */
  touch(hash: number): boolean {
    const isNew = !this.lastUse.has(hash);
    const use = this.nextUse++;
    this.lastUse.set(hash, use);
    this.logHashes.push(hash);
    this.logUses.push(use);
    if (this.logHashes.length - this.head > 2 * this.lastUse.size + 1024) this.compact();
    return isNew;
  }

  /** Removes and returns the least recently used hash (undefined when empty). */
  evictOldest(): number | undefined {
    while (this.head < this.logHashes.length) {
      const hash = this.logHashes[this.head]!;
      const use = this.logUses[this.head]!;
      this.head++;
      if (this.lastUse.get(hash) === use) {
        this.lastUse.delete(hash);
        // Popped entries still occupy the front of the log; reclaim them once they are half of it.
        if (this.head > 4096 && this.head * 2 > this.logHashes.length) this.compact();
        return hash;
      }
    }
    return undefined;
  }

  keys(): IterableIterator<number> {
    return this.lastUse.keys();
  }

  /** Drops stale log entries (re-used or evicted hashes), keeping order. */
  private compact(): void {
    const hashes: number[] = [];
    const uses: number[] = [];
    for (let i = this.head; i < this.logHashes.length; i++) {
      const hash = this.logHashes[i]!;
      const use = this.logUses[i]!;
      if (this.lastUse.get(hash) === use) {
        hashes.push(hash);
        uses.push(use);
      }
    }
    this.logHashes = hashes;
    this.logUses = uses;
    this.head = 0;
  }
}

export class PrefixIndex {
  /** endpoint name → its learned hashes, least recently used first. */
  private readonly lrus = new Map<string, BlockLru>();
  /** hash → endpoint name(s) holding it. */
  private readonly owners = new Map<number, Owners>();

  /**
   * Matched leading blocks per candidate: `out[i]` is how many of `hashes`, from the first on,
   * `candidates[i]` has learned. The walk stops at the first block no candidate still matching has.
   */
  match(hashes: readonly number[], candidates: readonly Endpoint[], out?: Float64Array): Float64Array {
    const n = candidates.length;
    const matched = out ?? new Float64Array(n);
    matched.fill(0, 0, n);
    let alive = n;
    for (let b = 0; b < hashes.length && alive > 0; b++) {
      const owners = this.owners.get(hashes[b]!);
      if (owners === undefined) break;
      alive = 0;
      for (let i = 0; i < n; i++) {
        if (matched[i] === b && ownedBy(owners, candidates[i]!.name)) {
          matched[i] = b + 1;
          alive++;
        }
      }
    }
    return matched;
  }

  /** Records that `endpointName` now caches these blocks (most recent), evicting down to `capacity`. */
  learn(endpointName: string, hashes: readonly number[], capacity: number): void {
    let lru = this.lrus.get(endpointName);
    if (lru === undefined) {
      lru = new BlockLru();
      this.lrus.set(endpointName, lru);
    }
    for (const hash of hashes) {
      if (lru.touch(hash)) this.addOwner(hash, endpointName);
    }
    while (lru.size > capacity) {
      const oldest = lru.evictOldest();
      if (oldest === undefined) break;
      this.removeOwner(oldest, endpointName);
    }
  }

  /** Forgets every endpoint not in `liveNames`. */
  purge(liveNames: ReadonlySet<string>): void {
    for (const [name, lru] of this.lrus) {
      if (liveNames.has(name)) continue;
      for (const hash of lru.keys()) this.removeOwner(hash, name);
      this.lrus.delete(name);
    }
  }

  /** Blocks learned by one endpoint (tests, debug). */
  size(endpointName: string): number {
    return this.lrus.get(endpointName)?.size ?? 0;
  }

  /** Endpoints the index knows. */
  endpointNames(): string[] {
    return [...this.lrus.keys()];
  }

  /** Distinct hashes held by any endpoint. */
  get distinctBlocks(): number {
    return this.owners.size;
  }

  private addOwner(hash: number, name: string): void {
    const owners = this.owners.get(hash);
    if (owners === undefined) this.owners.set(hash, name);
    else if (typeof owners === 'string') {
      if (owners !== name) this.owners.set(hash, new Set([owners, name]));
    } else owners.add(name);
  }

  private removeOwner(hash: number, name: string): void {
    const owners = this.owners.get(hash);
    if (owners === undefined) return;
    if (typeof owners === 'string') {
      if (owners === name) this.owners.delete(hash);
      return;
    }
    owners.delete(name);
    if (owners.size === 1) this.owners.set(hash, owners.values().next().value as string);
    else if (owners.size === 0) this.owners.delete(hash);
  }
}
