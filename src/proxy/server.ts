/**
 * The OpenAI API port. Request path, top to bottom (SPEC §2): route → body limit → JSON → OpenAI
 * validation → objective/priority + fairness id → admission → scheduling → forward with retries →
 * stream back. Plain node:http rather than a framework: this is the per-request hot path, and
 * streaming with backpressure and abort-on-disconnect is simplest on the raw objects.
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Pool } from '../datalayer/pool.js';
import type { ApiKind } from '../scheduling/framework.js';
import type { Clock } from '../util/clock.js';
import type { RequestStage, SaturationSnapshot } from '../metrics/metrics.js';
import { BodyTooLargeError, declaresMoreThan, discardRest, readBody, type BodyTally } from './body.js';
import { GatewayError, answerClientError, noteSentError, rawErrorResponse, requestIdOf, sendError, sendGatewayError, sentError, sseErrorEnd } from './errors.js';
import { FAIRNESS_HEADERS, OBJECTIVE_HEADERS, REQUEST_TTL_HEADERS, SLO_TTFT_HEADERS, firstHeader, textHeader } from './headers.js';
import { API_ROUTES, isInvalid, parseOpenAIRequest, type InvalidRequest } from './openai.js';
import { dropParsedForm, restoreParsedForm, schedulingRequest } from './scheduling-request.js';
import { forward, upstreamFailureLog, type ForwardContext } from './forward.js';
import type { ProxyMetrics, ProxyRuntime } from './runtime.js';
import type { Upstreams } from './upstreams.js';
import type { ModelsCache } from './models.js';
import type { FlowController } from '../flowcontrol/controller.js';
import type { FlowOutcome, FlowRequest, FlowTicket, OutcomeCause } from '../flowcontrol/types.js';
import { interruptWatcher, trackResponse, unwatchClient, watchClient, watchPipelined, type ClientWatcher } from './client-watch.js';
import { RefusalLog } from './refusal-log.js';
import type { SpellLog } from './spell-log.js';
import { outcomeToHttp } from '../flowcontrol/outcomes.js';
import { parseSloTtftHeader } from '../flowcontrol/policies/index.js';
import { parseRequestTtlHeader } from '../flowcontrol/request-ttl.js';
import { AgeList } from '../util/age-list.js';
import { candidatesFor, homeOf, type StoredResponses } from './stored-responses.js';

export interface ApiServerDeps {
  runtime: () => ProxyRuntime;
  pool: Pool;
  upstreams: Upstreams;
  metrics: ProxyMetrics;
  models: ModelsCache;
  logger: Logger;
  clock: Clock;
  /** true once at least one endpoint has fresh metrics */
  isReady: () => boolean;
  /** The pool's saturation now (what /metrics shows): named in the answer of a request that timed out in the queue. */
  saturation?: () => SaturationSnapshot | undefined;
  /** Which server holds each stored Responses API answer relayed; kept across reloads. */
  storedResponses: StoredResponses;
}

export class ApiServer {
  readonly server: http.Server;
  /** Requests being handled right now (for graceful drain). */
  active = 0;
  /** Requests begun so far (the drain's quiet period watches it). */
  begun = 0;
  draining = false;
  /** Draining: each connection's answer made its last (`Connection: close`), see closeWith. */
  private closingAnswers: WeakMap<Duplex, ServerResponse> | undefined = undefined;
  private idleWaiters: (() => void)[] = [];
  /** Sluice's own refusals at warn level (debug logging is not needed to see them). */
  readonly refusals: RefusalLog;
  /** Requests that failed at a model server, at warn level: the first of each endpoint and kind in full, then sums (forward.ts). */
  readonly upstreamFailures: SpellLog;
  /** Valid API requests not yet ended, oldest first, for /debug/requests (a request hung on a frozen server shows there). */
  private readonly inFlight = new AgeList<ForwardContext>();
  /** API requests whose body is still arriving: the end of the shutdown grace period answers them too. */
  private readonly receiving = new AgeList<ReceivingBody>();
  /** Node's `requestTimeout` as the server was started with (a restart-only setting). */
  private readonly requestTimeoutMs: number;

  /** The bytes received so far of the API requests' bodies still arriving. */
  readonly uploads: BodyTally = { bytes: 0 };

  /** How many API requests' bodies are still arriving. */
  get receivingBodies(): number {
    return this.receiving.size;
  }

  constructor(private readonly deps: ApiServerDeps) {
    this.refusals = new RefusalLog(deps.logger);
    this.upstreamFailures = upstreamFailureLog(deps.logger);
    const { requestHeadersTimeout, requestTimeout } = deps.runtime().config.server;
    this.requestTimeoutMs = Math.max(requestTimeout, requestHeadersTimeout);
    // Slowloris guard: clients that dribble their headers or body are cut off (408). Node checks
    // these every connectionsCheckingInterval, so that follows the shorter time-out.
    this.server = http.createServer(
      {
        keepAliveTimeout: 65_000,
        headersTimeout: requestHeadersTimeout,
        requestTimeout: this.requestTimeoutMs,
        connectionsCheckingInterval: Math.max(50, Math.min(30_000, Math.floor(requestHeadersTimeout / 2))),
        // Routing never reads Host; Node's own refusal of a request without one has no §5 body.
        requireHostHeader: false,
      },
      (req, res) => this.handle(req, res),
    );
    // `Expect: 100-continue` (curl sends it for bodies over 1 KiB): a body declared over the limit is
    // refused before the client sends it (413, as nginx does), not after it was uploaded for nothing.
    this.server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
      if (!declaresMoreThan(req, this.deps.runtime().config.server.bodyLimit)) res.writeContinue();
      this.handle(req, res);
    });
    // Node's own answers to these carry no §5 body (417), or there is none at all (CONNECT).
    this.server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
      this.begin(req, res);
      this.deps.metrics.requestRejected('expectation_failed');
      sendError(res, 417, `unsupported expectation: ${String(req.headers.expect).slice(0, 64)}`, { requestId: requestIdOf(req), close: true });
    });
    this.server.on('connect', (req: IncomingMessage, socket: Duplex) => {
      socket.on('error', () => socket.destroy());
      this.deps.metrics.requestRejected('unknown_route');
      socket.end(rawErrorResponse(404, 'Not Found', `no route for CONNECT ${String(req.url).slice(0, 256)}`, requestIdOf(req)));
    });
    this.server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
      const why = answerClientError(err, socket, this.receivingRequestId);
      if (why !== undefined) this.deps.metrics.requestRejected(why);
    });
  }

  /** The id of the request whose body is still arriving for `res` (Node's 408 mid-body answers in its stead). */
  private readonly receivingRequestId = (res: ServerResponse): string | undefined => {
    for (let r = this.receiving.oldest; r !== undefined; r = r.newer) if (r.res === res) return r.requestId;
    return undefined;
  };

  /** Resolves when no request is being handled. */
  whenIdle(): Promise<void> {
    if (this.active === 0) return Promise.resolve();
    return new Promise((r) => this.idleWaiters.push(r));
  }

  /** Called once per request when its response closes (bound once: no closure per request). */
  private readonly requestEnded = (): void => {
    if (--this.active === 0 && this.idleWaiters.length > 0) {
      const w = this.idleWaiters;
      this.idleWaiters = [];
      for (const f of w) f();
    }
  };

  /**
   * A request is being handled until its response closes (graceful drain waits for it). A response
   * waiting behind an earlier one on its connection has no socket yet: if the client leaves first,
   * it would never close, so the connection is watched for it.
   */
  private begin(req: IncomingMessage, res: ServerResponse): number {
    this.active++;
    this.begun++;
    trackResponse(res, this.requestEnded);
    const pipelined = res.socket === null ? watchPipelined(req.socket, res) : 0;
    // Numbered per connection, so the drain knows its last answer (closeWith).
    const conn = req.socket as Numbered;
    (res as Numbered)[kAnswerNo] = conn[kAnswerNo] = (conn[kAnswerNo] ?? 0) + 1;
    return pipelined;
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const pipelined = this.begin(req, res);
    // Node keeps connections alive while its server closes: a client would send its next request
    // on one the end of the drain then cuts. The last answer on each connection during the drain
    // says `Connection: close`.
    if (this.draining) this.closeWith(res);
    // Node reads and hands over every request a client pipelines, however many answers are still
    // owed: without a cap one connection could hold any number of requests in flight (and queue
    // room), past any limit on connections in front of the port. No client library pipelines.
    if (pipelined > 0) {
      const max = this.deps.runtime().config.server.maxPipelinedRequests;
      if (max > 0 && pipelined > max) return this.refusePipelined(req, res, max);
    }
    let url = req.url ?? '/';
    // Absolute form (`POST http://host/v1/…`), which HTTP/1.1 servers must accept: routed and forwarded as origin form.
    if (url.charCodeAt(0) !== 0x2f) url = req.url = originForm(url);
    const q = url.indexOf('?');
    const path = q < 0 ? url : url.slice(0, q);
    if (req.method === 'POST') {
      const api = API_ROUTES[path];
      if (api !== undefined) {
        void this.handleApi(req, res, api);
        return;
      }
    } else if (req.method === 'GET' || req.method === 'HEAD') {
      // Every answer of the API port carries an x-request-id (SPEC §2), a probe's too.
      if (path === '/health') return json(res, 200, '{"status":"ok"}', requestIdOf(req));
      if (path === '/ready') {
        const ready = !this.draining && this.deps.isReady();
        return json(res, ready ? 200 : 503, ready ? '{"status":"ready"}' : '{"status":"not ready"}', requestIdOf(req));
      }
      if (path === '/v1/models') {
        const requestId = requestIdOf(req);
        this.deps.models
          .list(firstHeader(req.headers, ['authorization']), requestId)
          .then((a) => json(res, a.status, a.body, requestId, a.contentType))
          .catch(() => sendError(res, 502, 'could not list models from the pool', { requestId }));
        return;
      }
    }
    this.deps.metrics.requestRejected('unknown_route');
    sendError(res, 404, `no route for ${req.method} ${path}`, { requestId: requestIdOf(req) });
  }

  /** A request pipelined past `server.maxPipelinedRequests`: refused in its turn, the connection kept. */
  private refusePipelined(req: IncomingMessage, res: ServerResponse, max: number): void {
    const requestId = requestIdOf(req);
    this.deps.metrics.requestRejected('too_many_pipelined');
    sendError(res, 429, `more than server.maxPipelinedRequests (${max}) requests pipelined on one connection are waiting for their answers: wait for them, or send on more connections`, { requestId });
    discardRest(req);
    this.logDone(res, requestId, 429);
  }

  /** Never rejects: a bug must cost one request a 500, never the process. */
  private async handleApi(req: IncomingMessage, res: ServerResponse, api: ApiKind): Promise<void> {
    const requestId = requestIdOf(req);
    try {
      const { deps } = this;
      if (this.draining) {
        req.resume();
        deps.metrics.requestRejected('shutting_down');
        sendError(res, 503, 'gateway is shutting down', { droppedReason: 'rejected-shutting-down', requestId });
        return this.logDone(res, requestId, 503);
      }
      // A compressed body cannot be parsed, and vLLM would refuse it too: say so, not "invalid JSON".
      const encoding = req.headers['content-encoding'];
      if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
        deps.metrics.requestRejected('compressed_body');
        sendError(res, 415, `compressed request bodies are not supported (content-encoding: ${encoding.slice(0, 64)}): send the JSON uncompressed`, { requestId });
        discardRest(req);
        return this.logDone(res, requestId, 415);
      }
      let raw: Buffer;
      const receiving: ReceivingBody = { res, requestId, older: undefined, newer: undefined };
      this.receiving.push(receiving);
      // Node times an upload only while its request is the connection's current one: one pipelined
      // behind an answer still going out is timed here (it held its connection, and up to
      // bodyLimit of memory, for ever).
      const uploadTimer = res.socket === null && !req.complete ? setTimeout(cutPipelinedUpload, this.requestTimeoutMs, req, res).unref() : undefined;
      try {
        raw = await readBody(req, deps.runtime().config.server.bodyLimit, this.uploads);
      } catch (err) {
        if (err instanceof BodyTooLargeError) {
          deps.metrics.requestRejected('body_too_large');
          sendError(res, 413, err.message, { requestId });
          discardRest(req);
          return this.logDone(res, requestId, 413);
        }
        // The connection ended mid-body: the client went away, or it was cut (408, end of shutdown).
        deps.metrics.bodyIncomplete();
        return this.logDone(res, requestId, res.headersSent ? res.statusCode : (sentError(res)?.rawStatus ?? 0));
      } finally {
        clearTimeout(uploadTimer);
        this.receiving.remove(receiving);
      }
      // Read after the body: a reload while it arrived retired the runtime (and queue) before.
      const rt = deps.runtime();
      const ctx = this.forwardContext(req, res, api, raw, requestId, rt);
      if (isInvalid(ctx)) {
        deps.metrics.requestRejected('invalid_request');
        sendError(res, 400, ctx.message, { param: ctx.param, requestId });
        return this.logDone(res, requestId, 400);
      }

      const objective = (ctx.objective = textHeader(req.headers, OBJECTIVE_HEADERS));
      const priority = (ctx.priority = objective !== undefined ? (rt.objectives.get(objective) ?? 0) : 0);
      const fairnessId = (ctx.fairnessId = textHeader(req.headers, FAIRNESS_HEADERS) ?? 'default-flow');

      const { modelMetrics, started } = ctx;
      modelMetrics.started();
      this.inFlight.push(ctx);
      let status = 0;
      try {
        if (rt.flowControl) {
          const sloTtftMs = parseSloTtftHeader(firstHeader(req.headers, SLO_TTFT_HEADERS));
          const requestTtlMs = parseRequestTtlHeader(firstHeader(req.headers, REQUEST_TTL_HEADERS));
          status = await throughFlowControl(rt.flowControl, ctx, deps.runtime, priority, fairnessId, sloTtftMs, requestTtlMs, this.whySaturated);
        } else {
          const refusal = rt.admitWithoutQueue(priority);
          if (refusal) {
            status = refusal.status;
            return sendGatewayError(res, refusal, requestId);
          }
          status = await forward(ctx);
        }
      } catch (err) {
        // A bug (e.g. a plugin that throws) costs this request a 500, counted and logged as one.
        status = 500;
        this.internalError(res, requestId, err);
      } finally {
        if (ctx.endedByGateway && status < 400) status = 503;
        this.inFlight.remove(ctx);
        modelMetrics.ended();
        // Latency of answers from a model server, as llm-d records it: Sluice's own refusals (counted
        // as errors) would pull the percentiles down exactly when the fleet is in trouble.
        if (ctx.ttftMs !== undefined) modelMetrics.duration((deps.clock.now() - started) / 1000);
        if (status >= 400) modelMetrics.error(status);
        // A 200 stream the model server ended with an error event failed all the same.
        else if (ctx.streamError !== undefined) modelMetrics.error(ctx.streamError);
        else if (status === 0) modelMetrics.cancelled(requestStage(ctx));
        // Node holds a pipelined answer until the ones before it on the connection are written.
        if (status > 0 && status < 400 && ctx.streamError === undefined && res.socket === null && !res.writableFinished) this.doneWhenWritten(req, res, requestId, status, ctx);
        else this.logDone(res, requestId, status, ctx);
      }
    } catch (err) {
      this.internalError(res, requestId, err);
    }
  }

  /**
   * /debug/requests: the oldest `limit` requests in flight, each with its flow, where it is (queued,
   * waiting for the first byte, streaming) and for how long.
   */
  inFlightRequests(limit = 100): { total: number; receivingBodies: number; requests: object[] } {
    const now = this.deps.clock.now();
    const oldest: ForwardContext[] = [];
    for (let c = this.inFlight.oldest; c !== undefined && oldest.length < limit; c = c.newer) oldest.push(c);
    return {
      total: this.inFlight.size,
      // Connections that sent a request's headers and are still sending its body (not yet a request of a model).
      receivingBodies: this.receiving.size,
      requests: oldest.map((ctx) => ({
        requestId: ctx.requestId,
        model: ctx.sreq.model,
        priority: ctx.priority,
        fairnessId: ctx.fairnessId,
        state: requestStage(ctx),
        endpoint: ctx.endpoint ?? null,
        prefillEndpoint: ctx.prefillEndpoint ?? null,
        attempts: ctx.attempts,
        ageMs: now - ctx.started,
        queuedMs: ctx.endpoint === undefined ? now - ctx.started : ctx.queuedMs,
        ttftMs: ctx.ttftMs ?? null,
      })),
    };
  }

  /** The drain begins: the last answer of each connection, if not yet begun, closes it when done. */
  startDrain(): void {
    this.draining = true;
    this.closingAnswers = new WeakMap();
    // Only a connection's newest answer is marked (closeWith).
    for (let c = this.inFlight.oldest; c !== undefined; c = c.newer) this.closeWith(c.res);
    for (let r = this.receiving.oldest; r !== undefined; r = r.newer) this.closeWith(r.res);
  }

  /**
   * Draining: when `res` is its connection's last answer so far, only it says `Connection: close` —
   * Node drops the answers pipelined behind one that closes its connection (a finished one too,
   * such as a /health queued behind a stream). One marked before it on that connection is
   * unmarked, unless its head is written already: then a request pipelined behind it is answered in
   * vain, as with any HTTP/1.1 server closing a connection.
   */
  private closeWith(res: ServerResponse): void {
    const socket = res.req.socket;
    if ((res as Numbered)[kAnswerNo] !== (socket as Numbered)[kAnswerNo]) return;
    const before = this.closingAnswers!.get(socket);
    if (before !== undefined && !before.headersSent) before.shouldKeepAlive = true;
    if (res.headersSent || !res.shouldKeepAlive) this.closingAnswers!.delete(socket);
    else {
      res.shouldKeepAlive = false;
      this.closingAnswers!.set(socket, res);
    }
  }

  /**
   * The shutdown grace period is over: each request still in flight is ended now, with a reason —
   * a 503 when its answer has not started, an error event when it streams (a JSON answer under way
   * can only be cut) — its upstream request cancelled, and counted as a 503. Returns how many.
   */
  endInFlight(message: string): number {
    let n = 0;
    // No `close` here: the drain made each connection's last answer say it (closeWith), and one
    // said by an earlier answer would drop the answers pipelined behind it.
    const refuse = (res: ServerResponse, requestId: string): void =>
      sendError(res, 503, message, { droppedReason: 'rejected-shutting-down', requestId });
    for (let c = this.inFlight.oldest; c !== undefined; c = c.newer) {
      const { res } = c;
      if (res.writableEnded || res.destroyed) continue;
      n++;
      c.endedByGateway = true;
      interruptWatcher(res);
      if (!res.headersSent) refuse(res, c.requestId);
      else {
        noteSentError(res, { message });
        if (c.sseScanner !== undefined && !c.sseMidEvent) res.end(sseErrorEnd(c.sreq.api, 503, message, c.sseScanner.nextSequenceNumber));
      }
    }
    // Still uploading: not yet a request of any model, but answered all the same.
    for (let r = this.receiving.oldest; r !== undefined; r = r.newer) {
      if (r.res.headersSent || r.res.destroyed) continue;
      n++;
      refuse(r.res, r.requestId);
    }
    return n;
  }

  /**
   * Why requests wait: the pool's saturation by stage and its endpoints with stale metrics, as a
   * clause for the answer of a request that timed out in the queue ('' when unknown). Built at most
   * once per clock tick: a storm of expiries shares it.
   */
  private readonly whySaturated = (): string => {
    const now = this.deps.clock.now();
    if (now !== this.whyAt) {
      this.whyAt = now;
      this.why = describeSaturation(this.deps.saturation?.());
    }
    return this.why;
  };
  private whyAt = NaN;
  private why = '';

  private internalError(res: ServerResponse, requestId: string, err: unknown): void {
    this.deps.logger.error({ err, requestId }, 'unexpected error handling request');
    sendError(res, 500, 'internal error in the gateway', { requestId });
  }

  /**
   * An answer complete but queued behind an earlier one on its connection (pipelining): answered
   * once written; when the client leaves first it never got it, and counts as cancelled.
   */
  private doneWhenWritten(req: IncomingMessage, res: ServerResponse, requestId: string, status: number, ctx: ForwardContext): void {
    // A queued answer gets no 'close' of its own when the connection dies: watchPipelined (one
    // listener per connection, registered in begin) tells its watcher. A listener per answer on
    // the socket would make Node warn of a leak from the 8th answer queued on one connection.
    const watcher: ClientWatcher = {
      clientClosed: () => {
        if (res.writableFinished) return;
        res.off('finish', written);
        ctx.modelMetrics.cancelled('streaming');
        this.logDone(res, requestId, 0, ctx);
      },
    };
    const written = () => {
      unwatchClient(res, watcher);
      this.logDone(res, requestId, status, ctx);
    };
    if (req.socket.destroyed) return watcher.clientClosed();
    res.once('finish', written);
    watchClient(res, watcher);
  }

  /**
   * At debug level, one line per API request when it ends (`request done`): its status (0: the
   * client went away first), the error Sluice answered and why, its objective, priority and flow,
   * where it went (after how many attempts; the prefill leg's endpoint and time under P/D), how long
   * it queued, its time to first byte, duration and tokens. The line to find a slow or failed request by its
   * `x-request-id`; `scheduling decision` lines say why it went there.
   */
  private logDone(res: ServerResponse, requestId: string, status: number, ctx?: ForwardContext): void {
    const { logger, clock } = this.deps;
    // Status 0 with an error: Sluice cut the connection itself, and says why.
    const error = status >= 400 || status === 0 ? sentError(res) : undefined;
    if (error?.droppedReason !== undefined) this.refusals.note(error.droppedReason, status, requestId, error.message, error.cause);
    if (!logger.isLevelEnabled('debug')) return;
    logger.debug(
      {
        requestId,
        model: ctx?.sreq.model,
        objective: ctx?.objective,
        priority: ctx?.priority,
        fairnessId: ctx?.fairnessId,
        status,
        error: error?.message,
        droppedReason: error?.droppedReason,
        endpoint: ctx?.endpoint,
        attempts: ctx?.attempts,
        prefillEndpoint: ctx?.prefillEndpoint,
        prefillMs: ctx?.prefillMs,
        previousResponse: ctx?.previousResponse,
        previousResponseSearch: ctx?.previousResponseSearch,
        queuedMs: ctx?.queuedMs,
        ttftMs: ctx?.ttftMs,
        durationMs: ctx !== undefined ? clock.now() - ctx.started : undefined,
        promptTokens: ctx?.usage?.promptTokens,
        completionTokens: ctx?.usage?.completionTokens,
        streamError: ctx?.streamError,
      },
      'request done',
    );
  }

  /**
   * The request's forwarding context, or why its body is not a valid API request. Built outside
   * handleApi so that the parsed body is no local of its suspended frame: a queued or answered
   * request can drop it (scheduling-request.ts).
   */
  private forwardContext(
    req: IncomingMessage,
    res: ServerResponse,
    api: ApiKind,
    raw: Buffer,
    requestId: string,
    rt: ProxyRuntime,
  ): ForwardContext | InvalidRequest {
    const valid = parseOpenAIRequest(api, raw);
    if (isInvalid(valid)) return valid;
    const { deps } = this;
    return {
      req,
      res,
      raw,
      sreq: schedulingRequest(requestId, api, valid, req.headers, new Map()),
      stream: valid.stream,
      requestId,
      started: deps.clock.now(),
      rt,
      pool: deps.pool,
      upstreams: deps.upstreams,
      metrics: deps.metrics,
      modelMetrics: deps.metrics.forModel(valid.model),
      logger: deps.logger,
      upstreamFailures: this.upstreamFailures,
      storedResponses: deps.storedResponses,
      clock: deps.clock,
      objective: undefined,
      priority: 0,
      fairnessId: 'default-flow',
      previousResponse: undefined,
      pinnedOrigin: undefined,
      searchesFor: undefined,
      previousResponseSearch: undefined,
      recordsResponseId: false,
      endpoint: undefined,
      attempts: 0,
      prefillEndpoint: undefined,
      prefillMs: undefined,
      queuedMs: 0,
      ttftMs: undefined,
      usage: undefined,
      streamError: undefined,
      sseScanner: undefined,
      sseMidEvent: false,
      endedByGateway: false,
      older: undefined,
      newer: undefined,
    };
  }
}

/** The number of a connection's latest answer, on the connection, and of each answer, on it. */
const kAnswerNo = Symbol('sluice.answerNo');
type Numbered = { [kAnswerNo]?: number };

/** A request whose body is still arriving, in the server's `receiving` list. */
interface ReceivingBody {
  readonly res: ServerResponse;
  readonly requestId: string;
  older: ReceivingBody | undefined;
  newer: ReceivingBody | undefined;
}

/**
 * Where a request is: queued (no endpoint yet), sent and waiting for its first byte, or answering
 * (`/debug/requests` and `sluice_request_cancelled_total{stage}` use the same words).
 */
function requestStage(ctx: ForwardContext): RequestStage {
  return ctx.endpoint === undefined ? 'queued' : ctx.ttftMs === undefined ? 'waiting_first_byte' : 'streaming';
}

/** `/v1/…?q` of an absolute-form request target; the target itself when it is no URL (then no route matches). */
function originForm(target: string): string {
  try {
    const u = new URL(target);
    return u.pathname + u.search;
  } catch {
    return target;
  }
}

/** `the pool stayed saturated: prefill 1.00, decode 0.20; 1 endpoint with stale metrics` ('' without a snapshot). */
function describeSaturation(s: SaturationSnapshot | undefined): string {
  if (s === undefined) return '';
  const stages = Object.entries(s.stages).map(([stage, v]) => `${stage} ${v.toFixed(2)}`);
  const stale = s.stale > 0 ? `; ${s.stale} endpoint${s.stale === 1 ? '' : 's'} with stale metrics (unreachable or not answering /metrics)` : '';
  return `the pool stayed saturated: ${stages.length > 0 ? stages.join(', ') : `global ${s.global.toFixed(2)}`}${stale}`;
}

/**
 * Holds the request in the flow-control queue until it is dispatched (then forwards it — called
 * synchronously inside the dispatch cycle, so the endpoint's in-flight count rises before the next
 * saturation sample) or refused; a client that disconnects while queued leaves the queue at once.
 */
function throughFlowControl(
  fc: FlowController,
  ctx: ForwardContext,
  runtime: () => ProxyRuntime,
  priority: number,
  fairnessId: string,
  sloTtftMs: number | undefined,
  requestTtlMs: number | undefined,
  whySaturated: () => string,
): Promise<number> {
  return new Promise<number>((resolve) => {
    const q = new Queued(ctx, runtime, priority, fairnessId, sloTtftMs, requestTtlMs, resolve, whySaturated);
    watchClient(ctx.res, q);
    q.ticket = fc.enqueue(q);
    q.compact();
  });
}

/** A request in the flow-control queue: the queue's request, its outcome handler and its client watcher in one object. */
class Queued implements FlowRequest, ClientWatcher {
  ticket: FlowTicket | undefined = undefined;
  readonly byteSize: number;
  readonly receivedAt: number;
  /** Its outcome is known (it may come inside `enqueue`). */
  private settled = false;

  constructor(
    private readonly ctx: ForwardContext,
    private readonly runtime: () => ProxyRuntime,
    readonly priority: number,
    readonly fairnessId: string,
    readonly sloTtftMs: number | undefined,
    readonly requestTtlMs: number | undefined,
    private readonly resolve: (status: number | Promise<number>) => void,
    private readonly whySaturated: () => string,
  ) {
    this.byteSize = ctx.raw.length;
    this.receivedAt = ctx.started;
  }

  clientClosed(): void {
    this.ticket?.cancel();
  }

  /** Waits with only its bytes (scheduling-request.ts); parsed again when scheduling needs the rest. */
  compact(): void {
    if (!this.settled) dropParsedForm(this.ctx.sreq);
  }

  /** Its favourite endpoint is saturated and the alternative clearly worse: a later request may go first (affinityLookahead). */
  prefersToWait(): boolean {
    const { ctx } = this;
    restoreParsedForm(ctx.sreq, ctx.raw);
    // An ejected endpoint is no favourite to wait for: it takes no requests (outlier detection).
    // Over the candidates dispatch will schedule over (forward.ts): its model's servers in a mixed
    // pool; the server holding the response it continues, when pinned there.
    const eligible = ctx.pool.eligibleFor(ctx.sreq.model, ctx.clock.now());
    return this.runtime().scheduler.favouriteIsSaturated(ctx.sreq, candidatesFor(homeOf(ctx.sreq, ctx.pool.endpoints, ctx.storedResponses), eligible));
  }

  /** The flow controller swallows a callback's error: one here must still end the request (a 500 from handleApi). */
  onOutcome(outcome: FlowOutcome, queuedMs: number, cause?: OutcomeCause): void {
    try {
      this.settle(outcome, queuedMs, cause);
    } catch (err) {
      this.resolve(Promise.reject(err as Error));
    }
  }

  private settle(outcome: FlowOutcome, queuedMs: number, cause?: OutcomeCause): void {
    const { ctx } = this;
    const { res, requestId } = ctx;
    this.settled = true;
    ctx.queuedMs = queuedMs;
    unwatchClient(res, this);
    if (outcome === 'Dispatched') {
      const rt = (ctx.rt = this.runtime()); // a reload while it waited: schedule with the profiles now in force
      // A reload turned flow control off and emptied the queue at once: the rule without it applies,
      // and a request it refuses left the queue without going on (EvictedOther), not Dispatched.
      const refusal = rt.flowControl === undefined ? rt.admitWithoutQueue(this.priority) : undefined;
      ctx.metrics.flowControlOutcome(refusal === undefined ? outcome : 'EvictedOther', this.priority, this.fairnessId, queuedMs / 1000);
      if (refusal !== undefined) {
        sendGatewayError(res, refusal, requestId);
        return this.resolve(refusal.status);
      }
      restoreParsedForm(ctx.sreq, ctx.raw);
      return this.resolve(forward(ctx));
    }
    ctx.metrics.flowControlOutcome(outcome, this.priority, this.fairnessId, queuedMs / 1000);
    const http = outcomeToHttp(outcome, cause, ctx.pool.endpoints.length === 0);
    if (outcome === 'EvictedContextCancelled' || http === undefined) return this.resolve(0);
    const detail = outcome === 'EvictedTTL' ? this.whySaturated() : undefined;
    sendError(res, http.status, http.message, { droppedReason: http.droppedReason, requestId, noRetry: http.final, retryAfterSeconds: http.retryAfterSeconds, detail });
    this.resolve(http.status);
  }
}

/** A pipelined request's body still arriving after server.requestTimeout: no 408 can go before the answers ahead of it, so the connection is cut. */
function cutPipelinedUpload(req: IncomingMessage, res: ServerResponse): void {
  noteSentError(res, { message: 'request body not received within server.requestTimeout (pipelined behind an answer still going out): connection closed' });
  req.socket.destroy();
}

function json(res: ServerResponse, status: number, body: string, requestId?: string, contentType = 'application/json'): void {
  const headers: Record<string, string | number> = { 'content-type': contentType, 'content-length': Buffer.byteLength(body) };
  if (requestId !== undefined) headers['x-request-id'] = requestId;
  res.writeHead(status, headers);
  res.end(body);
}

export type { Endpoint };
export { GatewayError };
