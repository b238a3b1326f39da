/**
 * One `close` listener per response (a shared module-level function, installed by the API server)
 * tells whoever currently handles the request — the flow-control queue, then each upstream attempt
 * — that the client went away. Stages take and hand back the slot instead of adding and removing
 * listeners of their own. And `cutIfNeverRead` closes a connection whose client stopped reading an
 * answer the gateway finished writing.
 */
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

export interface ClientWatcher {
  /** The response closed (the client went away, or the answer finished: check `res.writableFinished`). */
  clientClosed(): void;
}

const kWatcher = Symbol('sluice.clientWatcher');
const kOnEnd = Symbol('sluice.onResponseEnd');
const kTracked = Symbol('sluice.tracked');

type Watched = ServerResponse & {
  [kWatcher]?: ClientWatcher | undefined;
  [kOnEnd]?: (() => void) | undefined;
  [kTracked]?: boolean;
};

/** Installs the close listener; `onEnd` runs after the watcher, once, when the response closes. */
export function trackResponse(res: ServerResponse, onEnd: () => void): void {
  const r = res as Watched;
  r[kOnEnd] = onEnd;
  if (r[kTracked] !== true) {
    r[kTracked] = true;
    res.on('close', onResponseClose);
  }
}

function onResponseClose(this: Watched): void {
  const w = this[kWatcher];
  if (w !== undefined) {
    this[kWatcher] = undefined;
    w.clientClosed();
  }
  const onEnd = this[kOnEnd];
  if (onEnd !== undefined) {
    this[kOnEnd] = undefined;
    onEnd();
  }
}

/** `w` hears the close from now on (replacing any earlier watcher). */
export function watchClient(res: ServerResponse, w: ClientWatcher): void {
  const r = res as Watched;
  r[kWatcher] = w;
  if (r[kTracked] !== true) {
    r[kTracked] = true;
    res.on('close', onResponseClose);
  }
}

/** Tells the current watcher now that its client is gone (the gateway ends the response itself). */
export function interruptWatcher(res: ServerResponse): void {
  const r = res as Watched;
  const w = r[kWatcher];
  if (w !== undefined) {
    r[kWatcher] = undefined;
    w.clientClosed();
  }
}

/** `w` no longer hears the close (no-op when another watcher took over). */
export function unwatchClient(res: ServerResponse, w: ClientWatcher): void {
  if ((res as Watched)[kWatcher] === w) (res as Watched)[kWatcher] = undefined;
}

/**
 * For a pipelined request (its response has no socket yet: the ones before it on the connection are
 * still answering). When the client leaves, Node destroys such a request but never closes its
 * response, so nobody would hear it: the connection's close is relayed to the response instead.
 * Returns how many pipelined answers on the connection are not yet closed, this one included.
 */
export function watchPipelined(socket: Socket, res: ServerResponse): number {
  // One listener per connection, however many requests a client pipelines on it (a listener each
  // would make Node warn of a leak from the 11th on).
  let waiting = pipelinedOn.get(socket);
  if (waiting === undefined) {
    const responses = new Set<ServerResponse>();
    waiting = responses;
    pipelinedOn.set(socket, responses);
    socket.once('close', () => {
      pipelinedOn.delete(socket);
      for (const r of responses) {
        if (r.writableFinished) continue;
        r.destroy();
        onResponseClose.call(r as Watched);
      }
    });
  }
  waiting.add(res);
  const pending = waiting;
  res.once('close', () => pending.delete(res));
  return pending.size;
}

/** Per connection: its pipelined answers not yet closed (watchPipelined). */
const pipelinedOn = new WeakMap<Socket, Set<ServerResponse>>();

/**
 * Node's server has no time-out for an answer it is still writing, so a client that never reads the
 * end of a finished answer would hold its connection, and the bytes the kernel could not take,
 * forever. Call once the whole answer is handed to `res` (a pipelined answer is watched from when
 * the connection is its own). Progress is counted on the connection:
 * bytes of its writes the kernel took, whichever answer they belong to, so a pipelined answer
 * waiting behind an earlier one is not cut while the client reads that one (Node only sees a write
 * go out whole, so a single large write shows progress when all of it has). When none went out
 * for a whole check (every `timeoutMs`: one to two `timeoutMs` after the last), `onCut` runs and the
 * connection is cut. Costs nothing for the usual answer, which the kernel took whole before this
 * is called.
 */
export function cutIfNeverRead(res: ServerResponse, timeoutMs: number, onCut: () => void): void {
  if (res.writableFinished || res.destroyed) return;
  // A pipelined answer waits for the connection while the ones before it are answered (which may
  // be silent for long: queued, or generating): its clock starts when it gets the connection.
  if (res.socket === null) return void res.once('socket', () => cutIfNeverRead(res, timeoutMs, onCut));
  const connection = res.req.socket;
  let sent = bytesTaken(connection);
  const timer = setInterval(() => {
    const now = bytesTaken(connection);
    if (now > sent) {
      sent = now;
      return;
    }
    clearInterval(timer);
    onCut();
    connection.destroy();
  }, timeoutMs);
  timer.unref();
  const stop = (): void => clearInterval(timer);
  res.once('finish', stop);
  res.once('close', stop);
}

/** Bytes of the connection's writes that completed: the kernel took them. */
function bytesTaken(socket: Socket): number {
  return socket.destroyed ? Number.POSITIVE_INFINITY : socket.bytesWritten - socket.writableLength;
}
