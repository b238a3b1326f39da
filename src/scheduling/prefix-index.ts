/**
 * Approximate prefix-cache index (reference pd-and-vllm §3.2, GIE "estimate" mode).
 *
 * The prompt text is cut into blocks of `blockChars` characters (≈ blockSizeTokens × 4), each block
 * hashed together with the previous block's hash, so a block hash stands for the whole prefix up to
 * it. After each scheduling decision the chosen endpoint "learns" the request's block hashes; for a
 * new request, an endpoint's match is the number of leading blocks it has learned. This estimates
 * what vLLM's prefix cache holds without asking it.
 *
 * Storage (PrefixIndex): flat typed arrays, no JS Map per block. A membership record ties one
 * endpoint to one block and sits on two linked lists: the endpoint's LRU list (oldest first) and the
 * block's owner list (so a block nobody has ends the walk at once, and eviction drops a block the
 * moment its last owner forgets it). Blocks are found by walking a prompt from its first block: a
 * block links one next block, the first one learned after it, and a block no other block links (a
 * prompt's first block, or the first block of a suffix branching off a prefix whose link is taken)
 * is an anchor, the only kind in the hash table (open addressing, linear probing, keyed by the
 * 53-bit hash). This relies on what chained hashes guarantee: a block's hash stands for its whole
 * prefix, and an endpoint never holds a block without the one before it (it forgets tails first),
 * so a walk that stops at an unknown block has missed nothing after it. With prompts that are all
 * distinct every request learns and evicts a block per 64 characters; as a run, those are a few
 * sequential array writes each and one table entry per request, instead of a random table access
 * per block (which, with a table larger than the CPU caches, cost more than all the rest).
 *
 * Lazy tails: the blocks a request adds after its first new one are kept as one *tail* record — a
 * reference to the request's hash array, an offset and a length, on the endpoint's LRU list in their
 * place — instead of a block and a membership each. A tail hangs from that first new block and only
 * its endpoint holds it. Most prompts' tails are never asked for again (every prompt of a chat
 * differs after its shared head), and learning or forgetting a tail costs the same for 1 block as
 * for 200: at 15 k requests/s of distinct 4 KB prompts, learning and evicting block by block cost
 * ~13 % of the gateway's CPU, mostly cache misses on the records being evicted. A match reads a tail
 * in place; a learn whose walk reaches into one first turns it into blocks (materialize), so every
 * block shared by two chains or two endpoints is a real one.
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

/**
 * Final avalanche of the four 32-bit lanes (length mixed in) into one safe integer. Lanes 3 and 4
 * are mixed on their own first, so a change in any word reaches all 53 bits.
 */
function finish(h1: number, h2: number, h3: number, h4: number, length: number): number {
  // The length goes in too, so a trailing partial block differs from any full one.
  h1 ^= length ^ Math.imul(h3 ^ (h3 >>> 15), 0x27d4eb2d);
  h2 ^= Math.imul(h4 ^ (h4 >>> 15), 0x165667b1);
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return TWO_POW_32 * (0x1fffff & h2) + (h1 >>> 0);
}

// Lane multipliers and the seeds' lane constants.
const M1 = 2654435761;
const M2 = 1597334677;
const M3 = 2246822507;
const M4 = 3266489909;

/**
 * 53-bit non-cryptographic hash of code units `[start, end)` (`start` even) seeded with a previous
 * 53-bit hash: UTF-16 code units taken two at a time (one 32-bit word: `words` views the same bytes
 * as `units`), words dealt round-robin to four independent multiplicative lanes (so the CPU runs four
 * multiplies at once instead of waiting on one chain), the last 1–3 words and an odd last unit into
 * lane 1, then finalised into one safe integer.
 */
function hashUnits(units: Uint16Array, words: Uint32Array, start: number, end: number, seed: number): number {
  const lo = seed >>> 0;
  const hi = Math.floor(seed / TWO_POW_32) >>> 0;
  let h1 = 0xdeadbeef ^ lo;
  let h2 = 0x41c6ce57 ^ hi;
  let h3 = 0x9e3779b9 ^ hi;
  let h4 = 0x85ebca6b ^ lo;
  const wordsEnd = (end - start) >> 1;
  const quadsEnd = (start >> 1) + (wordsEnd & ~3);
  let k = start >> 1;
  for (; k < quadsEnd; k += 4) {
    h1 = Math.imul(h1 ^ words[k]!, M1);
    h2 = Math.imul(h2 ^ words[k + 1]!, M2);
    h3 = Math.imul(h3 ^ words[k + 2]!, M3);
    h4 = Math.imul(h4 ^ words[k + 3]!, M4);
  }
  for (const kEnd = (start >> 1) + wordsEnd; k < kEnd; k++) h1 = Math.imul(h1 ^ words[k]!, M1);
  if (((end - start) & 1) !== 0) h1 = Math.imul(h1 ^ units[end - 1]!, M1);
  return finish(h1, h2, h3, h4, end - start);
}

/** A scratch of its own for hashRange (blockHashes' scratch may hold the text it is hashing). */
let rangeUnits = new Uint16Array(64);
const MAX_RANGE_SCRATCH_UNITS = 1 << 16;
let rangeWords = new Uint32Array(rangeUnits.buffer);

/**
 * The hash of `text[start, end)` (hashUnits over its code units, copied to offset 0 so any `start`
 * works): seeds, blocks at an odd start, and texts too long for blockHashes' scratch.
 */
export function hashRange(text: string, start: number, end: number, seed: number): number {
  const n = end - start;
  let u = rangeUnits;
  let w = rangeWords;
  if (u.length < n) {
    u = new Uint16Array(n + (n & 1));
    w = new Uint32Array(u.buffer);
    // Kept for next time unless huge (a megabyte model name must not stay allocated).
    if (n <= MAX_RANGE_SCRATCH_UNITS) [rangeUnits, rangeWords] = [u, w];
  }
  for (let i = 0; i < n; i++) u[i] = text.charCodeAt(start + i);
  return hashUnits(u, w, 0, n, seed);
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
let words = new Uint32Array(0);
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
/** Longer texts (unlimited matching of a huge prompt) are hashed block by block through hashRange, not kept in scratch. */
const MAX_SCRATCH_UNITS = 1 << 20;

/**
 * The first `end` UTF-16 code units of `text` (in scratch space), or undefined when the text is
 * hashed block by block through hashRange: too long to keep a copy of, or Buffer's utf16le is not
 * the platform's byte order.
 */
function codeUnits(text: string, end: number): Uint16Array | undefined {
  if (!LITTLE_ENDIAN || end > MAX_SCRATCH_UNITS) return undefined;
  if (units.length < end) {
    unitBytes = Buffer.allocUnsafeSlow(Math.min(MAX_SCRATCH_UNITS, Math.max(end, units.length * 2)) * 2);
    units = new Uint16Array(unitBytes.buffer, unitBytes.byteOffset, unitBytes.length >> 1);
    // allocUnsafeSlow: a buffer of its own at offset 0, so a 32-bit view of it is aligned.
    words = new Uint32Array(unitBytes.buffer, unitBytes.byteOffset, unitBytes.length >> 2);
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
    // An odd start (blocks of odd length: the scorer's are 4 characters a token, other callers' may not be) reads the string.
    previous = copied && (start & 1) === 0 ? hashUnits(copied, words, start, blockEnd, previous) : hashRange(text, start, blockEnd, previous);
    hashes[i++] = previous;
  }
  return hashes;
}

const NONE = -1;

/** Fewest new blocks after a request's first new one that are kept as a lazy tail (fewer: blocks). */
const MIN_TAIL_BLOCKS = 2;

/** Table slot of a hash (the low 32 bits are well mixed by `finish`). */
function home(hash: number, mask: number): number {
  return (hash >>> 0) & mask;
}

function grownInt32(a: Int32Array<ArrayBuffer>, length: number): Int32Array<ArrayBuffer> {
  const b = new Int32Array(length);
  b.set(a);
  return b;
}

export class PrefixIndex {
  // --- endpoints: id ↔ name, each with its LRU list of memberships (head = least recently used)
  private readonly idByName = new Map<string, number>();
  private readonly freeIds: number[] = [];
  private lruHead = new Int32Array(8).fill(NONE);
  private lruTail = new Int32Array(8).fill(NONE);
  private lruSize = new Int32Array(8);
  private endpointTop = 0;

  // --- blocks: hash, head of the owner list, and the run links. `blockNext` is the block that
  // continues this one's prompt in the same run (or NONE); `blockParent` is the block whose
  // `blockNext` this one is, or NONE for an anchor: a block found through the table instead.
  // Free records chain through `blockOwners`.
  private blockHash = new Float64Array(1024);
  private blockOwners = new Int32Array(1024);
  private blockNext = new Int32Array(1024);
  private blockParent = new Int32Array(1024);
  /** The lazy tail (a membership record) continuing this block's prompt, or NONE. */
  private blockTail = new Int32Array(1024);
  private blockTop = 0;
  private blockFree = NONE;
  private blockCount = 0;

  // --- anchor table: open addressing over anchor blocks, at most half full
  private slots = new Int32Array(2048).fill(NONE);
  private mask = 2047;
  private anchorCount = 0;

  // --- memberships (endpoint holds block): LRU links, owner-list link; free records chain through `memNext`
  private memBlock = new Int32Array(1024);
  private memEndpoint = new Int32Array(1024);
  private memPrev = new Int32Array(1024);
  private memNext = new Int32Array(1024);
  private memOwnerNext = new Int32Array(1024);
  /** > 0: the record is a lazy tail of this many blocks after block `memBlock` (not on its owner list). */
  private memTailLen = new Int32Array(1024);
  /** A tail's hashes: `memTailHashes[m][memTailFrom[m] …]` (the learning request's array, kept by reference). */
  private memTailFrom = new Int32Array(1024);
  private memTailHashes: (readonly number[] | undefined)[] = new Array<undefined>(1024).fill(undefined); // dense: no holes
  private memTop = 0;
  private memFree = NONE;
  /** Blocks held in lazy tails (distinct from every real block: chained hashes never repeat). */
  private tailBlocks = 0;

  /** Scratch: candidate endpoint ids of one match() call. */
  private candidateIds = new Int32Array(16);
  /** Scratch: the block records of one learn() call's hashes. */
  private chainBlocks = new Int32Array(256);
  /** Scratch: the block records of a lazy tail being materialized. */
  private tailScratch = new Int32Array(256);

  /**
   * Matched leading blocks per candidate: `out[i]` is how many of `hashes`, from the first on,
   * `candidates[i]` has learned. The walk stops at the first block no candidate still matching has.
   */
  match(hashes: readonly number[], candidates: readonly Endpoint[], out?: Float64Array): Float64Array {
    const n = candidates.length;
    const matched = out ?? new Float64Array(n);
    matched.fill(0, 0, n);
    if (n === 0 || hashes.length === 0) return matched;
    const first = this.find(hashes[0]!);
    if (first === NONE) return matched; // the common case for a new prompt: nobody has its first block
    if (this.candidateIds.length < n) this.candidateIds = new Int32Array(Math.max(n, this.candidateIds.length * 2));
    const ids = this.candidateIds;
    let alive = 0;
    for (let i = 0; i < n; i++) {
      const id = this.idByName.get(candidates[i]!.name);
      ids[i] = id ?? NONE;
      if (id !== undefined) alive++;
    }
    const owners = this.blockOwners;
    const memEndpoint = this.memEndpoint;
    const memOwnerNext = this.memOwnerNext;
    let block = first;
    for (let b = 0; b < hashes.length && alive > 0; b++) {
      if (b > 0) {
        const hash = hashes[b]!;
        const next = this.blockNext[block]!;
        if (next !== NONE && this.blockHash[next] === hash) block = next;
        else {
          const t = this.blockTail[block]!;
          if (t !== NONE && this.tailHash(t, 0) === hash) {
            // Only the tail's endpoint holds what follows, and only if it held everything before.
            const id = memEndpoint[t]!;
            for (let i = 0; i < n; i++) if (ids[i] === id && matched[i] === b) matched[i] = b + this.tailMatch(t, hashes, b);
            break;
          }
          block = this.find(hash);
        }
      }
      if (block === NONE) break;
      alive = 0;
      for (let i = 0; i < n; i++) {
        if (matched[i] !== b) continue;
        const id = ids[i]!;
        for (let m = owners[block]!; m !== NONE; m = memOwnerNext[m]!) {
          if (memEndpoint[m] === id) {
            matched[i] = b + 1;
            alive++;
            break;
          }
        }
      }
    }
    return matched;
  }

  /**
   * Records that `endpointName` now caches these blocks (most recent), evicting down to `capacity`.
   * The last block is learned first and the first block last, so a prompt's tail is forgotten before
   * its head: vLLM frees a finished request's blocks in reverse order for the same reason, and a
   * prefix that lost its tail still matches, while one that lost its first block matches nothing.
   * The index may keep a reference to `hashes` (a lazy tail; a copy of its end when that is less than
   * half of it): the caller must not change it afterwards. `lazyTail` false: every new block is a
   * block (another endpoint is about to learn the same ones). A fractional capacity is rounded down.
   */
  learn(endpointName: string, hashes: readonly number[], capacity: number, lazyTail = true): void {
    let e = this.idByName.get(endpointName);
    if (e === undefined) e = this.addEndpoint(endpointName);
    const n = hashes.length;
    if (this.chainBlocks.length < n) this.chainBlocks = new Int32Array(Math.max(n, this.chainBlocks.length * 2));
    const blocks = this.chainBlocks;
    // The blocks known already, from the first on: an endpoint never holds a block without the one
    // before it (it forgets tails first), so nothing after the first unknown block is known either.
    // A lazy tail the walk reaches into becomes blocks first (it is shared from now on).
    let known = 0;
    let previous = NONE;
    while (known < n) {
      const hash = hashes[known]!;
      if (previous !== NONE) {
        const t = this.blockTail[previous]!;
        if (t !== NONE && this.tailHash(t, 0) === hash) this.materialize(t);
      }
      const b = this.step(previous, hash);
      if (b === NONE) break;
      blocks[known++] = previous = b;
    }
    // The rest are new: the first a block, hanging from the last known one unless another block
    // already does; the others a lazy tail after it, when there are enough to be worth one.
    let end = n;
    if (known < n) {
      blocks[known] = previous = this.addBlock(hashes[known]!, previous);
      if (lazyTail && n - known - 1 >= MIN_TAIL_BLOCKS) end = known + 1;
      else for (let k = known + 1; k < n; k++) blocks[k] = previous = this.addBlock(hashes[k]!, previous);
    }
    if (end < n) this.addTail(blocks[known]!, e, hashes, end, n - end);
    for (let k = end - 1; k >= 0; k--) {
      const block = blocks[k]!;
      if (k < known) {
        const held = this.membership(block, e);
        if (held !== NONE) {
          this.touch(e, held);
          continue;
        }
      }
      this.addMembership(block, e);
    }
    this.evictDownTo(e, Math.floor(capacity));
  }

  /** Forgets every endpoint not in `liveNames`. */
  purge(liveNames: ReadonlySet<string>): void {
    for (const [name, e] of this.idByName) {
      if (liveNames.has(name)) continue;
      this.evictDownTo(e, 0);
      this.idByName.delete(name);
      this.freeIds.push(e);
    }
  }

  /** Blocks learned by one endpoint (tests, debug). */
  size(endpointName: string): number {
    const e = this.idByName.get(endpointName);
    return e === undefined ? 0 : this.lruSize[e]!;
  }

  /** Endpoints the index knows. */
  endpointNames(): string[] {
    return [...this.idByName.keys()];
  }

  /** (endpoint, block) pairs held, over all endpoints (llm-d's indexer size). */
  get entries(): number {
    let n = 0;
    for (const e of this.idByName.values()) n += this.lruSize[e]!;
    return n;
  }

  /** Distinct hashes held by any endpoint. */
  get distinctBlocks(): number {
    return this.blockCount + this.tailBlocks;
  }

  // ------------------------------------------------------------------------------ endpoints

  private addEndpoint(name: string): number {
    let e = this.freeIds.pop();
    if (e === undefined) {
      e = this.endpointTop++;
      if (e >= this.lruHead.length) {
        const length = this.lruHead.length * 2;
        this.lruHead = grownInt32(this.lruHead, length);
        this.lruTail = grownInt32(this.lruTail, length);
        this.lruSize = grownInt32(this.lruSize, length);
      }
    }
    this.lruHead[e] = NONE;
    this.lruTail[e] = NONE;
    this.lruSize[e] = 0;
    this.idByName.set(name, e);
    return e;
  }

  // ------------------------------------------------------------------------------ block table

  /**
   * The block after `previous` (a block record, or NONE before a prompt's first block) whose hash is
   * `hash`, or NONE: the next block of `previous`'s run, else an anchor. A new prompt's blocks after
   * the first, or a new suffix's after its first, are found without touching the table.
   */
  private step(previous: number, hash: number): number {
    if (previous !== NONE) {
      const next = this.blockNext[previous]!;
      if (next !== NONE && this.blockHash[next] === hash) return next;
    }
    return this.find(hash);
  }

  /** The anchor block of `hash`, or NONE. */
  private find(hash: number): number {
    const slots = this.slots;
    const mask = this.mask;
    const blockHash = this.blockHash;
    for (let i = home(hash, mask); ; i = (i + 1) & mask) {
      const b = slots[i]!;
      if (b === NONE || blockHash[b] === hash) return b;
    }
  }

  /** A new block after `parent` (NONE for a prompt's first block): the next of its run, or an anchor. */
  private addBlock(hash: number, parent: number): number {
    let b = this.blockFree;
    if (b !== NONE) this.blockFree = this.blockOwners[b]!;
    else {
      b = this.blockTop++;
      if (b >= this.blockHash.length) {
        const length = this.blockHash.length * 2;
        const hashes = new Float64Array(length);
        hashes.set(this.blockHash);
        this.blockHash = hashes;
        this.blockOwners = grownInt32(this.blockOwners, length);
        this.blockNext = grownInt32(this.blockNext, length);
        this.blockParent = grownInt32(this.blockParent, length);
        this.blockTail = grownInt32(this.blockTail, length);
      }
    }
    this.blockHash[b] = hash;
    this.blockOwners[b] = NONE;
    this.blockNext[b] = NONE;
    this.blockTail[b] = NONE;
    this.blockCount++;
    if (parent !== NONE && this.blockNext[parent] === NONE) {
      this.blockNext[parent] = b;
      this.blockParent[b] = parent;
    } else this.addAnchor(b);
    return b;
  }

  private addAnchor(b: number): void {
    if ((this.anchorCount + 1) * 2 > this.slots.length) this.rehash(this.slots.length * 2);
    this.blockParent[b] = NONE;
    this.anchorCount++;
    const mask = this.mask;
    let i = home(this.blockHash[b]!, mask);
    while (this.slots[i] !== NONE) i = (i + 1) & mask;
    this.slots[i] = b;
  }

  /** Drops a block nobody owns any more: unlinked from its run or out of the table, record freed. */
  private removeBlock(b: number): void {
    const parent = this.blockParent[b]!;
    if (parent !== NONE) this.blockNext[parent] = NONE;
    else this.removeAnchor(b);
    // Only hashes that do not chain (a collision) leave a block after one nobody holds: keep it findable.
    const next = this.blockNext[b]!;
    if (next !== NONE) this.addAnchor(next);
    this.blockOwners[b] = this.blockFree;
    this.blockFree = b;
    this.blockCount--;
  }

  /** Takes an anchor out of the table (backward-shift deletion). */
  private removeAnchor(b: number): void {
    const slots = this.slots;
    const mask = this.mask;
    const blockHash = this.blockHash;
    let i = home(blockHash[b]!, mask);
    while (slots[i] !== b) i = (i + 1) & mask;
    // Pull later entries of the probe run back so lookups never cross an empty slot they need.
    for (let j = (i + 1) & mask; ; j = (j + 1) & mask) {
      const c = slots[j]!;
      if (c === NONE) break;
      const k = home(blockHash[c]!, mask);
      // `c` may move to `i` unless its home lies cyclically in (i, j].
      if (i <= j ? i < k && k <= j : i < k || k <= j) continue;
      slots[i] = c;
      i = j;
    }
    slots[i] = NONE;
    this.anchorCount--;
  }

  private rehash(size: number): void {
    const slots = new Int32Array(size).fill(NONE);
    const mask = size - 1;
    const old = this.slots;
    for (let i = 0; i < old.length; i++) {
      const b = old[i]!;
      if (b === NONE) continue;
      let j = home(this.blockHash[b]!, mask);
      while (slots[j] !== NONE) j = (j + 1) & mask;
      slots[j] = b;
    }
    this.slots = slots;
    this.mask = mask;
  }

  // ------------------------------------------------------------------------------ memberships

  /** The membership of endpoint `e` in `block`, or NONE (owner lists are short: a few endpoints at most). */
  private membership(block: number, e: number): number {
    for (let m = this.blockOwners[block]!; m !== NONE; m = this.memOwnerNext[m]!) {
      if (this.memEndpoint[m] === e) return m;
    }
    return NONE;
  }

  /** A free membership record (the arrays grow as needed). */
  private newRecord(): number {
    let m = this.memFree;
    if (m !== NONE) this.memFree = this.memNext[m]!;
    else {
      m = this.memTop++;
      if (m >= this.memBlock.length) {
        const length = this.memBlock.length * 2;
        this.memBlock = grownInt32(this.memBlock, length);
        this.memEndpoint = grownInt32(this.memEndpoint, length);
        this.memPrev = grownInt32(this.memPrev, length);
        this.memNext = grownInt32(this.memNext, length);
        this.memOwnerNext = grownInt32(this.memOwnerNext, length);
        this.memTailLen = grownInt32(this.memTailLen, length);
        this.memTailFrom = grownInt32(this.memTailFrom, length);
        // Grown by pushes: an array assigned far past its end would turn into a slow dictionary.
        while (this.memTailHashes.length < length) this.memTailHashes.push(undefined);
      }
    }
    return m;
  }

  /** Puts `m` on endpoint `e`'s LRU list just before `before` (NONE: at the most recent end). */
  private linkBefore(e: number, m: number, before: number): void {
    const prev = before === NONE ? this.lruTail[e]! : this.memPrev[before]!;
    this.memPrev[m] = prev;
    this.memNext[m] = before;
    if (prev === NONE) this.lruHead[e] = m;
    else this.memNext[prev] = m;
    if (before === NONE) this.lruTail[e] = m;
    else this.memPrev[before] = m;
  }

  /** Takes `m` off endpoint `e`'s LRU list and frees the record. */
  private unlink(e: number, m: number): void {
    const prev = this.memPrev[m]!;
    const next = this.memNext[m]!;
    if (prev === NONE) this.lruHead[e] = next;
    else this.memNext[prev] = next;
    if (next === NONE) this.lruTail[e] = prev;
    else this.memPrev[next] = prev;
    this.memNext[m] = this.memFree;
    this.memFree = m;
  }

  /** Endpoint `e` now holds `block`: most recent, or just before `before`. */
  private addMembership(block: number, e: number, before = NONE): void {
    const m = this.newRecord();
    this.memBlock[m] = block;
    this.memEndpoint[m] = e;
    this.memTailLen[m] = 0;
    // owner list: push front
    this.memOwnerNext[m] = this.blockOwners[block]!;
    this.blockOwners[block] = m;
    this.linkBefore(e, m, before);
    this.lruSize[e]!++;
  }

  /** Endpoint `e` now holds `hashes[from, from + length)`, the blocks after `block`, as a lazy tail (most recent). */
  private addTail(block: number, e: number, hashes: readonly number[], from: number, length: number): void {
    // A short suffix after a long shared prefix: keep a copy of the suffix, not the whole array.
    if (from > length) {
      hashes = hashes.slice(from, from + length);
      from = 0;
    }
    const m = this.newRecord();
    this.memBlock[m] = block;
    this.memEndpoint[m] = e;
    this.memTailLen[m] = length;
    this.memTailFrom[m] = from;
    this.memTailHashes[m] = hashes;
    this.blockTail[block] = m;
    this.linkBefore(e, m, NONE);
    this.lruSize[e]! += length;
    this.tailBlocks += length;
  }

  /** Hash `i` of lazy tail `t`. */
  private tailHash(t: number, i: number): number {
    return this.memTailHashes[t]![this.memTailFrom[t]! + i]!;
  }

  /** How many of `hashes` from `at` on equal lazy tail `t` from its start. */
  private tailMatch(t: number, hashes: readonly number[], at: number): number {
    const held = this.memTailHashes[t]!;
    const from = this.memTailFrom[t]!;
    const length = Math.min(this.memTailLen[t]!, hashes.length - at);
    let i = 0;
    while (i < length && held[from + i] === hashes[at + i]) i++;
    return i;
  }

  /**
   * Turns lazy tail `t` into blocks and memberships of its endpoint, in its place on the LRU list
   * (the last block oldest, as it was learned), so that another chain or endpoint can share them.
   */
  private materialize(t: number): void {
    const e = this.memEndpoint[t]!;
    const length = this.memTailLen[t]!;
    const held = this.memTailHashes[t]!;
    const from = this.memTailFrom[t]!;
    const blocks = this.tailScratch.length >= length ? this.tailScratch : (this.tailScratch = new Int32Array(length));
    let previous = this.memBlock[t]!;
    this.blockTail[previous] = NONE;
    for (let i = 0; i < length; i++) blocks[i] = previous = this.addBlock(held[from + i]!, previous);
    for (let i = length - 1; i >= 0; i--) this.addMembership(blocks[i]!, e, t);
    this.tailBlocks -= length;
    this.lruSize[e]! -= length;
    this.memTailHashes[t] = undefined;
    this.unlink(e, t);
  }

  /** Makes `m` the most recently used of endpoint `e`. */
  private touch(e: number, m: number): void {
    if (this.lruTail[e] === m) return;
    const prev = this.memPrev[m]!;
    const next = this.memNext[m]!; // not NONE: m is not the tail
    if (prev === NONE) this.lruHead[e] = next;
    else this.memNext[prev] = next;
    this.memPrev[next] = prev;
    const tail = this.lruTail[e]!;
    this.memPrev[m] = tail;
    this.memNext[m] = NONE;
    this.memNext[tail] = m;
    this.lruTail[e] = m;
  }

  /** Forgets endpoint `e`'s least recently used blocks until it holds at most `capacity` (a lazy tail loses its last blocks first). */
  private evictDownTo(e: number, capacity: number): void {
    while (this.lruSize[e]! > capacity) {
      const m = this.lruHead[e]!;
      const length = this.memTailLen[m]!;
      if (length === 0) {
        this.evictOldest(e, m);
        continue;
      }
      const drop = Math.min(length, this.lruSize[e]! - capacity);
      this.lruSize[e]! -= drop;
      this.tailBlocks -= drop;
      if (drop < length) {
        this.memTailLen[m] = length - drop;
        return;
      }
      this.blockTail[this.memBlock[m]!] = NONE;
      this.memTailHashes[m] = undefined;
      this.unlink(e, m);
    }
  }

  /** Forgets membership `m`, the least recently used of endpoint `e` (and its block when nobody else has it). */
  private evictOldest(e: number, m: number): void {
    const next = this.memNext[m]!;
    this.lruHead[e] = next;
    if (next === NONE) this.lruTail[e] = NONE;
    else this.memPrev[next] = NONE;
    this.lruSize[e]!--;
    const block = this.memBlock[m]!;
    let p = this.blockOwners[block]!;
    if (p === m) this.blockOwners[block] = this.memOwnerNext[m]!;
    else {
      while (this.memOwnerNext[p] !== m) p = this.memOwnerNext[p]!;
      this.memOwnerNext[p] = this.memOwnerNext[m]!;
    }
    this.memNext[m] = this.memFree;
    this.memFree = m;
    if (this.blockOwners[block] === NONE) this.removeBlock(block);
  }
}
