/**
 * A scriptable OpenAI-ish model server for fault and header tests: serves a minimal vLLM /metrics
 * page, records what it receives, and behaves per the `behave` function.
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Received {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

export type Behaviour = (req: Received, res: ServerResponse) => void;

export const okJson: Behaviour = (r, res) => {
  const body = JSON.stringify({
    id: 'cmpl-1',
    object: 'chat.completion',
    model: 'm',
    choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
  });
  res.writeHead(200, { 'content-type': 'application/json', 'x-backend-url': r.url });
  res.end(body);
};

export interface FakeBackend {
  port: number;
  received: Received[];
  behave: Behaviour;
  close(): Promise<void>;
}

export async function startFakeBackend(behave: Behaviour = okJson): Promise<FakeBackend> {
  const fb: FakeBackend = { port: 0, received: [], behave, close: async () => undefined };
  const server = http.createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/metrics') {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end('vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n');
        return;
      }
      const r: Received = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString() };
      fb.received.push(r);
      fb.behave(r, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  fb.port = (server.address() as AddressInfo).port;
  fb.close = () =>
    new Promise((r) => {
      server.closeAllConnections();
      server.close(() => r());
    });
  return fb;
}
