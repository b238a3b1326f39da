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
  /** The /metrics page served; a number is answered as that HTTP status (a broken scrape). */
  metrics: string | number;
  /** Delay before each /metrics answer, ms (a model server busy enough to answer slowly). */
  metricsDelayMs?: number;
  /** /metrics gets no answer at all (a server cut off, frozen): its requests are held until the connection closes. */
  metricsSilent?: boolean;
  /** Requests being answered right now, and the most seen at once. */
  active: number;
  maxActive: number;
  close(): Promise<void>;
}

export const vllmPage = (waiting = 0, running = 0, kv = 0.1) =>
  `vllm:num_requests_waiting ${waiting}\nvllm:num_requests_running ${running}\nvllm:kv_cache_usage_perc ${kv}\n`;

/** Answers JSON after `ms` (to hold requests in flight). */
export const slowJson =
  (ms: number): Behaviour =>
  (r, res) =>
    setTimeout(() => okJson(r, res), ms);

export async function startFakeBackend(behave: Behaviour = okJson): Promise<FakeBackend> {
  const fb: FakeBackend = {
    port: 0,
    received: [],
    behave,
    metrics: vllmPage(),
    active: 0,
    maxActive: 0,
    close: async () => undefined,
  };
  const server = http.createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/metrics') {
        if (fb.metricsSilent) return;
        const page = fb.metrics;
        const answer = (): void => {
          if (typeof page === 'number') res.writeHead(page).end('metrics unavailable');
          else res.writeHead(200, { 'content-type': 'text/plain' }).end(page);
        };
        if (fb.metricsDelayMs) setTimeout(answer, fb.metricsDelayMs);
        else answer();
        return;
      }
      const r: Received = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString() };
      fb.received.push(r);
      fb.active++;
      fb.maxActive = Math.max(fb.maxActive, fb.active);
      res.once('close', () => fb.active--);
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
