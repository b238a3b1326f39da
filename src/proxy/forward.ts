/**
 * Scheduling + forwarding of one admitted request, with retries on connection failures that
 * happen before any byte reached the client (SPEC §2), each on another endpoint; when none is left,
 * one whose connection was lost (not refused) is tried once more. A Responses API request continuing a
 * response no server was known for (or whose server cannot be reached) asks each server in turn while
 * they answer that they do not hold it (stored-responses.ts); those 404s are held back. The answer
 * streams back chunk by chunk with backpressure (SSE event by event, never held); a small
 * non-streamed answer of known length is collected and written in one go with its headers. A client
 * disconnect aborts the upstream request at once; the endpoint's in-flight count is released exactly
 * once whatever happens.
 *
 * The upstream request runs on undici's dispatch API with one handler object per attempt
 * (`Exchange`): no response stream, no promise per chunk, no AbortController.
 *
 * Prefill/decode (SPEC §7.4): when the profile handler decided `prefill-decode`, the connector of
 * the decision shapes the decode request (sidecar header) or first runs a prefill leg through
 * `sendPrefill` (nixlv2, shared-storage) — the prefill endpoint is in flight only for its leg, the
 * decode endpoint for the whole request; a client disconnect aborts whichever leg runs and no next
 * leg starts. A decode leg prepared by a prefill leg is reused when the decode endpoint is retried
 * after it refused the connection (it never had the leg); after a lost connection the retry decides
 * and prefills anew.
 * The decision is counted once per request.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { errors as undiciErrors, type Dispatcher } from 'undici';
import type { Endpoint, InFlightAttempt } from '../datalayer/endpoint.js';
import type { Pool } from '../datalayer/pool.js';
import type { Disaggregation, SchedulingRequest, SchedulingResult } from '../scheduling/framework.js';
import type { DecisionTrace, SchedulingOutcome } from '../scheduling/scheduler.js';
import type { Clock } from '../util/clock.js';
import { noteSentError, sendError, sseErrorEnd } from './errors.js';
import { clientResponseHeaders, rawClientResponseHeaders, upstreamRequestHeaders } from './headers.js';
import type { ProxyMetrics, ProxyRuntime } from './runtime.js';
import type { ModelRequestMetrics, UpstreamErrorKind } from '../metrics/metrics.js';
import type { Upstreams } from './upstreams.js';
import { HeldTail } from './held-tail.js';
import { SpellLog } from './spell-log.js';
import { SseUsageScanner, usageFromJson, type Usage } from './usage.js';
import {
  candidatesFor,
  homeOf,
  MAX_NOT_HELD_ANSWER,
  previousResponseId,
  responseIdAtHead,
  saysNotHeld,
  serverAt,
  type PreviousResponseResult,
  type PreviousResponseSearchResult,
  type StoredResponses,
} from './stored-responses.js';
import { connectorFor } from './connectors/index.js';
import { silenceWindowMs } from '../datalayer/scraper.js';
import { rewriteJsonCachedTokens, SseCachedTokensRewriter } from './connectors/cached-tokens.js';
import { BodyNotRewritableError, decodeOnly, jsonObjectOf, type DecodeLeg, type PdStep, type PrefillLegResult, type SendPrefill } from './connectors/types.js';
import { cutIfNeverRead, unwatchClient, watchClient, type ClientWatcher } from './client-watch.js';
import { dropParsedForm, restoreParsedForm } from './scheduling-request.js';

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
  /** The gateway's warn lines for requests that failed at a model server (upstreamFailureLog). */
  upstreamFailures: SpellLog;
  /** Which server holds each stored Responses API answer relayed (a request continuing one goes there). */
  storedResponses: StoredResponses;
  clock: Clock;
  // What the debug-level `request done` line reports, filled in as the request goes.
  /** The request's objective header, its priority and fairness id (set once admitted). */
  objective: string | undefined;
  priority: number;
  fairnessId: string;
  /** A Responses API request continuing a stored response: what was known of its server (stored-responses.ts). */
  previousResponse: PreviousResponseResult | undefined;
  /**
   * The origin of the server holding the response the request continues (`previous_response_id`),
   * when it was in the pool at the first attempt: every attempt goes there, or none.
   */
  pinnedOrigin: string | undefined;
  /**
   * The `previous_response_id` of a request whose server the gateway did not know (`unknown` or
   * `unavailable`, with `server.storedResponses` on), or could not reach: a server answering that it
   * does not hold that response is passed over for the next one (saysNotHeld).
   */
  searchesFor: string | undefined;
  /** How that search ended, once a server said it does not hold the response. */
  previousResponseSearch: PreviousResponseSearchResult | undefined;
  /**
   * A Responses API request that did not say `store: false` (vLLM stores by default, when its store
   * is on), with `server.storedResponses` on: the id of its answer is remembered with its server.
   */
  recordsResponseId: boolean;
  /**
   * The endpoint of the last attempt, and how many attempts were made (retries after connection
   * failures, and the servers asked for a previous response).
   */
  endpoint: string | undefined;
  attempts: number;
  /** P/D: the prefill endpoint picked (whichever connector), and how long the prefill leg Sluice ran took (nixlv2, shared-storage). */
  prefillEndpoint: string | undefined;
  prefillMs: number | undefined;
  /** Time spent in the flow-control queue (0 when it went straight through). */
  queuedMs: number;
  /**
   * Arrival → first token of the answer relayed (its first byte; of an SSE answer its first event, of
   * a Responses API stream the first past `response.created` and `response.in_progress`); undefined before it.
   */
  ttftMs: number | undefined;
  usage: Usage | undefined;
  /** A stream answered 200 that the model server ended with an error event: that event's code. */
  streamError: number | undefined;
  /**
   * Set when the answer relayed is an event stream (its status line and headers have gone to the
   * client): what has been read of it (an error event Sluice ends it with follows its numbering).
   */
  sseScanner: SseUsageScanner | undefined;
  /**
   * Part of an unfinished SSE event has gone to the client (one longer than the gateway holds back):
   * no error event can follow it, so a failure cuts the connection, as for a JSON answer.
   */
  sseMidEvent: boolean;
  /** Set when the gateway itself ended the request (shutdown grace period over): counted as a 503. */
  endedByGateway: boolean;
  /** Neighbours in the API server's list of requests in flight (intrusive: no hashing per request). */
  older: ForwardContext | undefined;
  newer: ForwardContext | undefined;
}

/** Errors that prove no connection was made: the model server never saw the request. */
const NO_CONNECTION_CODES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT', 'ENOTFOUND', 'EAI_AGAIN']);
/**
 * Errors of a connection lost before any answer byte: a pooled keep-alive connection the server had
 * closed (the request never reached it), or a server that died while working on the request. The
 * two cannot be told apart at once, so both are retried on another endpoint, as a connection
 * failure is (SPEC §2): the second case runs the generation twice. With no other endpoint left, the
 * same one gets one more try — only when the loss came within LOST_AT_ONCE_MS of sending (the first
 * case: a race at the connection's end): a server that held the request longer took it, and may
 * have run it. Counted apart (`reset`).
 */
const LOST_CONNECTION_CODES = new Set(['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED']);
/** A connection lost this soon after the request went out: most likely closed idle by the server as it went. */
const LOST_AT_ONCE_MS = 250;

/**
 * undici's UND_ERR_SOCKET for an answer it cannot take (an unsolicited 1xx, a 101): the server did
 * answer, so it has the request — another endpoint would run it twice.
 */
const ANSWERED_SOCKET_MESSAGES = new Set(['bad response', 'bad upgrade']);

/** Another endpoint may take the request: no connection, or the connection lost before an answer. */
function isConnectError(err: unknown): boolean {
  const { code, message } = err as { code?: string; message?: string };
  if (code === 'UND_ERR_SOCKET' && message !== undefined && ANSWERED_SOCKET_MESSAGES.has(message)) return false;
  return code !== undefined && (NO_CONNECTION_CODES.has(code) || LOST_CONNECTION_CODES.has(code));
}

function connectErrorKind(err: unknown): 'connect' | 'reset' {
  return LOST_CONNECTION_CODES.has((err as { code?: string }).code ?? '') ? 'reset' : 'connect';
}

/**
 * The gateway gave up on a request whose server stalled or went silent (Pool.rescueStuck): a
 * time-out of the upstream (SPEC §2: 504), sent to another endpoint when nothing reached the client.
 */
class UpstreamStuckError extends Error {
  override readonly name = 'UpstreamStuckError';
}

/**
 * Index just past the last blank line of SSE text (0 when it has none): the end of its last whole
 * event. Lines end with LF, CR LF or CR (the SSE grammar), so a blank line is two line ends in a
 * row. Scanned from the end: a chunk that ends an event is decided in a few compares. Only blank
 * lines ending at or after `from` are looked for (`LastEnd`: what came before held none).
 */
export function lastEventEnd(buf: Buffer, from = 0): number {
  for (let i = buf.length - 1; i >= 1 && i >= from; i--) {
    const c = buf[i];
    let start: number;
    if (c === LF) start = buf[i - 1] === CR ? i - 1 : i;
    else if (c === CR && buf[i + 1] !== LF) start = i;
    else continue;
    const before = start >= 1 ? buf[start - 1] : undefined;
    if (before === LF || before === CR) return i + 1;
  }
  return 0;
}

/**
 * Whether `buf` holds the first field line of an SSE stream (`data:`, `event:`, …: an event begins),
 * past the comment lines (`: ping`) and blank lines before it. `state.inComment` carries a comment
 * line cut across chunks. A keep-alive comment carries no token, so it is no time to first token.
 */
export function sseFieldBegins(buf: Buffer, state: { inComment: boolean }): boolean {
  let inComment = state.inComment;
  for (let i = 0; i < buf.length; i++) {
    const c = buf[i];
    if (c === LF || c === CR) inComment = false;
    else if (!inComment) {
      if (c !== COLON) return true;
      inComment = true;
    }
  }
  state.inComment = inComment;
  return false;
}

/**
 * A Responses API stream whose answer has not begun: vLLM sends `response.created` and
 * `response.in_progress` as soon as it accepts the request, before its queue wait and prefill, so
 * its first token comes with the first event of another type (`response.output_item.added`, then
 * `response.output_text.delta`s; an error event, or `response.completed`/`failed`/`incomplete`,
 * ends the wait as well). Fed the answer's chunks until then, it reads whole events only, holding
 * an unfinished one (across chunks, whatever the split) as the relay does.
 */
export class ResponsesOutputWait {
  private readonly events = new HeldTail(lastEventEnd, 1);

  /** Whether the answer begins in `chunk`: a whole event past the two that open the stream. */
  push(chunk: Buffer): boolean {
    const whole = this.events.push(chunk);
    if (whole.length > 0 && outputEventIn(whole)) return true;
    // An event too long to hold (the relay passes it on as it comes): the answer, as any first event.
    return this.events.length > MAX_HELD_EVENT;
  }
}

/**
 * Whether the whole SSE events of `buf` hold one whose type is neither `response.created` nor
 * `response.in_progress`. An event's type is its `event:` line, or for a server that sends `data:`
 * lines only, the `"type"` member of its JSON (none, or data that is no JSON: not one of the two).
 * Comment lines, and a block of no `event:` or `data:` line (`id:`, `retry:`), are no event.
 */
export function outputEventIn(buf: Buffer): boolean {
  let type: string | undefined;
  let data: string | undefined;
  for (let i = 0; i < buf.length; ) {
    let end = i;
    while (end < buf.length && buf[end] !== LF && buf[end] !== CR) end++;
    if (end === i) {
      // A blank line: the event, if any, is whole.
      if ((type !== undefined || data !== undefined) && !opensResponse(type, data)) return true;
      type = data = undefined;
    } else if (buf[i] !== COLON) {
      let colon = buf.indexOf(COLON, i);
      if (colon < 0 || colon > end) colon = end;
      let value = colon + 1;
      if (buf[value] === SPACE && value < end) value++;
      const name = buf.toString('latin1', i, colon);
      if (name === 'event') type = buf.toString('utf8', Math.min(value, end), end);
      else if (name === 'data') {
        const line = buf.toString('utf8', Math.min(value, end), end);
        data = data === undefined ? line : `${data}\n${line}`;
      }
    }
    i = end + (buf[end] === CR && buf[end + 1] === LF ? 2 : 1);
  }
  return false;
}

/** An event that opens a Responses API stream (its type, else its data's), sent before any token. */
function opensResponse(type: string | undefined, data: string | undefined): boolean {
  const t = type !== undefined && type !== '' ? type : jsonType(data);
  return t === 'response.created' || t === 'response.in_progress';
}

function jsonType(data: string | undefined): unknown {
  if (data === undefined) return undefined;
  try {
    return (JSON.parse(data) as { type?: unknown } | null)?.type;
  } catch {
    return undefined;
  }
}

const MAX_JSON_CAPTURE = 1 << 20;
/** Bytes of a JSON Responses API answer kept to read its id (its first member): a longest id, escaped, fits. */
const ID_HEAD_BYTES = 2048;
const EMPTY = Buffer.alloc(0);
/** An SSE event held back this long without its end is relayed as it comes after all. */
const MAX_HELD_EVENT = 1 << 20;
const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
const SPACE = 0x20;
/**
 * A JSON decode answer whose cached_tokens is rewritten is held whole up to this size, then relayed as
 * is: held, it reads on whether or not its client does, so a stalled client keeps all of it (1 MiB, as
 * an SSE event held back).
 */
const MAX_JSON_REWRITE = 1 << 20;
/** Bytes of a prefill answer kept (a one-token answer; anything longer is read and dropped). */
const MAX_PREFILL_ANSWER = 4 << 20;

type AttemptResult =
  | { kind: 'done'; status: number }
  /**
   * `lost`: a connection was made and lost before any answer byte (else none was made); `held`: lost
   * only after the server had the request for LOST_AT_ONCE_MS or more; `prepared`: the decode leg a
   * prefill leg produced, for the next attempt to reuse; `stuck`: given up on as its endpoint stuck
   * (Pool.rescueStuck).
   */
  | { kind: 'retry'; error: string; timedOut: boolean; lost: boolean; held: boolean; prepared?: DecodeLeg; stuck?: true }
  /** The server said it does not hold the previous response searched for: its answer, held back. */
  | { kind: 'notHeld'; answer: HeldAnswer };

/** An answer held back from the client: relayed as it came when no other server is left to ask. */
interface HeldAnswer {
  /** The endpoint that answered it. */
  endpoint: string;
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
}

/** What one attempt sends: the client's request, a P/D decision to carry out, or a prepared decode leg. */
type AttemptPlan = Disaggregation | DecodeLeg | undefined;

const isDecodeLeg = (plan: AttemptPlan): plan is DecodeLeg => plan !== undefined && 'body' in plan;

/** Returns the status sent to the client (0 when the client went away first). */
export async function forward(ctx: ForwardContext): Promise<number> {
  const { rt, pool, metrics, res, requestId } = ctx;
  // A client that left while its request was queued (and whose close we could not observe) costs nothing.
  if (res.destroyed || ctx.req.socket?.destroyed) return 0;
  const retries = rt.config.server.upstream.retries;
  let candidates: readonly Endpoint[] = pool.eligibleFor(ctx.sreq.model, ctx.clock.now());
  /** The response a Responses API request continues (read now: an attempt drops the parsed body). */
  let previousId: string | undefined;
  if (ctx.sreq.api === 'responses') {
    const home = homeOf(ctx.sreq, pool.endpoints, ctx.storedResponses);
    if (home !== undefined) {
      metrics.previousResponseRouting(home.result);
      ctx.previousResponse = home.result;
      ctx.pinnedOrigin = home.endpoint?.origin;
      candidates = candidatesFor(home, candidates);
      previousId = previousResponseId(ctx.sreq);
      // Another replica may have relayed it, or this gateway restarted since: asked of each server in turn.
      if (home.endpoint === undefined && ctx.storedResponses.enabled) ctx.searchesFor = previousId;
    }
    ctx.recordsResponseId = ctx.storedResponses.enabled && ctx.sreq.body.store !== false;
  }
  /**
   * Servers a connection failed on, or that said they do not hold the previous response searched
   * for (by origin: an endpoint a reload moved is a new server).
   */
  let ruledOut: string[] | undefined;
  /** Servers that lost a connection once and stay eligible (below). */
  let lostOnce: string[] | undefined;
  /** The retry's candidates with those servers, when scheduling over the untried alone may find none. */
  let withLostOnce: readonly Endpoint[] | undefined;
  /** A connection was lost after the request went out: a server may have run it. */
  let mayHaveRun = false;
  let lastError = '';
  let failedOn: Endpoint | undefined;
  /** How the last attempt failed: its connection timed out, or its server stuck (a 504), else 502. */
  let lastFailure: 'failed' | 'timed_out' | 'stuck' = 'failed';
  /** Connection failures so far (each retried, up to `upstream.retries`). */
  let failures = 0;
  /**
   * The last server that said it does not hold the previous response (the others are being asked):
   * its 404, for when no server is left to ask.
   */
  let notHeld: HeldAnswer | undefined;
  let prepared: DecodeLeg | undefined;
  /** The P/D decision of the last attempt made (the one carried out): counted once, at the end. */
  let decision: Disaggregation['decision'] | undefined;
  try {
    for (let attempt = 0; ; attempt++) {
      // At debug level every decision is logged with what each filter dropped and each scorer gave.
      const trace: DecisionTrace | undefined = ctx.logger.isLevelEnabled('debug') ? [] : undefined;
      const t0 = performance.now();
      // A retry schedules again: parsed again from the bytes (the attempt before kept only those).
      if (attempt > 0) restoreParsedForm(ctx.sreq, ctx.raw);
      let outcome = rt.scheduler.schedule(ctx.sreq, candidates, trace);
      // None of the servers not yet tried can take it (a P/D pool's prefill servers are never a
      // decode target): one that lost a connection at once gets its one more try.
      if (!outcome.ok && withLostOnce !== undefined) {
        candidates = withLostOnce;
        outcome = rt.scheduler.schedule(ctx.sreq, candidates, trace);
      }
      withLostOnce = undefined;
      metrics.schedulerDuration((performance.now() - t0) / 1000);
      // A run over no candidate at all (every server tried) is no decision to show.
      if (trace !== undefined && candidates.length > 0) logDecision(ctx, attempt, outcome, trace);
      if (!outcome.ok) {
        // No server left to ask for the previous response: the last 404, as it came (a server that
        // could not be reached holds nothing either: vLLM's store is in its memory).
        if (notHeld !== undefined) return relayNotHeld(ctx, notHeld);
        // A retry with nowhere left to go is the connection failure's 502/504, not a scheduling refusal.
        if (attempt > 0) return connectFailed(ctx, lastFailure, `and no other endpoint is eligible: ${lastError}`, mayHaveRun);
        metrics.schedulerAttempt('failure', '');
        if (outcome.reason === 'no-endpoints') {
          sendError(res, 503, outcome.message, { droppedReason: 'rejected-no-endpoints', requestId });
          return 503;
        }
        sendError(res, 429, outcome.message, { droppedReason: 'rejected-saturated', requestId });
        return 429;
      }
      const ep = outcome.target;
      // A retry is counted when it happens, against the endpoint whose connection failed.
      if (failedOn !== undefined) metrics.upstreamRetry(failedOn.name);
      ctx.endpoint = ep.name;
      ctx.attempts = attempt + 1;
      metrics.schedulerAttempt('success', ep.name);
      const pd = outcome.result.disaggregation;
      // A retry with a prepared decode leg carries out the decision (and prefill) that made it.
      if (prepared === undefined) {
        decision = pd?.decision;
        ctx.prefillEndpoint = undefined;
      }
      const r = await attemptOn(ctx, ep, prepared ?? pd, outcome.result);
      if (r.kind === 'done') {
        if (ctx.searchesFor !== undefined) previousResponseAnswered(ctx, ep, r.status, notHeld !== undefined);
        return r.status;
      }
      if (r.kind === 'notHeld') {
        // Not a failure of that server: the next one is asked, with the retries left as they were.
        notHeld = r.answer;
        failedOn = undefined;
        (ruledOut ??= []).push(ep.origin);
      } else {
        prepared = r.prepared;
        lastError = `${ep.name}: ${r.error}`;
        lastFailure = r.stuck ? 'stuck' : r.timedOut ? 'timed_out' : 'failed';
        failedOn = ep;
        if (r.stuck) warnUpstream(ctx, ep.name, 'model server stuck: request given up on there, sent again', { err: r.error, attempt });
        else warnUpstream(ctx, ep.name, 'upstream connection failed', { err: r.error, attempt });
        mayHaveRun ||= r.lost;
        if (failures++ >= retries) return connectFailed(ctx, lastFailure, `after ${attempt + 1} attempt(s): ${lastError}`, mayHaveRun);
        // When no other server is left, a server that lost a connection (not refused it) at once is
        // tried once more: it most likely closed an idle keep-alive connection just as the request
        // went out, and a fresh connection works. A second loss, or a loss after holding the request
        // a while (it may have run it), rules it out.
        if (r.lost && !r.held && !(lostOnce ??= []).includes(ep.origin)) lostOnce.push(ep.origin);
        else (ruledOut ??= []).push(ep.origin);
      }
      // A fresh scheduling run over the endpoints as they are now (a reload may have changed them),
      // without the servers already tried.
      const failed = ruledOut ?? [];
      const lost = lostOnce ?? [];
      if (ctx.pinnedOrigin !== undefined && failed.includes(ctx.pinnedOrigin)) {
        // The home cannot be reached, and its store is in its memory: the others are asked, as for
        // a response no server is known for, so that the client gets their 404 (as through a replica
        // that never knew the home), or the answer of one that holds it after all.
        ctx.searchesFor = previousId;
        ctx.pinnedOrigin = undefined;
      }
      // A pinned request's retries go to its home alone, set aside or not (stored-responses.ts).
      const home = ctx.pinnedOrigin === undefined ? undefined : serverAt(pool.endpoints, ctx.pinnedOrigin);
      const now = ctx.clock.now();
      const eligible = ctx.pinnedOrigin === undefined ? pool.eligibleFor(ctx.sreq.model, now) : home === undefined ? [] : [home];
      // A search asks no silent server (down or hung): it would hold the request until
      // upstream.headersTimeout, where a server without the response answers at once.
      const silence = ctx.searchesFor === undefined ? Infinity : silenceWindowMs(rt.config.pool.metrics);
      const untriedOf = (servers: readonly Endpoint[]): Endpoint[] =>
        servers.filter((c) => !failed.includes(c.origin) && !lost.includes(c.origin) && c.metricsAge(now) <= silence);
      let untried = untriedOf(eligible);
      // A search asks the servers set aside too, last: one may hold the response (as a pinned request goes to its home set aside).
      if (untried.length === 0 && notHeld !== undefined) untried = untriedOf(pool.setAsideFor(ctx.sreq.model, now));
      const notFailed = eligible.filter((c) => !failed.includes(c.origin) && c.metricsAge(now) <= silence);
      candidates = untried.length > 0 ? untried : notFailed;
      if (untried.length > 0 && lost.length > 0) withLostOnce = notFailed;
    }
  } finally {
    if (decision !== undefined) metrics.disaggDecision(ctx.sreq.model, decision);
  }
}

/**
 * A server answered a request continuing a response the gateway knew no server for (`searchesFor`):
 * a 2xx says it holds that response (remembered, so the next request continuing it is pinned there);
 * after other servers said they do not hold it, the search found it. Another answer (an error, a
 * client gone) says nothing of where the response is.
 */
function previousResponseAnswered(ctx: ForwardContext, ep: Endpoint, status: number, searching: boolean): void {
  if (!is2xx(status)) return;
  ctx.storedResponses.remember(ctx.searchesFor!, ep.origin);
  if (searching) {
    ctx.previousResponseSearch = 'found';
    ctx.metrics.previousResponseSearch('found');
  }
}

/** No server left to ask holds the previous response: the last one's 404 goes to the client as it came. */
function relayNotHeld(ctx: ForwardContext, answer: HeldAnswer): number {
  if (ctx.res.destroyed) return 0;
  ctx.endpoint = answer.endpoint;
  ctx.previousResponseSearch = 'not_found';
  ctx.metrics.previousResponseSearch('not_found');
  return relayWhole(ctx, answer.status, answer.headers, answer.body);
}

/** The window of upstreamFailureLog's sums. */
const UPSTREAM_FAILURE_WINDOW_MS = 30_000;

/**
 * The gateway's warn lines for requests that failed at a model server: the first of each endpoint
 * and message in a spell in full (with its request id), the rest summed up every 30 s while they go
 * on, so a fleet failing under load does not write a line per request (SpellLog).
 */
export function upstreamFailureLog(logger: Logger): SpellLog {
  return new SpellLog(UPSTREAM_FAILURE_WINDOW_MS, true, (failures, total, windowMs) =>
    logger.warn({ failures, total, windowMs }, 'requests failed at model servers in the last window, by endpoint and message (the first of each was logged in full)'),
  );
}

/**
 * A request's failure at `endpoint`, at warn: in full when it is news, else counted (upstreamFailureLog).
 * News per `kind` of the message when given (another kind of failure is news too).
 */
function warnUpstream(ctx: ForwardContext, endpoint: string, message: string, fields: Record<string, unknown>, kind?: string): void {
  if (ctx.upstreamFailures.note(kind === undefined ? `${endpoint}: ${message}` : `${endpoint}: ${message} (${kind})`)) {
    ctx.logger.warn({ requestId: ctx.requestId, endpoint, ...fields, summaryEveryMs: UPSTREAM_FAILURE_WINDOW_MS }, message);
  }
}

/**
 * A request failed on `ep` (before or during its answer, or with a 5xx): counted by kind, and (unless
 * its failure was counted already) one more in the endpoint's run of failures, which may set it aside
 * for a while (outlier detection).
 */
function upstreamError(ctx: ForwardContext, ep: Endpoint, kind: UpstreamErrorKind, newFailure = true): void {
  ctx.metrics.endpointUpstreamError(ep.name, kind);
  if (newFailure) ctx.pool.upstreamFailed(ep, kind, ctx.clock.now());
}

/**
 * The last attempt could not connect, or was given up on as its server stuck: 504 when its connect
 * timed out or it stuck (upstream time-outs, SPEC §2), else 502. `mayHaveRun`: a server lost a
 * connection the request went out on (not refused it), or was given it and stuck.
 */
function connectFailed(ctx: ForwardContext, failure: 'failed' | 'timed_out' | 'stuck', detail: string, mayHaveRun: boolean): number {
  const status = failure === 'failed' ? 502 : 504;
  const what = failure === 'stuck' ? 'upstream stopped answering' : failure === 'timed_out' ? 'upstream connection timed out' : 'upstream connection failed';
  sendError(ctx.res, status, `${what} ${detail}`, { requestId: ctx.requestId, noRetry: mayHaveRun });
  return status;
}

function logDecision(ctx: ForwardContext, attempt: number, outcome: SchedulingOutcome, profiles: DecisionTrace): void {
  ctx.logger.debug(
    outcome.ok
      ? { requestId: ctx.requestId, model: ctx.sreq.model, attempt, previousResponse: ctx.previousResponse, target: outcome.target.name, disaggregation: outcome.result.disaggregation?.decision, profiles }
      : { requestId: ctx.requestId, model: ctx.sreq.model, attempt, previousResponse: ctx.previousResponse, refused: outcome.reason, message: outcome.message, profiles },
    'scheduling decision',
  );
}

/**
 * `prompt`: the scheduling result's prompt tokens, counted on the endpoint that computes the prompt
 * (a prepared decode leg brings none, unless P/D fell back and the decoder computes it).
 */
async function attemptOn(ctx: ForwardContext, ep: Endpoint, plan: AttemptPlan, prompt: SchedulingResult): Promise<AttemptResult> {
  const x = new Exchange(ctx, ep, prompt);
  try {
    let leg: DecodeLeg | undefined;
    let prepared: DecodeLeg | undefined;
    if (isDecodeLeg(plan)) leg = prepared = plan;
    else if (plan?.prefill !== undefined) {
      ctx.prefillEndpoint = plan.prefill.name;
      const connector = connectorFor(plan.connector);
      const prefillPromptTokens = prompt.prefillPromptTokens ?? 0;
      if (!connector.runsPrefill) x.holdSidecarPrefill(plan.prefill, prefillPromptTokens);
      const input = { raw: ctx.raw, body: ctx.sreq.body, api: ctx.sreq.api, prefill: plan.prefill };
      // Only a prefill leg needs a signal (the decode leg is aborted through undici's controller).
      const ac = (x.prefillAbort = new AbortController());
      // vLLM takes x-request-id as its request's id, and a prefill server may still hold an earlier
      // prefill leg of this request under it (its KV kept for a decoder that never pulled it): a
      // retry's pair of legs goes by an id of its own, both legs alike (as llm-d's sidecar sends one
      // id for both), so that the decoder's notice frees the right blocks.
      const pairId = ctx.prefillMs === undefined ? ctx.requestId : `${ctx.requestId}-attempt${ctx.attempts}`;
      let step: PdStep;
      try {
        const pending = connector.carryOut(input, prefillSender(ctx, plan.prefill, prefillPromptTokens, ac, pairId));
        step = pending instanceof Promise ? await pending : pending;
      } catch (err) {
        // A body nested too deeply to serialise again (JSON.parse reads any depth): the decoder takes the bytes as sent.
        if (!(err instanceof BodyNotRewritableError)) throw err;
        step = decodeOnly(ctx.raw, err.message);
      }
      x.prefillAbort = undefined;
      if (step.kind === 'aborted' || x.clientGone || ctx.res.destroyed) return DONE_GONE;
      if (step.kind === 'reply') return { kind: 'done', status: relayPrefillReply(ctx, step) };
      if (step.warning !== undefined) {
        ctx.metrics.pdDegraded(connector.name);
        // Each kind of reason said once a window (a time-out after a 500 is news), not each error's text.
        const kind = step.warning.split(':', 1)[0];
        warnUpstream(ctx, plan.prefill.name, 'P/D degraded', { decodeEndpoint: ep.name, connector: connector.name, reason: step.warning }, kind);
      }
      leg = pairId === ctx.requestId ? step.leg : { ...step.leg, headers: { ...step.leg.headers, 'x-request-id': pairId } };
      if (connector.runsPrefill) prepared = leg;
    }
    if (leg === undefined || leg.recomputesPrompt === true) x.countPrompt(ep, prompt.primaryPromptTokens ?? 0);
    // Scheduled and its legs built: from here on it needs only its bytes. The parsed JSON of a body
    // of token ids is several times its size (16 MiB of them: 80 MB of heap), for as long as the
    // model server takes to answer, so a few dozen such requests in flight exhausted the heap.
    dropParsedForm(ctx.sreq);
    return await x.relay(leg, prepared);
  } finally {
    x.finish();
  }
}

/** A 2xx answer: what a cached_tokens rewrite applies to, and what grows a slow start (Pool.release). */
const is2xx = (status: number): boolean => status >= 200 && status <= 299;

const DONE_EVENT = Buffer.from('data: [DONE]');

/** Whether whole SSE events `buf` end with `data: [DONE]` (then a blank line: LF, CR LF or CR ends). */
function endsWithDone(buf: Buffer): boolean {
  let end = buf.length;
  while (end > 0 && (buf[end - 1] === LF || buf[end - 1] === CR)) end--;
  return end >= DONE_EVENT.length && buf.compare(DONE_EVENT, 0, DONE_EVENT.length, end - DONE_EVENT.length, end) === 0;
}

const DONE_GONE: AttemptResult = Object.freeze({ kind: 'done', status: 0 });

const cutStalledClient = (x: Exchange): void => x.stalled();

/** Non-streamed answers up to this size are relayed in one write (status line, headers and body). */
const MAX_BUFFERED = 256 << 10;

const enum Mode {
  /** Relayed chunk by chunk as it arrives (SSE, unknown or large length). */
  Stream,
  /** Collected, then written once with the headers (a small answer with a known length). */
  Buffer,
  /** Collected so its cached_tokens can be rewritten, then written once with its new length. */
  HoldJson,
  /**
   * A 404 to a request searching for its previous response (`searchesFor`): collected to read whether
   * the server says it does not hold it (then the next server is asked), else written once.
   */
  HoldNotFound,
}

/**
 * One attempt on one endpoint: the undici dispatch handler of the upstream request (no response
 * stream, no promise per chunk, no AbortSignal), the client-close watcher and the endpoint's
 * in-flight slot, released exactly once: when the answer is relayed, on an error, or at once when
 * the client goes away.
 *
 * It implements undici's core handler interface (onConnect … onComplete) rather than the
 * controller-based one: undici wraps a controller-based handler in an adapter per request that
 * parses every response header into an object first; this reads the raw header list once, keeping
 * what it relays.
 */
class Exchange implements Dispatcher.DispatchHandler, ClientWatcher, InFlightAttempt {
  clientGone = false;
  /** Clock time the server was last heard of for this request (InFlightAttempt): sent, status line, a chunk. */
  heardAt = 0;
  // Its links in its endpoint's list of attempts (InFlightAttempt).
  older: InFlightAttempt | undefined = undefined;
  newer: InFlightAttempt | undefined = undefined;
  /** Set while a prefill leg runs: aborted when the client goes away. */
  prefillAbort: AbortController | undefined = undefined;
  private released = false;
  /** Uncached prompt tokens counted on `promptEp` until the answer's first byte (or the end). */
  private promptTokens = 0;
  private promptUnseen = false;
  private promptEp: Endpoint | undefined = undefined;
  /** The prefill endpoint a routing sidecar sends the prompt to first: in flight until the answer begins. */
  private sidecarPrefillEp: Endpoint | undefined = undefined;
  /** Whether this request, or the sidecar's prefill leg, is its endpoint's probe (Pool.acquire). */
  private probe = false;
  private sidecarProbe = false;
  private settled = true;
  private resolve: ((r: AttemptResult) => void) | undefined = undefined;
  /** undici's abort of this request (set once it is sent or queued on a connection). */
  private abortUpstream: ((err: Error) => void) | undefined = undefined;
  /** undici's resume of a paused response (backpressure). */
  private resumeUpstream: (() => void) | undefined = undefined;
  private prepared: DecodeLeg | undefined = undefined;
  private cachedTokens: number | undefined = undefined;
  // --- the answer
  private status = 0;
  /** The answer began and then failed (cut, or stalled past bodyTimeout): not a success, whatever its status. */
  private brokeOff = false;
  private headers: Record<string, string | string[]> | undefined = undefined;
  private mode = Mode.Stream;
  private sse = false;
  /** The SSE events relayed so far end with `data: [DONE]`: the client has the whole stream. */
  private doneRelayed = false;
  private scanner: SseUsageScanner | undefined = undefined;
  private sseRewriter: SseCachedTokensRewriter | undefined = undefined;
  /** A JSON Responses API answer whose id is remembered: its first bytes, where the id is (responseIdAtHead). */
  private idHead: Buffer | undefined = undefined;
  /** Chunks kept: the whole answer (Buffer, HoldJson) or its first MiB for usage (Stream, status 200). */
  private captured: Buffer[] | undefined = undefined;
  private capturedBytes = 0;
  private first = true;
  /**
   * Its TTFT is taken: the first body byte, or of an SSE answer the first event (not a comment); of a
   * Responses API stream, the first past `response.created` and `response.in_progress`.
   */
  private answered = false;
  /** SSE: the comment-only start of the answer so far (sseFieldBegins). */
  private readonly sseStart = { inComment: false };
  /** A Responses API stream until its answer begins (then dropped): what it sent so far. */
  private outputWait: ResponsesOutputWait | undefined = undefined;
  /** Clock time the request left for the endpoint (its first-byte latency runs from here). */
  private sentAt = 0;
  /** A non-SSE answer's status line waits for its first body byte: until then a failure can still be a §5 error. */
  private headPending = false;
  /** SSE: the bytes after the last event boundary, relayed once their event is whole (an error event must start on a boundary). */
  private partialEvent: HeldTail | undefined = undefined;
  /** The client is not reading: onData answers false, and undici stops reading until resumed on 'drain'. */
  private waitingDrain = false;
  /** Resumes the upstream once the client caught up (made on first backpressure). */
  private onDrain: (() => void) | undefined = undefined;
  /** onDrain's resume, run as a microtask (made on first need). */
  private resumeLater: (() => void) | undefined = undefined;
  /** What the gateway's own code threw inside an undici callback: undici fails the request with it (failedInGateway). */
  private ownError: unknown = undefined;
  /** Cuts a client that reads nothing for `upstream.bodyTimeout` while the upstream is paused for it. */
  private stallTimer: NodeJS.Timeout | undefined = undefined;
  /** Starts the stall timer once a pipelined answer gets its connection (made on first need). */
  private onSocket: (() => void) | undefined = undefined;

  constructor(
    private readonly ctx: ForwardContext,
    private readonly ep: Endpoint,
    /** The scheduling run that chose `ep`, for the response hooks. */
    private readonly result: SchedulingResult,
  ) {
    watchClient(ctx.res, this);
    this.probe = ctx.pool.acquire(ep);
  }

  /**
   * `on` computes this request's prompt while the answer has not begun: this endpoint, or the
   * prefill endpoint a routing sidecar sends the prompt to first.
   */
  countPrompt(on: Endpoint, tokens: number, unseen = false): void {
    if (tokens <= 0) return;
    this.promptEp = on;
    this.promptTokens = tokens;
    this.promptUnseen = unseen;
    this.ctx.pool.promptSent(on, tokens, unseen);
  }

  /**
   * A routing sidecar runs the prefill leg on `on` before it sends the decode: `on` is in flight,
   * with the prompt's tokens, until the decode answer begins (the gateway cannot see the leg end).
   * Not one of `on`'s attempts (Pool.rescueStuck): the leg may have ended long before a non-streamed
   * answer begins, and a prefill server that froze since owes this request nothing; one stuck on the
   * leg itself is the sidecar's to time out.
   */
  holdSidecarPrefill(on: Endpoint, tokens: number): void {
    this.sidecarProbe = this.ctx.pool.acquire(on);
    this.sidecarPrefillEp = on;
    this.countPrompt(on, tokens, true);
  }

  /** The prompt is computed (first byte of the answer, or the attempt ended): uncounted once. */
  private promptDone(): void {
    const prefill = this.sidecarPrefillEp;
    if (prefill !== undefined) {
      this.sidecarPrefillEp = undefined;
      this.ctx.pool.release(prefill, is2xx(this.status), this.sidecarProbe);
    }
    if (this.promptEp === undefined) return;
    this.ctx.pool.promptDone(this.promptEp, this.promptTokens, this.promptUnseen);
    this.promptEp = undefined;
  }

  /** Sends the decode leg (or the client's request) and relays the answer. */
  relay(leg: DecodeLeg | undefined, prepared: DecodeLeg | undefined): Promise<AttemptResult> {
    const { ctx } = this;
    if (this.clientGone || ctx.res.destroyed) return Promise.resolve(DONE_GONE);
    this.prepared = prepared;
    const headers = upstreamRequestHeaders(ctx.req.headers, ctx.requestId);
    if (leg?.headers !== undefined) Object.assign(headers, leg.headers);
    this.cachedTokens = leg?.cachedTokens;
    return new Promise<AttemptResult>((resolve) => {
      this.resolve = resolve;
      this.settled = false;
      this.sentAt = this.heardAt = ctx.clock.now();
      this.ep.attempts.push(this);
      ctx.upstreams.get(this.ep).dispatch({ method: 'POST', path: ctx.req.url ?? '/', headers, body: leg?.body ?? ctx.raw }, this);
    });
  }

  /** Releases the endpoint and stops watching the client (idempotent). */
  finish(): void {
    if (!this.released) {
      this.released = true;
      this.ep.attempts.remove(this);
      try {
        this.promptDone();
      } finally {
        this.ctx.pool.release(this.ep, is2xx(this.status) && !this.brokeOff, this.probe);
      }
    }
    unwatchClient(this.ctx.res, this);
    if (this.waitingDrain) {
      this.waitingDrain = false;
      this.ctx.res.off('drain', this.onDrain!);
      if (this.onSocket !== undefined) this.ctx.res.off('socket', this.onSocket);
      clearTimeout(this.stallTimer);
    }
  }

  /**
   * The client has read nothing for `upstream.bodyTimeout` while the upstream waited for it (undici
   * suspends its own body time-out while paused): its connection is cut, which ends the attempt as a
   * client that went away and frees the endpoint's slot.
   */
  stalled(): void {
    const { ctx, ep } = this;
    ctx.logger.warn({ requestId: ctx.requestId, endpoint: ep.name }, 'client read nothing for upstream.bodyTimeout: connection closed');
    noteSentError(ctx.res, { message: 'client read nothing for upstream.bodyTimeout: connection closed' });
    ctx.res.destroy();
    // The attempt ends here, not on a 'close' that may come later.
    this.clientClosed();
  }

  /**
   * Its server stalled or went silent (Pool.rescueStuck): the request is sent to another server when
   * nothing of it reached the client, else its answer ends with a 504 (onError).
   */
  abandon(why: string): boolean {
    // Paused for its client (backpressure): the silence is the client's, not the server's.
    if (this.settled || this.waitingDrain) return false;
    const err = new UpstreamStuckError(why);
    const abort = this.abortUpstream;
    this.onError(err);
    // Settled now: undici's own onError for it is ignored (one still queued is dropped at onConnect).
    abort?.(err);
    return true;
  }

  private done(r: AttemptResult): void {
    if (this.settled) return;
    this.settled = true;
    this.finish();
    this.resolve!(r);
  }

  clientClosed(): void {
    if (this.ctx.res.writableFinished) return;
    this.clientGone = true;
    this.prefillAbort?.abort();
    if (!this.settled) {
      // undici drops the request at once when connected, or as soon as it would be sent when queued.
      this.abortUpstream?.(new Error('client disconnected'));
      this.done(DONE_GONE);
    }
  }

  // --- undici handler

  onConnect(abort: (err?: Error) => void): void {
    this.abortUpstream = abort;
    if (this.settled) abort(new Error('client disconnected'));
  }

  onHeaders(status: number, rawHeaders: Buffer[], resume: () => void): boolean {
    this.resumeUpstream = resume;
    this.heardAt = this.ctx.clock.now();
    try {
      this.responseStart(status, rawHeaders);
    } catch (err) {
      throw (this.ownError = err);
    }
    return !this.waitingDrain;
  }

  private responseStart(status: number, rawHeaders: Buffer[]): void {
    if (status < 200 || this.settled) return;
    const { ctx, ep, cachedTokens, result } = this;
    this.status = status;
    if (status >= 500) {
      upstreamError(ctx, ep, 'http_5xx');
      warnUpstream(ctx, ep.name, 'model server answered 5xx (relayed)', { status }, String(status));
    }
    const headers = rawClientResponseHeaders(rawHeaders);
    // Read before the response hooks add theirs.
    const { 'content-type': contentType, 'content-encoding': encoding, 'content-length': length } = headers;
    headers['x-request-id'] = ctx.requestId;
    for (const hook of ctx.rt.responseHooks) {
      hook.onResponseHeaders(ctx.sreq, ep, (name, value) => (headers[name.toLowerCase()] = value), result);
    }
    this.headers = headers;
    // A stream compressed anyway cannot be cut at event ends: relayed as it comes, as any other answer.
    const sse = (this.sse =
      typeof contentType === 'string' && contentType.startsWith('text/event-stream') && (encoding === undefined || encoding === 'identity'));
    const rewrite = cachedTokens !== undefined && is2xx(status) && (encoding === undefined || encoding === 'identity');
    if (!sse && ctx.recordsResponseId && is2xx(status)) this.idHead = EMPTY;
    if (status === 404 && ctx.searchesFor !== undefined && !sse) {
      this.mode = Mode.HoldNotFound;
      this.captured = [];
      return;
    }
    if (rewrite) delete headers['content-length'];
    if (sse) {
      const responses = ctx.sreq.api === 'responses';
      this.scanner = ctx.sseScanner = new SseUsageScanner(responses);
      if (responses && is2xx(status)) this.outputWait = new ResponsesOutputWait();
      if (rewrite) this.sseRewriter = new SseCachedTokensRewriter(cachedTokens);
    } else if (rewrite) {
      // A JSON answer whose usage is rewritten goes out whole, with its new length, once complete.
      this.mode = Mode.HoldJson;
      this.captured = [];
      return;
    } else {
      if (typeof length === 'string' && length.length > 0 && Number(length) <= MAX_BUFFERED) {
        this.mode = Mode.Buffer;
        this.captured = [];
        return;
      }
      if (status === 200) this.captured = [];
    }
    if (sse) {
      // At once, as the model server sent them: its first event may come after a long wait in its queue.
      ctx.res.writeHead(status, headers);
      ctx.res.flushHeaders();
    } else this.headPending = true;
  }

  onData(chunk: Buffer): boolean {
    this.heardAt = this.ctx.clock.now();
    try {
      this.responseData(chunk);
    } catch (err) {
      throw (this.ownError = err);
    }
    return !this.waitingDrain;
  }

  private responseData(chunk: Buffer): void {
    if (this.settled) return;
    const { ctx } = this;
    if (this.first) {
      this.first = false;
      const now = ctx.clock.now();
      ctx.metrics.endpointFirstByte(this.ep.name, (now - this.sentAt) / 1000);
      // A 404 held to be read may be no answer at all, only a server saying it lacks the response.
      if (this.mode !== Mode.HoldNotFound && (!this.sse || this.answerBegins(chunk))) this.answer(now);
    } else if (!this.answered && this.mode !== Mode.HoldNotFound && this.answerBegins(chunk)) this.answer(ctx.clock.now());
    const head = this.idHead;
    if (head !== undefined && head.length < ID_HEAD_BYTES) this.idHead = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
    if (this.mode === Mode.Buffer) {
      this.captured!.push(chunk);
      this.capturedBytes += chunk.length;
      return;
    }
    if (this.mode === Mode.HoldJson || this.mode === Mode.HoldNotFound) {
      const notFound = this.mode === Mode.HoldNotFound;
      if (this.capturedBytes + chunk.length <= (notFound ? MAX_NOT_HELD_ANSWER : MAX_JSON_REWRITE)) {
        this.captured!.push(chunk);
        this.capturedBytes += chunk.length;
        return;
      }
      // Too large to hold (for a 404: longer than any saying the response is not held): relay it unchanged from here on.
      if (notFound) this.answer(ctx.clock.now());
      this.mode = Mode.Stream;
      ctx.res.writeHead(this.status, this.headers);
      for (const c of this.captured!) ctx.res.write(c);
      this.captured = undefined;
    }
    if (this.scanner !== undefined) this.scanner.feed(chunk);
    else if (this.captured !== undefined) {
      // Usage is read from a complete answer only: past the cap, stop keeping it.
      if (this.capturedBytes + chunk.length <= MAX_JSON_CAPTURE) {
        this.captured.push(chunk);
        this.capturedBytes += chunk.length;
      } else this.captured = undefined;
    }
    let out = this.sseRewriter !== undefined ? this.sseRewriter.push(chunk) : chunk;
    if (this.sse) out = this.wholeEvents(out);
    if (out.length === 0) return;
    if (this.sse) this.doneRelayed = endsWithDone(out);
    if (this.headPending) {
      this.headPending = false;
      ctx.res.writeHead(this.status, this.headers);
    }
    if (!ctx.res.write(out) && !ctx.res.destroyed && !this.waitingDrain) {
      this.waitingDrain = true;
      this.onDrain ??= () => {
        this.waitingDrain = false;
        clearTimeout(this.stallTimer);
        // Not from inside 'drain': Node may emit it in the middle of another answer's undici
        // callback (a pipelined answer's headers flushed on this connection), where undici cannot
        // resume a parser (it throws, failing that answer and leaving this one paused for good).
        queueMicrotask((this.resumeLater ??= () => {
          if (!this.settled && !this.waitingDrain) this.resumeUpstream?.();
        }));
      };
      ctx.res.once('drain', this.onDrain);
      // A pipelined answer is held until the ones before it are done, however fast the client
      // reads them: its client is not stalling it yet. Its clock starts when it gets the connection.
      if (ctx.res.socket === null) ctx.res.once('socket', (this.onSocket ??= () => this.startStallTimer()));
      else this.startStallTimer();
    }
  }

  /**
   * SSE, not yet answered: whether the answer begins in `chunk` (its first event; of a Responses API
   * stream, the first that is neither `response.created` nor `response.in_progress`).
   */
  private answerBegins(chunk: Buffer): boolean {
    return this.outputWait === undefined ? sseFieldBegins(chunk, this.sseStart) : this.outputWait.push(chunk);
  }

  /** The answer's first token (its first byte, or an SSE answer's first event: answerBegins) reached the gateway. */
  private answer(now: number): void {
    this.answered = true;
    this.outputWait = undefined;
    firstAnswerByte(this.ctx, this.sse, now);
    this.promptDone();
  }

  private startStallTimer(): void {
    if (this.waitingDrain) this.stallTimer = setTimeout(cutStalledClient, this.ctx.rt.config.server.upstream.bodyTimeout, this);
  }

  /**
   * The whole SSE events of what arrived, keeping the rest for the next chunk. vLLM ends each chunk
   * on an event boundary, so the usual case neither copies nor holds anything.
   */
  private wholeEvents(buf: Buffer): Buffer {
    const events = (this.partialEvent ??= new HeldTail(lastEventEnd, 1));
    const { ctx } = this;
    if (ctx.sseMidEvent && events.length === 0) {
      // The rest of an event relayed as it comes (below): passed on uncopied up to the last boundary.
      const end = lastEventEnd(buf);
      if (end === 0) return buf;
      ctx.sseMidEvent = false;
      if (end === buf.length) return buf;
      events.push(buf.subarray(end)); // (holds it: no boundary after `end`)
      return buf.subarray(0, end);
    }
    const out = events.push(buf);
    if (out.length > 0) {
      ctx.sseMidEvent = false;
      return out;
    }
    // No boundary yet: hold it, unless the event grows past any sensible size (then it is relayed as
    // it comes, above: holding more back would only lose more of it to a failure).
    if (events.length > MAX_HELD_EVENT) {
      ctx.sseMidEvent = true;
      return events.take();
    }
    return out;
  }

  onComplete(): void {
    try {
      this.responseComplete();
    } catch (err) {
      throw (this.ownError = err);
    }
  }

  private responseComplete(): void {
    if (this.settled) return;
    const { ctx } = this;
    this.answeredWhole();
    const { res } = ctx;
    if (res.destroyed) return this.done(DONE_GONE);
    let whole: Buffer | undefined;
    if (this.mode === Mode.Stream) {
      if (this.headPending) res.writeHead(this.status, this.headers);
      if (this.partialEvent !== undefined && this.partialEvent.length > 0) res.write(this.partialEvent.take());
      const rest = this.sseRewriter?.end();
      if (rest !== undefined && rest.length > 0) res.write(rest);
      res.end();
    } else {
      const captured = this.captured!;
      let body = captured.length === 1 ? captured[0]! : Buffer.concat(captured, this.capturedBytes);
      if (this.mode === Mode.HoldJson) {
        body = rewriteJsonCachedTokens(body, this.cachedTokens!);
        this.headers!['content-length'] = String(body.length);
        whole = body;
      } else if (this.mode === Mode.HoldNotFound) {
        if (saysNotHeld(body, ctx.searchesFor!)) return this.done({ kind: 'notHeld', answer: { endpoint: this.ep.name, status: this.status, headers: this.headers!, body } });
        this.answer(ctx.clock.now());
      } else if (this.status === 200) whole = body;
      // Status line, headers and body leave in one write.
      res.writeHead(this.status, this.headers);
      res.end(body);
    }
    const usage: Usage | undefined =
      this.scanner !== undefined
        ? this.scanner.usage
        : whole !== undefined
          ? usageFromJson(whole)
          : this.captured !== undefined && this.mode === Mode.Stream
            ? usageFromJson(Buffer.concat(this.captured, this.capturedBytes))
            : undefined;
    if (ctx.recordsResponseId) this.remember(this.scanner !== undefined ? this.scanner.responseId : this.idHead && responseIdAtHead(this.idHead));
    if (usage) {
      ctx.usage = usage;
      ctx.modelMetrics.tokens(usage.promptTokens, usage.completionTokens);
    }
    if (this.scanner?.errorCode !== undefined && this.status < 400) ctx.streamError = this.scanner.errorCode;
    // Usually the kernel took the whole answer already (no closure made for it).
    if (!res.writableFinished) {
      const ep = this.ep.name;
      cutIfNeverRead(res, ctx.rt.config.server.upstream.bodyTimeout, () =>
        ctx.logger.warn({ requestId: ctx.requestId, endpoint: ep }, 'client read nothing more of its finished answer for upstream.bodyTimeout: connection closed'),
      );
    }
    this.done({ kind: 'done', status: this.status });
  }

  /** The whole 2xx Responses API answer relayed was response `id`: a request continuing it comes back here. */
  private remember(id: string | undefined): void {
    if (id !== undefined && is2xx(this.status)) this.ctx.storedResponses.remember(id, this.ep.origin);
  }

  /**
   * The gateway's own code threw while relaying the answer (a bug, or a plugin's response hook):
   * undici ends the request with that error, which is no failure of the model server — not counted
   * against it, nor toward its ejection. The client gets a 500 (an error event once a stream began).
   */
  private failedInGateway(err: Error): void {
    const { ctx, ep } = this;
    const { res, requestId } = ctx;
    ctx.logger.error({ requestId, endpoint: ep.name, err }, 'the gateway failed relaying an answer (not the model server): 500');
    const message = `internal gateway error relaying the answer of ${ep.name}`;
    this.brokeOff = true;
    if (!res.headersSent) sendError(res, 500, message, { requestId, noRetry: true });
    else {
      noteSentError(res, { message });
      if (this.sse && !ctx.sseMidEvent) res.end(sseErrorEnd(ctx.sreq.api, 500, message, ctx.sseScanner?.nextSequenceNumber));
      else res.destroy();
    }
    this.done({ kind: 'done', status: 500 });
  }

  /**
   * The endpoint gave its whole answer, whatever the client does now: a success for outlier
   * detection — unless it was a stream the server ended with an error event of code 5xx, vLLM's way
   * to report a generation that failed after its 200: a failure of that server, counted and logged
   * as a 5xx answer is (a 4xx event is about the request, not the server).
   */
  private answeredWhole(): void {
    const { ctx, ep } = this;
    const eventCode = this.scanner?.errorCode;
    if (eventCode !== undefined && eventCode >= 500 && this.status < 400) {
      upstreamError(ctx, ep, 'stream_error');
      warnUpstream(ctx, ep.name, 'model server ended a stream with an error event', { code: eventCode, status: this.status });
    } else if (is2xx(this.status)) ctx.pool.upstreamSucceeded(ep);
  }

  onError(err: Error): void {
    if (this.settled) return;
    const { ctx, ep } = this;
    const { res, requestId } = ctx;
    if (this.clientGone || res.destroyed) return this.done(DONE_GONE);
    if (err === this.ownError) return this.failedInGateway(err);
    if (err instanceof UpstreamStuckError && !res.headersSent) {
      // Nothing of it reached the client (a status line held with the answer counts as none).
      // A 5xx status line that came was one failure already.
      upstreamError(ctx, ep, 'abandoned', this.status < 500);
      // Sent to the server (not still queued in the gateway), it may have run it: a retry decides and prefills anew.
      const sent = this.abortUpstream !== undefined;
      return this.done({ kind: 'retry', error: err.message, timedOut: true, lost: sent, held: true, stuck: true });
    }
    if (this.headers === undefined) {
      // No answer yet.
      if (isConnectError(err)) {
        upstreamError(ctx, ep, connectErrorKind(err));
        const code = (err as { code?: string }).code ?? '';
        const timedOut = code === 'UND_ERR_CONNECT_TIMEOUT';
        // A prepared decode leg names KV blocks one decoder may pull: reused only when this server
        // never had it. After a lost connection it may have pulled (and freed) them: a retry
        // decides and prefills anew.
        const lost = !NO_CONNECTION_CODES.has(code);
        if (!lost) ctx.pool.connectFailed(ep, `a request could not connect: ${err.message}`);
        const held = lost && ctx.clock.now() - this.sentAt >= LOST_AT_ONCE_MS;
        return this.done({ kind: 'retry', error: err.message, timedOut, lost, held, prepared: lost ? undefined : this.prepared });
      }
      if (err instanceof undiciErrors.HeadersTimeoutError) {
        upstreamError(ctx, ep, 'headers_timeout');
        warnUpstream(ctx, ep.name, 'upstream did not answer within upstream.headersTimeout: 504', { headersTimeoutMs: ctx.rt.config.server.upstream.headersTimeout });
        sendError(res, 504, `upstream ${ep.name} did not answer in time`, { requestId, noRetry: true });
        return this.done({ kind: 'done', status: 504 });
      }
      upstreamError(ctx, ep, 'failed');
      warnUpstream(ctx, ep.name, 'upstream failed before answering: 502', { err: err.message });
      sendError(res, 502, `upstream ${ep.name} failed: ${err.message}`, { requestId, noRetry: true });
      return this.done({ kind: 'done', status: 502 });
    }
    // The client has the whole stream (its `data: [DONE]` went out): a connection lost after it
    // takes nothing from the answer, so it is no failure of the request nor of the endpoint.
    if (this.sse && this.doneRelayed && !ctx.sseMidEvent) {
      ctx.logger.debug({ requestId, endpoint: ep.name, err: err.message }, 'upstream connection lost after data: [DONE]');
      this.answeredWhole();
      res.end();
      return this.done({ kind: 'done', status: this.status });
    }
    // The upstream failed mid-answer: when the status line is gone, end the stream visibly. A
    // time-out is a 504 (SPEC §2), whether or not part of the answer was relayed.
    const stuck = err instanceof UpstreamStuckError;
    const timedOut = stuck || err instanceof undiciErrors.BodyTimeoutError;
    const status = timedOut ? 504 : 502;
    const what = stuck
      ? `stopped answering: ${err.message}`
      : timedOut
        ? `stopped answering for longer than upstream.bodyTimeout (${ctx.rt.config.server.upstream.bodyTimeout} ms)`
        : `failed mid-response: ${err.message}`;
    // A 5xx answer that then broke off is one failure (counted at its status line), not two.
    upstreamError(ctx, ep, stuck ? 'abandoned' : timedOut ? 'body_timeout' : 'cut', this.status < 500);
    this.brokeOff = true;
    warnUpstream(ctx, ep.name, 'upstream failed mid-response', { err: err.message, status });
    if (!res.headersSent) sendError(res, status, `upstream ${ep.name} ${what}`, { requestId, noRetry: true });
    else {
      noteSentError(res, { message: `upstream ${ep.name} ${what}` });
      // What was relayed ends on an event boundary (the partial event is dropped): the error is an event of its own.
      if (this.sse && !ctx.sseMidEvent) res.end(sseErrorEnd(ctx.sreq.api, status, `upstream ${ep.name} ${what}`, ctx.sseScanner?.nextSequenceNumber));
      else res.destroy();
    }
    this.done({ kind: 'done', status });
  }
}

/**
 * The prefill leg of a connector: same path and headers as the client request (uncompressed answer),
 * the prefill endpoint in flight for exactly the leg, aborted with the attempt's controller (`abort`).
 * Given up on when the prefill server stalls or goes silent (Pool.rescueStuck): a failed leg, after
 * which the request goes on as the connector decides (decode-only).
 */
function prefillSender(ctx: ForwardContext, prefill: Endpoint, promptTokens: number, abort: AbortController, requestId: string): SendPrefill {
  return async (body: Buffer): Promise<PrefillLegResult> => {
    const { pool } = ctx;
    const { signal } = abort;
    if (signal.aborted) return { kind: 'aborted' };
    const probe = pool.acquire(prefill);
    pool.promptSent(prefill, promptTokens);
    const started = ctx.clock.now();
    const leg: InFlightAttempt = {
      older: undefined,
      newer: undefined,
      heardAt: started,
      abandon: (why) => {
        if (signal.aborted) return false;
        abort.abort(new UpstreamStuckError(why));
        return true;
      },
    };
    prefill.attempts.push(leg);
    let status = 0; // the answer's, once it began
    let failed = false;
    try {
      const headers = upstreamRequestHeaders(ctx.req.headers, requestId);
      const up = await ctx.upstreams.get(prefill).request({ method: 'POST', path: ctx.req.url ?? '/', headers, body, signal });
      leg.heardAt = ctx.clock.now();
      status = up.statusCode;
      // A prefill answer is one token, sent whole: its status line is its first byte.
      ctx.metrics.endpointFirstByte(prefill.name, (ctx.clock.now() - started) / 1000);
      if (up.statusCode >= 500) upstreamError(ctx, prefill, 'http_5xx');
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of up.body as AsyncIterable<Buffer>) {
        leg.heardAt = ctx.clock.now();
        if (size + chunk.length <= MAX_PREFILL_ANSWER) {
          chunks.push(chunk);
          size += chunk.length;
        }
      }
      const answer = Buffer.concat(chunks, size);
      if (!is2xx(status)) return { kind: 'answer', status, headers: up.headers, body: answer };
      // A 2xx the connector cannot read degrades the request as a 5xx does: it counts as the
      // server's failure (a broken prefill tier would otherwise look healthy, never ejected).
      const json = jsonObjectOf(answer);
      if (json !== undefined) pool.upstreamSucceeded(prefill);
      else {
        upstreamError(ctx, prefill, 'failed');
        failed = true;
      }
      return { kind: 'answer', status, headers: up.headers, body: answer, json };
    } catch (err) {
      const stuck = signal.aborted && signal.reason instanceof UpstreamStuckError;
      if (signal.aborted && !stuck) return { kind: 'aborted' };
      const e = (stuck ? signal.reason : err) as Error & { code?: string };
      const kind = stuck
        ? 'abandoned'
        : status !== 0
          ? 'cut'
          : isConnectError(e)
            ? connectErrorKind(e)
            : e instanceof undiciErrors.HeadersTimeoutError
              ? 'headers_timeout'
              : 'failed';
      // A 5xx whose body broke off was counted at its status line.
      upstreamError(ctx, prefill, kind, !(kind === 'cut' && status >= 500));
      failed = true;
      if (kind === 'connect') pool.connectFailed(prefill, `a request could not connect: ${e.message}`);
      return { kind: 'failed', error: e.code !== undefined ? `${e.code}: ${e.message}` : e.message };
    } finally {
      prefill.attempts.remove(leg);
      ctx.prefillMs = ctx.clock.now() - started;
      pool.promptDone(prefill, promptTokens);
      pool.release(prefill, is2xx(status) && !failed, probe);
    }
  };
}

/**
 * The request's answer begins (its TTFT, also what marks it as answered by a model server for the
 * duration histogram). `streaming` is what the answer is, an SSE stream or not, as llm-d labels it:
 * a JSON error to a stream request is not one.
 */
function firstAnswerByte(ctx: ForwardContext, streaming: boolean, now = ctx.clock.now()): void {
  ctx.ttftMs = now - ctx.started;
  ctx.modelMetrics.ttft(ctx.ttftMs / 1000, streaming);
}

/** A prefill answer the client gets instead of a decode answer (a prefill 4xx). Returns the status. */
function relayPrefillReply(ctx: ForwardContext, step: Extract<PdStep, { kind: 'reply' }>): number {
  const headers = clientResponseHeaders(step.headers);
  headers['x-request-id'] = ctx.requestId;
  return relayWhole(ctx, step.status, headers, step.body);
}

/**
 * A model server's answer held back whole goes to the client, timed like any answer (as the same
 * status relayed as it comes is). Returns the status.
 */
function relayWhole(ctx: ForwardContext, status: number, headers: Record<string, string | string[]>, body: Buffer): number {
  firstAnswerByte(ctx, false);
  headers['content-length'] = String(body.length);
  ctx.res.writeHead(status, headers);
  ctx.res.end(body);
  return status;
}
