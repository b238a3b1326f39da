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
  chunks: Buffer[];
  size: number;
  limit: number;
  resolve: (body: Buffer) => void;
  reject: (err: Error) => void;
}

const kBody = Symbol('sluice.body');
type Reading = IncomingMessage & { [kBody]?: BodyState | undefined };

/** Whether the request's `Content-Length` declares a body over `limit` (checked before reading a byte). */
export function declaresMoreThan(req: IncomingMessage, limit: number): boolean {
  const declared = req.headers['content-length'];
  return declared !== undefined && Number(declared) > limit;
}

export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  if (declaresMoreThan(req, limit)) return Promise.reject(new BodyTooLargeError(limit));
  return new Promise((resolve, reject) => {
    (req as Reading)[kBody] = { chunks: [], size: 0, limit, resolve, reject };
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
  if (state.size > state.limit) {
    detach(this);
    this.pause();
    state.reject(new BodyTooLargeError(state.limit));
    return;
  }
  state.chunks.push(c);
}

function onEnd(this: Reading): void {
  const state = detach(this);
  if (state === undefined) return;
  state.resolve(state.chunks.length === 1 ? state.chunks[0]! : Buffer.concat(state.chunks, state.size));
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
