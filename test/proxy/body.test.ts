/**
 * proxy/body.ts: readBody joins a body sent in any number of chunks, within the limit;
 * discardRest: after an early 413 the rest of the upload is read and dropped, for a while.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { BodyTooLargeError, discardRest, readBody } from '../../src/proxy/body.js';
import { heapAfterGc } from '../helpers/heap.js';
import { until } from '../helpers/wait.js';


/** A server that refuses every upload at once with a 413, then lets `discardRest` read the rest. */
async function refusingServer(lingerMs: number) {
  const server = http.createServer((req, res) => {
    res.writeHead(413, { 'content-type': 'text/plain' });
    res.end('too large');
    discardRest(req, lingerMs);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port };
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => resolve(socket));
    socket.once('error', reject);
  });
}

const head = (length: number) => `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n`;

test('a client that finishes its upload keeps a usable connection; one still sending after the linger time is cut', async () => {
  const { server, port } = await refusingServer(200);
  try {
    // Finishes: both answers come back on the one connection.
    const done = await connect(port);
    let got = '';
    done.on('data', (c: Buffer) => (got += c.toString()));
    done.write(head(10_000) + 'x'.repeat(100));
    await new Promise((r) => setTimeout(r, 50));
    done.write('x'.repeat(9_900));
    done.write(head(2) + '{}');
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(got.match(/HTTP\/1\.1 413/g)?.length, 2, got);
    assert.equal(done.destroyed, false, 'still open after the linger time: the upload had ended');
    done.destroy();

    // Never finishes: the 413 arrives, then the connection is closed by the server.
    const stuck = await connect(port);
    let answer = '';
    stuck.on('data', (c: Buffer) => (answer += c.toString()));
    const closed = new Promise<number>((resolve) => {
      const start = Date.now();
      stuck.once('close', () => resolve(Date.now() - start));
    });
    stuck.write(head(1_000_000) + 'x'.repeat(1000));
    const afterMs = await Promise.race([closed, new Promise<number>((r) => setTimeout(() => r(-1), 5000).unref())]);
    assert.match(answer, /^HTTP\/1\.1 413/);
    assert.ok(afterMs >= 150, afterMs < 0 ? 'never cut' : `cut after ${afterMs} ms (linger 200 ms)`);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});

/** A server that reads each body with readBody (limit `limit`) and answers its length and SHA-free echo. */
async function readingServer(limit: number) {
  const bodies: Array<Buffer | Error> = [];
  const tally = { bytes: 0 };
  const server = http.createServer((req, res) => {
    readBody(req, limit, tally).then(
      (b) => {
        bodies.push(b);
        res.end(String(b.length));
      },
      (err: Error) => {
        bodies.push(err);
        res.writeHead(413).end();
      },
    );
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port, bodies, tally };
}

/** Sends `body` chunked, `piece` bytes per chunk, and waits for the answer. */
async function sendChunked(port: number, body: Buffer, piece: number, contentLength = false): Promise<string> {
  const socket = await connect(port);
  let got = '';
  socket.on('data', (c: Buffer) => (got += c.toString()));
  const ended = new Promise((r) => socket.once('close', r));
  if (contentLength) {
    socket.write(`POST / HTTP/1.1\r\nhost: x\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n`);
    for (let i = 0; i < body.length; i += piece) {
      socket.write(body.subarray(i, i + piece));
      // Separate reads on the server: each a chunk of its own.
      if (i % (piece * 8) === 0) await new Promise((r) => setImmediate(r));
    }
  } else {
    const parts: Buffer[] = [Buffer.from('POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n')];
    for (let i = 0; i < body.length; i += piece) {
      const p = body.subarray(i, i + piece);
      parts.push(Buffer.from(`${p.length.toString(16)}\r\n`), p, Buffer.from('\r\n'));
    }
    parts.push(Buffer.from('0\r\n\r\n'));
    socket.write(Buffer.concat(parts));
  }
  await ended;
  return got;
}

test('readBody: a body in 1-byte chunks holds about its size while it arrives (not ~400 B of Buffer per chunk), and comes back whole', async () => {
  const { server, port, bodies } = await readingServer(16 << 20);
  let serverSide: net.Socket | undefined;
  server.on('connection', (s: net.Socket) => (serverSide = s));
  try {
    const body = Buffer.from(JSON.stringify({ model: 'm', prompt: 'é'.repeat(100_000) }));
    const parts: Buffer[] = [Buffer.from('POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n')];
    for (let i = 0; i < body.length; i++) parts.push(Buffer.from('1\r\n'), body.subarray(i, i + 1), Buffer.from('\r\n'));
    const upload = Buffer.concat(parts);
    const socket = await connect(port);
    let got = '';
    socket.on('data', (c: Buffer) => (got += c.toString()));
    const ended = new Promise((r) => socket.once('close', r));
    const before = heapAfterGc();
    socket.write(upload); // all but the last chunk: the body is still being read
    await until(() => serverSide !== undefined && serverSide.bytesRead === upload.length);
    const grown = heapAfterGc() - before;
    // Seen: +80 MiB when every chunk was kept as its own Buffer; now the one growing copy (< 1 MiB).
    assert.ok(grown < 16 << 20, `heap grew ${(grown / 2 ** 20).toFixed(1)} MiB while reading a ${body.length}-byte body in 1-byte chunks`);
    socket.write('0\r\n\r\n');
    await ended;
    assert.ok(got.endsWith(`\r\n\r\n${body.length}`), got);
    const read = bodies[0] as Buffer;
    assert.ok(Buffer.isBuffer(read) && read.equals(body));
    // One buffer of the body's size (within 1/8 spare room).
    assert.ok(read.buffer.byteLength <= body.length * 1.125 + 8192, `backing store ${read.buffer.byteLength} B for ${body.length} B`);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});

test('readBody: a client declaring a large body and sending little of it makes the gateway reserve little', async () => {
  const { server, port } = await readingServer(16 << 20);
  const sockets: net.Socket[] = [];
  const serverSides: net.Socket[] = [];
  server.on('connection', (s: net.Socket) => serverSides.push(s));
  const head = `POST / HTTP/1.1\r\nhost: x\r\ncontent-length: ${16 << 20}\r\n\r\n`;
  try {
    const before = process.memoryUsage().arrayBuffers;
    for (let i = 0; i < 4; i++) {
      const s = await connect(port);
      sockets.push(s);
      s.write(head);
      // Past the chunks kept as they come: the rest goes to one growing buffer.
      for (let c = 0; c < 20; c++) {
        s.write('x'.repeat(8));
        await new Promise((r) => setTimeout(r, 2));
      }
    }
    await until(() => serverSides.length === 4 && serverSides.every((s) => s.bytesRead === head.length + 160), 3000, 'every byte read');
    const grown = process.memoryUsage().arrayBuffers - before;
    // Seen: +64 MiB when each reserved its declared 16 MiB.
    assert.ok(grown < 8 << 20, `buffers grew ${(grown / 2 ** 20).toFixed(1)} MiB for four connections that sent 160 bytes each`);
  } finally {
    for (const s of sockets) s.destroy();
    server.closeAllConnections();
    server.close();
  }
});

test('readBody: a few chunks, many chunks of a declared length, and chunks past the limit', async () => {
  const { server, port, bodies, tally } = await readingServer(100_000);
  try {
    const body = Buffer.from('x'.repeat(50_000) + 'y'.repeat(30_000));
    await sendChunked(port, body, 20_000); // 4 chunks: kept as they came, joined at the end
    await sendChunked(port, body, 1000, true); // Content-Length, many reads: grown by doubling up to that length
    await sendChunked(port, body, 7); // many small chunks, no length: grown by doubling, trimmed
    for (const got of bodies) assert.ok(Buffer.isBuffer(got) && got.equals(body));
    // What a queued request would hold: the body, not the spare room of a buffer grown for it.
    for (const got of bodies.slice(1, 3)) assert.ok((got as Buffer).buffer.byteLength <= body.length * 1.125, `${(got as Buffer).buffer.byteLength} B`);
    const over = Buffer.alloc(100_001, 'z');
    assert.match(await sendChunked(port, over, 3), /^HTTP\/1\.1 413/);
    assert.ok(bodies[3] instanceof BodyTooLargeError);
    // Bodies whole or refused hold nothing any more (sluice_request_body_bytes_receiving).
    assert.equal(tally.bytes, 0);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});
