/**
 * Scheduling + forwarding of one admitted request, with retries on connection failures that
 * happen before any byte reached the client (SPEC §2). The answer streams back chunk by chunk
 * with backpressure; a client disconnect aborts the upstream request at once; the endpoint's
 * in-flight count is released exactly once whatever happens.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { errors as undiciErrors } from 'undici';
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Pool } from '../datalayer/pool.js';
import type { SchedulingRequest } from '../scheduling/framework.js';
import type { Clock } from '../util/clock.js';
import { errorBody, sendError } from './errors.js';
import { clientResponseHeaders, upstreamRequestHeaders } from './headers.js';
import type { ProxyMetrics, ProxyRuntime } from './runtime.js';
import type { ModelRequestMetrics } from '../metrics/metrics.js';
import type { Upstreams } from './upstreams.js';
import { SseUsageScanner, usageFromJson, type Usage } from './usage.js';

export interface ForwardContext {
  req: IncomingMessage;
  res: ServerResponse;
  raw: Buffer;
  sreq: SchedulingRequest;
  stream: boolean;
  requestId: string;
  started: number;
  rt: ProxyRuntime;
  pool: Pool;
  upstreams: Upstreams;
  metrics: ProxyMetrics;
  modelMetrics: ModelRequestMetrics;
  logger: Logger;
  clock: Clock;
}

/** Errors that prove the request never reached the model server, so another endpoint may take it. */
const CONNECT_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EPIPE',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

function isConnectError(err: unknown): boolean {
  const code = (err as { code?: string }).code;
  return code !== undefined && CONNECT_ERROR_CODES.has(code);
}

const MAX_JSON_CAPTURE = 1 << 20;

type AttemptResult = { kind: 'done'; status: number } | { kind: 'retry'; error: string };

/** Returns the status sent to the client (0 when the client went away first). */
export async function forward(ctx: ForwardContext): Promise<number> {
  const { rt, pool, metrics, res, requestId } = ctx;
  // A client that left while its request was queued (and whose close we could not observe) costs nothing.
  if (res.destroyed || ctx.req.socket?.destroyed) return 0;
  const retries = rt.config.server.upstream.retries;
  let candidates: readonly Endpoint[] = pool.endpoints;
  let lastError = '';
  for (let attempt = 0; ; attempt++) {
    const t0 = performance.now();
    const outcome = rt.scheduler.schedule(ctx.sreq, candidates);
    metrics.schedulerDuration((performance.now() - t0) / 1000);
    if (!outcome.ok) {
      metrics.schedulerAttempt('failure', '');
      if (attempt > 0) {
        sendError(res, 502, `upstream connection failed and no other endpoint is eligible: ${lastError}`, { requestId });
        return 502;
      }
      if (outcome.reason === 'no-endpoints') {
        sendError(res, 503, outcome.message, { droppedReason: 'rejected-no-endpoints', requestId });
        return 503;
      }
      sendError(res, 429, outcome.message, { droppedReason: 'rejected-saturated', requestId });
      return 429;
    }
    const ep = outcome.target;
    metrics.schedulerAttempt('success', ep.name);
    const r = await attemptOn(ctx, ep);
    if (r.kind === 'done') return r.status;
    lastError = `${ep.name}: ${r.error}`;
    metrics.upstreamRetry(ep.name);
    ctx.logger.warn({ requestId, endpoint: ep.name, err: r.error, attempt }, 'upstream connection failed');
    if (attempt >= retries) {
      sendError(res, 502, `upstream connection failed after ${attempt + 1} attempt(s): ${lastError}`, { requestId });
      return 502;
    }
    candidates = candidates.filter((c) => c !== ep);
  }
}

async function attemptOn(ctx: ForwardContext, ep: Endpoint): Promise<AttemptResult> {
  const { req, res, pool, clock, modelMetrics } = ctx;
  const ac = new AbortController();
  let clientGone = false;
  const onClose = () => {
    if (!res.writableFinished) {
      clientGone = true;
      ac.abort();
    }
  };
  res.once('close', onClose);
  pool.acquire(ep);
  let released = false;
  const release = () => {
    if (!released) {
      released = true;
      pool.release(ep);
    }
  };
  try {
    let up;
    try {
      up = await ctx.upstreams.get(ep).request({
        method: 'POST',
        path: req.url ?? '/',
        headers: upstreamRequestHeaders(req.headers, ctx.requestId),
        body: ctx.raw,
        signal: ac.signal,
      });
    } catch (err) {
      if (clientGone || res.destroyed) return { kind: 'done', status: 0 };
      if (isConnectError(err)) return { kind: 'retry', error: (err as Error).message };
      if (err instanceof undiciErrors.HeadersTimeoutError) {
        sendError(res, 504, `upstream ${ep.name} did not answer in time`, { requestId: ctx.requestId });
        return { kind: 'done', status: 504 };
      }
      sendError(res, 502, `upstream ${ep.name} failed: ${(err as Error).message}`, { requestId: ctx.requestId });
      return { kind: 'done', status: 502 };
    }

    const status = up.statusCode;
    const headers = clientResponseHeaders(up.headers);
    headers['x-request-id'] = ctx.requestId;
    for (const hook of ctx.rt.responseHooks) {
      hook.onResponseHeaders(ctx.sreq, ep, (name, value) => (headers[name.toLowerCase()] = value));
    }
    const contentType = up.headers['content-type'];
    const sse = typeof contentType === 'string' && contentType.startsWith('text/event-stream');
    res.writeHead(status, headers);

    const scanner = sse ? new SseUsageScanner() : undefined;
    const captured: Buffer[] | undefined = !sse && status === 200 ? [] : undefined;
    let capturedBytes = 0;
    let first = true;
    try {
      for await (const chunk of up.body as AsyncIterable<Buffer>) {
        if (first) {
          first = false;
          modelMetrics.ttft((clock.now() - ctx.started) / 1000, ctx.stream);
        }
        if (scanner) scanner.feed(chunk);
        else if (captured && capturedBytes + chunk.length <= MAX_JSON_CAPTURE) {
          captured.push(chunk);
          capturedBytes += chunk.length;
        }
        if (!res.write(chunk)) {
          if (res.destroyed) break;
          await drainOrClose(res);
        }
      }
    } catch (err) {
      if (clientGone || res.destroyed) return { kind: 'done', status: 0 };
      // The upstream failed mid-answer: the status line is gone, so end the stream visibly.
      ctx.logger.warn({ requestId: ctx.requestId, endpoint: ep.name, err: (err as Error).message }, 'upstream failed mid-response');
      if (sse) {
        res.end(`data: ${errorBody(502, `upstream ${ep.name} failed mid-stream: ${(err as Error).message}`)}\n\n`);
      } else res.destroy();
      return { kind: 'done', status: 502 };
    }
    if (clientGone || res.destroyed) return { kind: 'done', status: 0 };
    res.end();
    const usage: Usage | undefined = scanner ? scanner.usage : captured ? usageFromJson(Buffer.concat(captured, capturedBytes)) : undefined;
    if (usage) modelMetrics.tokens(usage.promptTokens, usage.completionTokens);
    return { kind: 'done', status };
  } finally {
    release();
    res.off('close', onClose);
  }
}

function drainOrClose(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}
