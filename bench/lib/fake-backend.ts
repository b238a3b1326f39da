/**
 * A fast fake OpenAI backend for overhead benchmarks (not a model simulator: no queue, no latency
 * model). JSON answers at once; SSE answers as a few chunks 2 ms apart. Serves vLLM-style
 * /metrics so a gateway sees it as healthy and idle, and /bench/stats (requests served).
 *
 *   node --import tsx bench/lib/fake-backend.ts PORT NAME [--saturated]
 *
 * `--saturated` reports 50 waiting requests in /metrics, so a gateway with flow control holds
 * every request in its queue (the gateway queue-memory benchmark). POST /bench/saturated with
 * body `0` or `1` switches it at run time.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';

export const MODEL = 'bench-model';
/** Tokens of an SSE answer; a few chunks, a short gap between them like a fast model. */
export const SSE_TOKENS = ['Hello', ' from', ' the', ' backend'];
export const SSE_CHUNK_GAP_MS = 2;

export function runBackend(port: number, name: string, saturatedAtStart = false): void {
  let inFlight = 0;
  let served = 0;
  let seq = 0;
  let saturated = saturatedAtStart;

  const metricsPage = (): string =>
    [
      '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
      '# TYPE vllm:num_requests_waiting gauge',
      `vllm:num_requests_waiting{model_name="${MODEL}"} ${saturated ? 50 : 0}.0`,
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      `vllm:num_requests_running{model_name="${MODEL}"} ${inFlight}.0`,
      '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
      '# TYPE vllm:kv_cache_usage_perc gauge',
      `vllm:kv_cache_usage_perc{model_name="${MODEL}"} 0.1`,
      '',
    ].join('\n');

  const chunk = (id: string, delta: object, finish: string | null, usage?: object): string =>
    `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model: MODEL, choices: usage ? [] : [{ index: 0, delta, finish_reason: finish }], ...(usage ? { usage } : {}) })}\n\n`;

  const handleCompletion = (body: string, res: ServerResponse): void => {
    let request: { stream?: boolean; stream_options?: { include_usage?: boolean } } = {};
    try {
      request = JSON.parse(body) as typeof request;
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":{"message":"bad json"}}');
      return;
    }
    const id = `chatcmpl-${name}-${++seq}`;
    inFlight++;
    const done = (): void => {
      inFlight--;
      served++;
    };
    const usage = { prompt_tokens: 8, completion_tokens: SSE_TOKENS.length, total_tokens: 8 + SSE_TOKENS.length };
    if (request.stream !== true) {
      res.writeHead(200, { 'content-type': 'application/json', 'x-inference-pod': name });
      res.end(
        JSON.stringify({
          id,
          object: 'chat.completion',
          created: 0,
          model: MODEL,
          choices: [{ index: 0, message: { role: 'assistant', content: `hi from ${name}` }, finish_reason: 'stop' }],
          usage,
        }),
      );
      done();
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-inference-pod': name });
    let i = 0;
    const timer = setInterval(() => {
      if (i < SSE_TOKENS.length) {
        res.write(chunk(id, i === 0 ? { role: 'assistant', content: SSE_TOKENS[i] } : { content: SSE_TOKENS[i] }, null));
        i++;
        return;
      }
      clearInterval(timer);
      let tail = chunk(id, {}, 'stop');
      if (request.stream_options?.include_usage === true) tail += chunk(id, {}, null, usage);
      res.end(`${tail}data: [DONE]\n\n`);
      done();
    }, SSE_CHUNK_GAP_MS);
    res.on('close', () => {
      if (!res.writableEnded) {
        clearInterval(timer);
        done();
      }
    });
  };

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = req.url ?? '/';
    if (req.method === 'GET') {
      req.resume();
      if (url === '/metrics') res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(metricsPage());
      else if (url === '/health') res.writeHead(200).end();
      else if (url === '/v1/models')
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [{ id: MODEL, object: 'model', owned_by: name }] }));
      else if (url === '/bench/stats') res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ served, inFlight }));
      else res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found"}}');
      return;
    }
    if (req.method === 'POST' && url === '/bench/saturated') {
      let text = '';
      req.on('data', (c: Buffer) => (text += c.toString()));
      req.on('end', () => {
        saturated = text.trim() === '1';
        res.writeHead(200).end();
      });
      return;
    }
    if (req.method === 'POST' && url.startsWith('/v1/chat/completions')) {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => handleCompletion(Buffer.concat(parts).toString('utf8'), res));
      return;
    }
    req.resume();
    res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found"}}');
  });
  server.keepAliveTimeout = 60_000;
  server.listen(port, '127.0.0.1', () => process.stdout.write(`listening ${port}\n`));

  // Do not outlive the bench if it dies without cleaning up (our parent becomes init).
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) process.exit(0);
  }, 1000).unref();
  process.on('SIGTERM', () => process.exit(0));
}

if (process.argv[1] !== undefined && /fake-backend\.ts$/.test(process.argv[1])) {
  const [port, name] = process.argv.slice(2);
  runBackend(Number(port), name ?? `backend-${port}`, process.argv.includes('--saturated'));
}
