/**
 * Baseline for the gateway queue-memory measurement: a bare node:http server that reads and parses
 * each POST body and then holds the request (no answer) — what any Node gateway pays per waiting
 * request before its own state. GET /held returns the count; POST /release answers them all.
 *
 *   node --expose-gc --import tsx --import bench/lib/mem-probe.ts bench/lib/hold-server.ts PORT
 */
import { createServer, type ServerResponse } from 'node:http';

const held: ServerResponse[] = [];
const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/held') {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ held: held.length }));
    return;
  }
  if (req.method === 'GET' && req.url === '/health') {
    res.writeHead(200).end();
    return;
  }
  if (req.method === 'POST' && req.url === '/release') {
    for (const r of held.splice(0)) r.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    res.writeHead(200).end();
    return;
  }
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
server.listen(Number(process.argv[2]), '127.0.0.1');
process.on('SIGTERM', () => process.exit(0));
