/** discardRest (proxy/body.ts): after an early 413 the rest of the upload is read and dropped, for a while. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { discardRest } from '../../src/proxy/body.js';

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
