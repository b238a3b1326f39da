/** Reads a request body into one Buffer, refusing (without buffering) anything past the limit. */
import type { IncomingMessage } from 'node:http';

export class BodyTooLargeError extends Error {
  constructor(readonly limit: number) {
    super(`request body exceeds the limit of ${limit} bytes`);
  }
}

/**
 * The state of one body being read, kept on the request itself so the listeners are shared
 * module-level functions (called with `this` = the request): no closures per request.
 */
interface BodyState {
  /** The first chunks as they came (one, for most bodies: no copy). */
  chunks: Buffer[];
  /** Past MAX_KEPT_CHUNKS: the bytes so far, copied into one buffer that grows (`size` of it filled). */
  joined: Buffer | undefined;
  size: number;
  /** The declared Content-Length, or -1 (chunked). */
  declared: number;
  limit: number;
  tally: BodyTally;
  resolve: (body: Buffer) => void;
  reject: (err: Error) => void;
}

const kBody = Symbol('sluice.body');
type Reading = IncomingMessage & { [kBody]?: BodyState | undefined };

/** Bytes of the bodies being read right now, for a server's `sluice_request_body_bytes_receiving`. */
export interface BodyTally {
  bytes: number;
}

const NO_TALLY: BodyTally = { bytes: 0 };

/** The body length the request's `Content-Length` declares, or -1 (none: chunked). */
function declaredLength(req: IncomingMessage): number {
  const declared = req.headers['content-length'];
  return declared === undefined ? -1 : Number(declared);
}

/** Whether the request's `Content-Length` declares a body over `limit` (checked before reading a byte). */
export function declaresMoreThan(req: IncomingMessage, limit: number): boolean {
  return declaredLength(req) > limit;
}

/**
 * Chunks kept as they come before the rest is copied into one buffer. Node hands over every chunk of
 * a chunked body as its own Buffer (a view of the socket read, ~400 B of heap each): a body sent in
 * 1-byte chunks held 400 times its size (2 MB of body: +800 MB, and a heap-limit crash), where a
 * Content-Length body comes in one or a few reads.
 */
const MAX_KEPT_CHUNKS = 16;
const MIN_JOINED = 64 << 10;

/** The request's body, whole; `tally` counts its bytes while it arrives. */
export function readBody(req: IncomingMessage, limit: number, tally: BodyTally = NO_TALLY): Promise<Buffer> {
  const declared = declaredLength(req);
  if (declared > limit) return Promise.reject(new BodyTooLargeError(limit));
  return new Promise((resolve, reject) => {
    (req as Reading)[kBody] = { chunks: [], joined: undefined, size: 0, declared, limit, tally, resolve, reject };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

/** Stops listening and hands back the state (undefined once already settled). */
function detach(req: Reading): BodyState | undefined {
  const state = req[kBody];
  if (state === undefined) return undefined;
  req[kBody] = undefined;
  state.tally.bytes -= state.size;
  req.off('data', onData);
  req.off('end', onEnd);
  req.off('error', onError);
  req.off('close', onClose);
  return state;
}

function onData(this: Reading, c: Buffer): void {
  const state = this[kBody];
  if (state === undefined) return;
  state.size += c.length;
  state.tally.bytes += c.length;
  if (state.size > state.limit) {
    detach(this);
    this.pause();
    state.reject(new BodyTooLargeError(state.limit));
    return;
  }
  const joined = state.joined;
  if (joined !== undefined) {
    const at = state.size - c.length;
    if (state.size <= joined.length) c.copy(joined, at);
    else state.joined = grown(joined, at, state, c);
    return;
  }
  state.chunks.push(c);
  if (state.chunks.length === MAX_KEPT_CHUNKS) {
    const into = Buffer.allocUnsafe(capacityFor(state, state.size));
    let at = 0;
    for (const kept of state.chunks) at += kept.copy(into, at);
    state.chunks.length = 0;
    state.joined = into;
  }
}

/**
 * Room for `needed` bytes: twice as much, up to the declared length (or the limit). Not the declared
 * length at once: a client declaring 16 MiB and sending a hundred bytes would make the gateway
 * reserve 16 MiB for each such connection.
 */
function capacityFor(state: BodyState, needed: number): number {
  return Math.min(state.declared >= needed ? state.declared : state.limit, Math.max(MIN_JOINED, needed * 2));
}

/** A larger copy of `joined[0, filled)` with `c` appended. */
function grown(joined: Buffer, filled: number, state: BodyState, c: Buffer): Buffer {
  const next = Buffer.allocUnsafe(capacityFor(state, state.size));
  joined.copy(next, 0, 0, filled);
  c.copy(next, filled);
  return next;
}

function onEnd(this: Reading): void {
  const state = detach(this);
  if (state === undefined) return;
  const { joined, size } = state;
  if (joined === undefined) state.resolve(state.chunks.length === 1 ? state.chunks[0]! : Buffer.concat(state.chunks, size));
  // A queued request holds its body: not the spare room of a buffer grown by doubling.
  else state.resolve(joined.length - size > size >> 3 ? Buffer.from(joined.subarray(0, size)) : joined.subarray(0, size));
}

function onError(this: Reading, err: Error): void {
  detach(this)?.reject(err);
}

function onClose(this: Reading): void {
  detach(this)?.reject(new Error('client closed the connection while sending the body'));
}

/** How long the rest of a refused body is read and dropped before the connection is cut (nginx's lingering_timeout). */
const LINGER_MS = 5000;

/**
 * After a 413 sent before the body was read: the rest of it is read and dropped, and the connection
 * stays usable. Closing a socket with unread upload data makes the kernel send a reset, which can
 * overtake the 413: the client then sees a network error (and the openai client uploads it all
 * again). A client still sending after LINGER_MS is cut.
 */
export function discardRest(req: IncomingMessage, lingerMs = LINGER_MS): void {
  const timer = setTimeout(() => req.destroy(), lingerMs);
  timer.unref();
  const stop = (): void => clearTimeout(timer);
  req.once('end', stop);
  req.once('close', stop);
  req.resume();
}
