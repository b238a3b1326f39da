/**
 * Scrapes every pool endpoint's /metrics (SPEC §7.1): one loop per endpoint, the next scrape
 * `intervalMs` after the previous one finished (so a slow server is never hit by overlapping scrapes;
 * one failing for a second, once a second: scrapeDelay),
 * an overall time-out covering connect, headers and body, a body-size cap, and every outcome recorded
 * through `pool.recordScrape`. The loops follow the pool: added endpoints start at once, removed
 * ones stop (an in-progress scrape of a removed endpoint is aborted).
 *
 * Nothing escapes a loop: every failure becomes a recorded scrape error, so there is never an
 * unhandled rejection, and timers are unref()'d so the scraper alone does not keep a process alive.
 */
import { Agent } from 'undici';
import type { Clock } from '../util/clock.js';
import type { Endpoint } from './endpoint.js';
import type { Pool, ScrapeResult } from './pool.js';
import { extractVllmMetrics } from './vllm-metrics.js';

export interface ScraperOptions {
  /** Request path, e.g. `/metrics`. */
  path: string;
  /** Pause between the end of one scrape and the start of the next, per endpoint (ms). */
  intervalMs: number;
  /** Whole-scrape deadline: connect + headers + body (ms). */
  timeoutMs: number;
  /** Timestamps recorded with metrics (`metricsAt`). */
  clock: Clock;
  /** Called after every failed scrape (already recorded on the endpoint); for logs and metrics. */
  onError?: (ep: Endpoint, err: string) => void;
  /** Called after the first good scrape that follows failed ones (for logs). */
  onRecovered?: (ep: Endpoint) => void;
  /** Largest accepted body; default 4 MiB. */
  maxBytes?: number;
}

export const DEFAULT_SCRAPE_MAX_BYTES = 4 * 1024 * 1024;

/**
 * Asks for the classic text format: Python's prometheus_client would otherwise be free to answer
 * OpenMetrics, and without an Accept-Encoding it will not gzip.
 */
const SCRAPE_HEADERS = {
  accept: 'text/plain;version=0.0.4;q=1,*/*;q=0.1',
  'user-agent': 'sluice-scraper',
} as const;

interface ScrapeLoop {
  readonly ep: Endpoint;
  active: boolean;
  timer: NodeJS.Timeout | undefined;
  /** When the scrapes began failing in a row (reset by a good one); undefined while they succeed. */
  failingSince: number | undefined;
}

/** Scrapes failing in a row for this long (a dead endpoint, not a hiccup)… */
/**
 * A server that answered no scrape for this long is silent, down or hung: at least 5 s and four
 * scrape rounds, so that a server slow over `/metrics` under load is not. `/ready` fails when every
 * server is silent; a search for a stored response asks no silent server (it would hold the request
 * until `upstream.headersTimeout`).
 */
export function silenceWindowMs(metrics: { interval: number; timeout: number }): number {
  return Math.max(MIN_SILENCE_MS, 4 * (metrics.interval + metrics.timeout));
}
const MIN_SILENCE_MS = 5_000;

export const SCRAPE_BACKOFF_AFTER_MS = 1000;
/** …are retried this often (or at the interval when longer) until one succeeds. */
export const SCRAPE_BACKOFF_MS = 1000;

/**
 * The pause before an endpoint's next scrape: the interval, or SCRAPE_BACKOFF_MS once its scrapes
 * have failed for SCRAPE_BACKOFF_AFTER_MS. A dead endpoint (refused connections, each a few hundred
 * µs of the event loop) is stale whatever the rate: at 20 scrapes a second, a hundred of them took
 * half a core. A hiccup of a few failed scrapes is retried at the interval, so that the endpoint's
 * metrics are fresh again as soon as it answers (the detector reads stale metrics as saturated).
 */
export function scrapeDelay(intervalMs: number, failingForMs: number): number {
  return failingForMs < SCRAPE_BACKOFF_AFTER_MS ? intervalMs : Math.max(intervalMs, SCRAPE_BACKOFF_MS);
}

interface InProgressScrape {
  readonly controller: AbortController;
  promise: Promise<void>;
  /** Why the scrape was aborted; 'stopped' and 'removed' outcomes are not recorded as errors. */
  abortReason: 'timeout' | 'stopped' | 'removed' | undefined;
  /** The server answered (a status line came), whatever the page: it is not silent (Pool.rescueStuck). */
  answered: boolean;
}

class ScrapeHttpError extends Error {}

function ignoreError(): void {}

/**
 * The longest scrape error kept (log line, `/debug/pool`): a parse error quotes what it could not
 * read, and a model server's page is the server's to fill (a 2 MB value made a 2 MB log line).
 */
const MAX_ERROR_CHARS = 512;

function describeError(err: unknown): string {
  let message: string;
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    // undici's messages ("other side closed") are clearer with their code; node's already include it.
    message = typeof code === 'string' && !err.message.includes(code) ? `${err.message} (${code})` : err.message;
  } else message = String(err);
  return message.length > MAX_ERROR_CHARS ? `${message.slice(0, MAX_ERROR_CHARS)}… (${message.length} characters)` : message;
}

export class Scraper {
  private readonly pool: Pool;
  private readonly path: string;
  private readonly intervalMs: number;
  private readonly timeoutMs: number;
  private readonly clock: Clock;
  private readonly onError: ((ep: Endpoint, err: string) => void) | undefined;
  private readonly onRecovered: ((ep: Endpoint) => void) | undefined;
  private readonly maxBytes: number;

  private running = false;
  private unsubscribe: (() => void) | undefined;
  private agent: Agent | undefined;
  private readonly loops = new Map<Endpoint, ScrapeLoop>();
  private readonly inProgress = new Map<Endpoint, InProgressScrape>();

  constructor(pool: Pool, opts: ScraperOptions) {
    this.pool = pool;
    this.path = opts.path.startsWith('/') ? opts.path : `/${opts.path}`;
    this.intervalMs = opts.intervalMs;
    this.timeoutMs = opts.timeoutMs;
    this.clock = opts.clock;
    this.onError = opts.onError;
    this.onRecovered = opts.onRecovered;
    this.maxBytes = opts.maxBytes ?? DEFAULT_SCRAPE_MAX_BYTES;
  }

  /** Starts one loop per current endpoint (each scrapes at once) and follows pool changes. Idempotent. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.unsubscribe = this.pool.onChange((reason) => {
      if (reason === 'endpoints') this.syncLoops();
    });
    this.syncLoops();
  }

  /** Stops every loop, aborts scrapes in progress (not recorded as errors) and closes connections. */
  async stop(): Promise<void> {
    this.running = false;
    this.unsubscribe?.();
    this.unsubscribe = undefined;
    for (const loop of this.loops.values()) this.stopLoop(loop);
    this.loops.clear();
    const pending: Promise<void>[] = [];
    for (const scrape of this.inProgress.values()) {
      scrape.abortReason ??= 'stopped';
      scrape.controller.abort();
      pending.push(scrape.promise);
    }
    await Promise.all(pending);
    const agent = this.agent;
    this.agent = undefined;
    if (agent !== undefined) await agent.destroy().catch(() => undefined);
  }

  /**
   * Scrapes `ep` once and records the outcome. Never rejects. If a scrape of `ep` is already in
   * progress, returns that one instead of starting a second request.
   */
  scrapeOnce(ep: Endpoint): Promise<void> {
    const current = this.inProgress.get(ep);
    if (current !== undefined) return current.promise;
    const scrape: InProgressScrape = { controller: new AbortController(), promise: Promise.resolve(), abortReason: undefined, answered: false };
    this.inProgress.set(ep, scrape);
    scrape.promise = this.runScrape(ep, scrape).finally(() => {
      if (this.inProgress.get(ep) === scrape) this.inProgress.delete(ep);
    });
    return scrape.promise;
  }

  private syncLoops(): void {
    if (!this.running) return;
    const current = new Set(this.pool.endpoints);
    for (const [ep, loop] of this.loops) {
      if (current.has(ep)) continue;
      this.stopLoop(loop);
      this.loops.delete(ep);
      const scrape = this.inProgress.get(ep);
      if (scrape !== undefined) {
        scrape.abortReason ??= 'removed';
        scrape.controller.abort();
      }
    }
    for (const ep of this.pool.endpoints) {
      if (this.loops.has(ep)) continue;
      const loop: ScrapeLoop = { ep, active: true, timer: undefined, failingSince: undefined };
      this.loops.set(ep, loop);
      this.runLoopIteration(loop);
    }
  }

  private stopLoop(loop: ScrapeLoop): void {
    loop.active = false;
    if (loop.timer !== undefined) clearTimeout(loop.timer);
    loop.timer = undefined;
  }

  private runLoopIteration(loop: ScrapeLoop): void {
    loop.timer = undefined;
    if (!loop.active) return;
    // scrapeOnce never rejects; the rejection handler is a belt against future edits.
    const next = (): void => this.scheduleNext(loop);
    this.scrapeOnce(loop.ep).then(next, next);
  }

  private scheduleNext(loop: ScrapeLoop): void {
    if (!loop.active) return;
    const now = this.clock.now();
    if (loop.ep.lastError === undefined) loop.failingSince = undefined;
    else loop.failingSince ??= now;
    loop.timer = setTimeout(() => this.runLoopIteration(loop), scrapeDelay(this.intervalMs, loop.failingSince === undefined ? 0 : now - loop.failingSince));
    loop.timer.unref();
  }

  private getAgent(): Agent {
    // A dispatcher of its own: scrape sockets never compete with proxied traffic for connections.
    // Keep-alive stays at undici's default, which honours the server's Keep-Alive hint, so an idle
    // socket is dropped before the server (uvicorn: 5 s) closes it under us.
    this.agent ??= new Agent({
      connect: { timeout: this.timeoutMs },
      headersTimeout: this.timeoutMs,
      bodyTimeout: this.timeoutMs,
    });
    return this.agent;
  }

  private async runScrape(ep: Endpoint, scrape: InProgressScrape): Promise<void> {
    const deadline = setTimeout(() => {
      scrape.abortReason ??= 'timeout';
      scrape.controller.abort();
    }, this.timeoutMs);
    deadline.unref();

    let result: ScrapeResult;
    this.pool.scrapeStarted(ep);
    try {
      const text = await this.fetchText(ep, scrape);
      result = { metrics: extractVllmMetrics(text, ep.engineType) };
    } catch (err) {
      const error = scrape.abortReason === 'timeout' ? `timed out after ${this.timeoutMs} ms` : describeError(err);
      result = scrape.answered ? { error, answered: true } : { error };
    } finally {
      clearTimeout(deadline);
    }

    if (scrape.abortReason === 'stopped' || scrape.abortReason === 'removed') return;
    const wasFailing = ep.lastError !== undefined;
    try {
      this.pool.recordScrape(ep, result, this.clock.now());
    } catch (err) {
      // A pool listener threw; the scrape itself is recorded. Report it rather than lose it.
      this.reportError(ep, `pool listener failed after scrape: ${describeError(err)}`);
    }
    if ('error' in result) this.reportError(ep, result.error);
    else if (wasFailing && this.onRecovered !== undefined) {
      try {
        this.onRecovered(ep);
      } catch {
        // A failing hook must not break the loop.
      }
    }
  }

  private reportError(ep: Endpoint, message: string): void {
    if (this.onError === undefined) return;
    try {
      this.onError(ep, message);
    } catch {
      // A failing error hook must not break the loop.
    }
  }

  private async fetchText(ep: Endpoint, scrape: InProgressScrape): Promise<string> {
    const { statusCode, headers, body } = await this.getAgent().request({
      origin: ep.origin,
      path: this.path,
      method: 'GET',
      headers: SCRAPE_HEADERS,
      signal: scrape.controller.signal,
    });
    scrape.answered = true;
    // Errors surface through the iterator or dump(); without a listener, destroying an unread body
    // (or an abort landing between reads) would emit an 'error' nobody handles: an uncaught exception.
    body.on('error', ignoreError);
    let consumed = false;
    try {
      if (statusCode !== 200) {
        // Drain a small error body so the connection stays reusable.
        await body.dump({ limit: 64 * 1024 }).catch(() => undefined);
        consumed = true;
        throw new ScrapeHttpError(`HTTP ${statusCode} from ${this.path}`);
      }
      const encoding = headers['content-encoding'];
      if (encoding !== undefined && encoding !== 'identity') {
        throw new ScrapeHttpError(`unsupported content-encoding '${String(encoding)}'`);
      }
      const declared = headers['content-length'];
      if (typeof declared === 'string' && Number(declared) > this.maxBytes) {
        throw new ScrapeHttpError(`body of ${declared} bytes exceeds the ${this.maxBytes}-byte limit`);
      }
      const chunks: Buffer[] = [];
      let total = 0;
      for await (const chunk of body as AsyncIterable<Buffer>) {
        total += chunk.length;
        if (total > this.maxBytes) throw new ScrapeHttpError(`body exceeds the ${this.maxBytes}-byte limit`);
        chunks.push(chunk);
      }
      consumed = true;
      // Decode once at the end so a multi-byte character split across chunks stays intact.
      return chunks.length === 1 ? chunks[0]!.toString('utf8') : Buffer.concat(chunks, total).toString('utf8');
    } finally {
      if (!consumed) body.destroy();
    }
  }
}
