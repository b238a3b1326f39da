/**
 * Baseline for the overhead benchmark, not Sluice: the least a Node gateway does per request — a
 * node:http server that reads the body, picks the next backend round-robin and streams the answer
 * back through an undici pool (`stream()`, keep-alive, no body parsing, no scheduling, no metrics).
 * Sluice ÷ this row is what Sluice's own work costs; this row ÷ nginx is what Node costs.
 *
 *   node --import tsx bench/lib/node-proxy.ts PORT BACKEND_PORT [BACKEND_PORT ...]
 */
import { createServer, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http';
import { Pool } from 'undici';

const [port, ...backendPorts] = process.argv.slice(2).map(Number);
if (!port || backendPorts.length === 0 || backendPorts.some((p) => !p)) {
  console.error('usage: node-proxy.ts PORT BACKEND_PORT [BACKEND_PORT ...]');
  process.exit(2);
}
const pools = backendPorts.map((p) => new Pool(`http://127.0.0.1:${p}`, { pipelining: 1, keepAliveTimeout: 30_000, connections: 128 }));
let next = 0;

function forward(req: IncomingMessage, res: ServerResponse, body: Buffer): void {
  const pool = pools[next++ % pools.length]!;
  pool
    .stream(
      { path: req.url ?? '/', method: 'POST', headers: { 'content-type': req.headers['content-type'] ?? 'application/json' }, body },
      ({ statusCode, headers }) => {
        const out: OutgoingHttpHeaders = {};
        // Single-valued in practice; the type allows repeats.
        for (const name of ['content-type', 'content-length', 'cache-control'] as const) {
          const value = headers[name];
          if (value !== undefined) out[name] = Array.isArray(value) ? value.join(', ') : value;
        }
        res.writeHead(statusCode, out);
        return res;
      },
    )
    .catch((err: Error) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(err.message);
    });
}

createServer((req, res) => {
  if (req.method !== 'POST') {
    res.writeHead(req.url === '/health' ? 200 : 404).end();
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => forward(req, res, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
}).listen(port, '127.0.0.1');
process.on('SIGTERM', () => process.exit(0));
