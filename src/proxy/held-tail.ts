/**
 * The unfinished end of a stream of SSE lines or events, held across reads until its end arrives.
 *
 * Why not `Buffer.concat([held, chunk])` per read: an event that trickles in through small reads
 * (a model server or a proxy in front of it writing a large event in pieces) was then copied and
 * scanned whole on every read — time quadratic in its length, about 9 s of the gateway's CPU for a
 * 1 MB event in 64-byte reads. Here what is held grows by doubling, and only what arrived since
 * (plus `lookback` bytes of context) is searched for an end.
 */

/**
 * The index just past the last boundary of `buf` (the end of its last whole line or event), looking
 * only at boundaries whose last byte is at or after `from`; 0 when there is none.
 */
export type LastEnd = (buf: Buffer, from: number) => number;

const EMPTY = Buffer.alloc(0);
const NL = 0x0a;
const MIN_CAPACITY = 1024;

/** `LastEnd` of text lines (LF-terminated, as vLLM writes them). */
export const lastLineEnd: LastEnd = (buf, from) => {
  const nl = from === 0 ? buf.lastIndexOf(NL) : buf.subarray(from).lastIndexOf(NL);
  return nl < 0 ? 0 : from + nl + 1;
};

export class HeldTail {
  private buf: Buffer = EMPTY;
  private filled = 0;

  /** `lookback`: bytes before the new ones that a boundary ending in them may start in. */
  constructor(
    private readonly lastEnd: LastEnd,
    private readonly lookback: number,
  ) {}

  /** Bytes held (after the last boundary). */
  get length(): number {
    return this.filled;
  }

  /**
   * Everything up to the last boundary of what is held plus `chunk` (empty when there is none yet);
   * the rest is held. A chunk that ends on a boundary with nothing held is returned as is.
   * What is returned is never written to again, so it may sit in a socket's write queue.
   */
  push(chunk: Buffer): Buffer {
    if (chunk.length === 0) return chunk;
    if (this.filled === 0) {
      const end = this.lastEnd(chunk, 0);
      if (end === chunk.length) return chunk;
      this.hold(chunk.subarray(end));
      return end === 0 ? EMPTY : chunk.subarray(0, end);
    }
    const before = this.filled;
    this.hold(chunk);
    const all = this.buf.subarray(0, this.filled);
    const end = this.lastEnd(all, Math.max(0, before - this.lookback));
    if (end === 0) return EMPTY;
    this.detach();
    if (end < all.length) this.hold(all.subarray(end));
    return all.subarray(0, end);
  }

  /** Takes what is held (an unfinished line or event), leaving nothing. */
  take(): Buffer {
    const rest = this.buf.subarray(0, this.filled);
    this.detach();
    return rest;
  }

  /** Appends a copy of `bytes` (the caller's buffers belong to the HTTP client, or went out). */
  private hold(bytes: Buffer): void {
    const needed = this.filled + bytes.length;
    if (needed > this.buf.length) {
      const next = Buffer.allocUnsafe(Math.max(MIN_CAPACITY, needed * 2));
      this.buf.copy(next, 0, 0, this.filled);
      this.buf = next;
    }
    bytes.copy(this.buf, this.filled);
    this.filled = needed;
  }

  /** Forgets the buffer: parts of it were handed out, so it is never written again. */
  private detach(): void {
    this.buf = EMPTY;
    this.filled = 0;
  }
}
