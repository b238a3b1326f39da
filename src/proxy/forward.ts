/**
 * Scheduling + forwarding of one admitted request, with retries on connection failures that
 * happen before any byte reached the client (SPEC §2). The answer streams back chunk by chunk
 * with backpressure; a client disconnect aborts the upstream request at once; the endpoint's
 * in-flight count is released exactly once whatever happens.
 *
 * Prefill/decode (SPEC §7.4): when the profile handler decided `prefill-decode`, the connector of
 * the decision shapes the decode request (sidecar header) or first runs a prefill leg through
 * `sendPrefill` (nixlv2, shared-storage) — the prefill endpoint is in flight only for its leg, the
 * decode endpoint for the whole request; a client disconnect aborts whichever leg runs and no next
 * leg starts. A decode leg prepared by a prefill leg is reused when the decode endpoint is retried.
 * The decision is counted once per request.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { errors as undiciErrors } from 'undici';
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Pool } from '../datalayer/pool.js';
import type { Disaggregation, SchedulingRequest } from '../scheduling/framework.js';
import type { Clock } from '../util/clock.js';
import { errorBody, sendError } from './errors.js';
import { clientResponseHeaders, upstreamRequestHeaders } from './headers.js';
import type { ProxyMetrics, ProxyRuntime } from './runtime.js';
import type { ModelRequestMetrics } from '../metrics/metrics.js';
import type { Upstreams } from './upstreams.js';
import { SseUsageScanner, usageFromJson, type Usage } from './usage.js';
import { connectorFor } from './connectors/index.js';
import { rewriteJsonCachedTokens, SseCachedTokensRewriter } from './connectors/cached-tokens.js';
import type { DecodeLeg, PdStep, PrefillLegResult, SendPrefill } from './connectors/types.js';

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
/** A JSON decode answer whose cached_tokens is rewritten is held whole up to this size (then relayed as is). */
const MAX_JSON_REWRITE = 16 << 20;
/** Bytes of a prefill answer kept (a one-token answer; anything longer is read and dropped). */
const MAX_PREFILL_ANSWER = 4 << 20;

type AttemptResult =
  | { kind: 'done'; status: number }
  /** `prepared`: the decode leg a prefill leg produced, for the next attempt to reuse. */
  | { kind: 'retry'; error: string; prepared?: DecodeLeg };

/** What one attempt sends: the client's request, a P/D decision to carry out, or a prepared decode leg. */
type AttemptPlan = Disaggregation | DecodeLeg | undefined;

const isDecodeLeg = (plan: AttemptPlan): plan is DecodeLeg => plan !== undefined && 'body' in plan;

/** Returns the status sent to the client (0 when the client went away first). */
export async function forward(ctx: ForwardContext): Promise<number> {
  const { rt, pool, metrics, res, requestId } = ctx;
  // A client that left while its request was queued (and whose close we could not observe) costs nothing.
  if (res.destroyed || ctx.req.socket?.destroyed) return 0;
  const retries = rt.config.server.upstream.retries;
  let candidates: readonly Endpoint[] = pool.endpoints;
  let lastError = '';
  let decisionCounted = false;
  let prepared: DecodeLeg | undefined;
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
    const pd = outcome.result.disaggregation;
    if (pd !== undefined && !decisionCounted) {
      decisionCounted = true;
      metrics.disaggDecision(ctx.sreq.model, pd.decision);
    }
    const r = await attemptOn(ctx, ep, prepared ?? pd);
    if (r.kind === 'done') return r.status;
    if (r.prepared !== undefined) prepared = r.prepared;
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

async function attemptOn(ctx: ForwardContext, ep: Endpoint, plan: AttemptPlan): Promise<AttemptResult> {
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
    let leg: DecodeLeg | undefined;
    let prepared: DecodeLeg | undefined;
    if (isDecodeLeg(plan)) leg = plan;
    else if (plan?.prefill !== undefined) {
      const connector = connectorFor(plan.connector);
      const input = { raw: ctx.raw, body: ctx.sreq.body, api: ctx.sreq.api, prefill: plan.prefill };
      const pending = connector.carryOut(input, prefillSender(ctx, plan.prefill, ac.signal));
      const step: PdStep = pending instanceof Promise ? await pending : pending;
      if (step.kind === 'aborted' || clientGone || res.destroyed) return { kind: 'done', status: 0 };
      if (step.kind === 'reply') return { kind: 'done', status: relayPrefillReply(ctx, step) };
      if (step.warning !== undefined) {
        ctx.logger.warn({ requestId: ctx.requestId, endpoint: ep.name, connector: connector.name, reason: step.warning }, 'P/D degraded');
      }
      leg = step.leg;
      if (connector.runsPrefill) prepared = leg;
    }

    const upstreamHeaders = upstreamRequestHeaders(req.headers, ctx.requestId);
    if (leg?.headers !== undefined) Object.assign(upstreamHeaders, leg.headers);
    const cachedTokens = leg?.cachedTokens;
    // The answer is rewritten, so it must come back uncompressed.
    if (cachedTokens !== undefined) upstreamHeaders['accept-encoding'] = 'identity';
    let up;
    try {
      up = await ctx.upstreams.get(ep).request({
        method: 'POST',
        path: req.url ?? '/',
        headers: upstreamHeaders,
        body: leg?.body ?? ctx.raw,
        signal: ac.signal,
      });
    } catch (err) {
      if (clientGone || res.destroyed) return { kind: 'done', status: 0 };
      if (isConnectError(err)) {
        return prepared !== undefined
          ? { kind: 'retry', error: (err as Error).message, prepared }
          : { kind: 'retry', error: (err as Error).message };
      }
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
    const encoding = up.headers['content-encoding'];
    const rewrite =
      cachedTokens !== undefined && status >= 200 && status <= 299 && (encoding === undefined || encoding === 'identity');
    if (rewrite) delete headers['content-length'];
    const sseRewriter = rewrite && sse ? new SseCachedTokensRewriter(cachedTokens) : undefined;
    // A JSON answer whose usage is rewritten goes out whole, with its new length, once complete.
    let holdJson = rewrite && !sse;
    if (!holdJson) res.writeHead(status, headers);

    const scanner = sse ? new SseUsageScanner() : undefined;
    let captured: Buffer[] | undefined = !sse && (status === 200 || holdJson) ? [] : undefined;
    let capturedBytes = 0;
    let first = true;
    try {
      for await (const chunk of up.body as AsyncIterable<Buffer>) {
        if (first) {
          first = false;
          modelMetrics.ttft((clock.now() - ctx.started) / 1000, ctx.stream);
        }
        if (holdJson) {
          if (capturedBytes + chunk.length <= MAX_JSON_REWRITE) {
            captured!.push(chunk);
            capturedBytes += chunk.length;
            continue;
          }
          // Too large to hold: relay it unchanged from here on.
          holdJson = false;
          res.writeHead(status, headers);
          for (const c of captured!) res.write(c);
          captured = undefined;
        }
        if (scanner) scanner.feed(chunk);
        else if (captured && capturedBytes + chunk.length <= MAX_JSON_CAPTURE) {
          captured.push(chunk);
          capturedBytes += chunk.length;
        }
        const out = sseRewriter ? sseRewriter.push(chunk) : chunk;
        if (out.length === 0) continue;
        if (!res.write(out)) {
          if (res.destroyed) break;
          await drainOrClose(res);
        }
      }
    } catch (err) {
      if (clientGone || res.destroyed) return { kind: 'done', status: 0 };
      // The upstream failed mid-answer: the status line is gone, so end the stream visibly.
      ctx.logger.warn({ requestId: ctx.requestId, endpoint: ep.name, err: (err as Error).message }, 'upstream failed mid-response');
      if (!res.headersSent) {
        sendError(res, 502, `upstream ${ep.name} failed mid-response: ${(err as Error).message}`, { requestId: ctx.requestId });
      } else if (sse) {
        res.end(`data: ${errorBody(502, `upstream ${ep.name} failed mid-stream: ${(err as Error).message}`)}\n\n`);
      } else res.destroy();
      return { kind: 'done', status: 502 };
    }
    if (clientGone || res.destroyed) return { kind: 'done', status: 0 };
    let whole: Buffer | undefined;
    if (holdJson) {
      whole = rewriteJsonCachedTokens(Buffer.concat(captured!, capturedBytes), cachedTokens!);
      headers['content-length'] = String(whole.length);
      res.writeHead(status, headers);
      res.end(whole);
    } else {
      const rest = sseRewriter?.end();
      if (rest !== undefined && rest.length > 0) res.write(rest);
      res.end();
    }
    const usage: Usage | undefined = scanner
      ? scanner.usage
      : whole
        ? usageFromJson(whole)
        : captured
          ? usageFromJson(Buffer.concat(captured, capturedBytes))
          : undefined;
    if (usage) modelMetrics.tokens(usage.promptTokens, usage.completionTokens);
    return { kind: 'done', status };
  } finally {
    release();
    res.off('close', onClose);
  }
}

/**
 * The prefill leg of a connector: same path and headers as the client request (uncompressed answer),
 * the prefill endpoint in flight for exactly the leg, aborted with the attempt's signal.
 */
function prefillSender(ctx: ForwardContext, prefill: Endpoint, signal: AbortSignal): SendPrefill {
  return async (body: Buffer): Promise<PrefillLegResult> => {
    const { pool } = ctx;
    if (signal.aborted) return { kind: 'aborted' };
    pool.acquire(prefill);
    try {
      const headers = upstreamRequestHeaders(ctx.req.headers, ctx.requestId);
      headers['accept-encoding'] = 'identity';
      const up = await ctx.upstreams.get(prefill).request({ method: 'POST', path: ctx.req.url ?? '/', headers, body, signal });
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of up.body as AsyncIterable<Buffer>) {
        if (size + chunk.length <= MAX_PREFILL_ANSWER) {
          chunks.push(chunk);
          size += chunk.length;
        }
      }
      return { kind: 'answer', status: up.statusCode, headers: up.headers, body: Buffer.concat(chunks, size) };
    } catch (err) {
      if (signal.aborted) return { kind: 'aborted' };
      const e = err as Error & { code?: string };
      return { kind: 'failed', error: e.code !== undefined ? `${e.code}: ${e.message}` : e.message };
    } finally {
      pool.release(prefill);
    }
  };
}

/** A prefill answer the client gets instead of a decode answer (a prefill 4xx). Returns the status. */
function relayPrefillReply(ctx: ForwardContext, step: Extract<PdStep, { kind: 'reply' }>): number {
  const headers = clientResponseHeaders(step.headers);
  headers['x-request-id'] = ctx.requestId;
  headers['content-length'] = String(step.body.length);
  ctx.res.writeHead(step.status, headers);
  ctx.res.end(step.body);
  return step.status;
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
