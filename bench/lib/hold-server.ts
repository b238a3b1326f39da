/**
 * Baselines for the gateway queue-memory measurement — what any Node gateway pays per waiting
 * request before its own state:
 * - `http` (default): a bare node:http server that reads and parses each POST body and then holds
 *   the request (no answer);
 * - `tcp`: a bare net.Server that holds each connection and the first bytes it received (no HTTP
 *   parsing at all): the least a Node process can keep for an open client connection.
 * GET /held returns the count; POST /release answers them all (http) or closes them (tcp). In `tcp`
 * mode these are served on CONTROL_PORT by a node:http server of their own.
 *
 *   node --expose-gc --import tsx --import bench/lib/mem-probe.ts bench/lib/hold-server.ts PORT [tcp CONTROL_PORT]
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type Socket } from 'node:net';

const [port, mode, controlPort] = [Number(process.argv[2]), process.argv[3] ?? 'http', Number(process.argv[4])];
const held: ServerResponse[] = [];
const heldSockets: { socket: Socket; received: Buffer }[] = [];

/** /held, /health and /release; false for any other request. */
function control(req: IncomingMessage, res: ServerResponse): boolean {
  if (req.method === 'GET' && req.url === '/held') {
    const count = mode === 'tcp' ? heldSockets.length : held.length;
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ held: count }));
    return true;
  }
  if (req.method === 'GET' && req.url === '/health') {
    res.writeHead(200).end();
    return true;
  }
  if (req.method === 'POST' && req.url === '/release') {
    for (const r of held.splice(0)) r.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    for (const h of heldSockets.splice(0)) h.socket.destroy();
    res.writeHead(200).end();
    return true;
  }
  return false;
}

if (mode === 'tcp') {
  const tcp = createTcpServer((socket) => {
    socket.on('error', () => {});
    socket.once('data', (received: Buffer) => heldSockets.push({ socket, received }));
  });
  tcp.listen(port, '127.0.0.1');
  createServer((req, res) => {
    if (!control(req, res)) res.writeHead(404).end();
  }).listen(controlPort, '127.0.0.1');
} else {
  const server = createServer((req, res) => {
    if (control(req, res)) return;
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      try {
        (res as ServerResponse & { body?: unknown }).body = JSON.parse(Buffer.concat(parts).toString('utf8'));
      } catch {
        // keep it anyway
      }
      held.push(res);
    });
  });
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;
  server.requestTimeout = 0;
  server.listen(port, '127.0.0.1');
}
process.on('SIGTERM', () => process.exit(0));
