/**
 * The soak's client side (bench/soak.ts): an open-loop load generator (Poisson arrivals at a fixed
 * rate, undici) sending a mix of streaming and non-streaming chat/completions requests, a share of
 * which the client aborts at a random moment; and a /health prober timing round-trips through the
 * gateway's event loop. Every request ends in exactly one client-side outcome.
 *
 * Bounded: arrivals stop at the deadline; at most `maxOutstanding` requests are open (arrivals past
 * that are counted as `skipped`, not sent); each request is cut after `requestTimeoutMs`.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Agent, Client, request } from 'undici';
import { expGapMs } from './stats.js';

export type Outcome =
  /** 2xx and a complete answer (JSON parsed, or an SSE stream ending in [DONE]). */
  | 'ok'
  /** A non-2xx status, body read (the status is in `statuses`). */
  | 'http-error'
  /** Status 200 SSE that ended with an error event (the gateway's "upstream failed mid-stream"). */
  | 'stream-error-event'
  /** Status 200 SSE that ended without [DONE] and without an error event. */
  | 'stream-truncated'
  /** Status 200 JSON that did not parse. */
  | 'json-invalid'
  /** The client's random abort fired before the response headers arrived. */
  | 'aborted-before-headers'
  /** The client's random abort fired while the body was being read. */
  | 'aborted-after-headers'
  /** Cut by the client after requestTimeoutMs. */
  | 'timeout'
  /** The connection failed without the client asking for it (code in `transportErrors`). */
  | 'transport-error';

export interface LoadOptions {
  apiUrl: string;
  model: string;
  rps: number;
  durationMs: number;
  random: () => number;
  /** Share of streaming requests. */
  streamShare: number;
  /** Share of requests the client aborts, at a uniform random time in [0, maxAbortDelayMs). */
  abortShare: number;
  maxAbortDelayMs: number;
  requestTimeoutMs: number;
  maxOutstanding: number;
  /** Share of requests sent with the sheddable objective (`batch`, priority < 0). */
  sheddableShare: number;
  tenants: number;
}

export interface ClientTally {
  /** Requests started (each ends in exactly one outcome). */
  sent: number;
  /** Arrivals not sent because maxOutstanding requests were open. */
  skipped: number;
  /** Requests started but not finished yet. */
  inFlight: number;
  streaming: number;
  /** Requests that drew a random abort (whether or not it fired before the answer was complete). */
  abortsPlanned: number;
  outcomes: Record<Outcome, number>;
  /** Status codes seen (excluding requests aborted before headers), as strings. */
  statuses: Record<string, number>;
  transportErrors: Record<string, number>;
  /** Latencies (ms) of `ok` answers: non-streaming total, streaming first byte and total. */
  latencyJsonMs: number[];
  ttfbStreamMs: number[];
  latencyStreamMs: number[];
}

const PREFIXES = [
  'You are a helpful assistant. Summarise the following support ticket in one sentence:',
  'Translate the following paragraph into French, keeping technical terms in English:',
  'You are a code reviewer. Point out the single most important problem in this diff:',
  'Answer the question using only the context below. Context: the gateway routes requests to model servers.',
];
const WORDS = 'the a gateway request stream token model server queue flow fair latency cache prefix endpoint pool abort retry metric soak'.split(' ');

function prompt(random: () => number): string {
  const prefix = PREFIXES[Math.floor(random() * PREFIXES.length)]!;
  const n = 5 + Math.floor(random() * 60);
  const words: string[] = [];
  for (let i = 0; i < n; i++) words.push(WORDS[Math.floor(random() * WORDS.length)]!);
  return `${prefix} ${words.join(' ')}`;
}

function emptyOutcomes(): Record<Outcome, number> {
  return {
    ok: 0,
    'http-error': 0,
    'stream-error-event': 0,
    'stream-truncated': 0,
    'json-invalid': 0,
    'aborted-before-headers': 0,
    'aborted-after-headers': 0,
    timeout: 0,
    'transport-error': 0,
  };
}

export interface LoadRun {
  tally: ClientTally;
  /** Resolves when arrivals stopped and every started request has its outcome. */
  done: Promise<ClientTally>;
  /** Stops arrivals early (requests already open still finish). */
  stop(): void;
  /** Closes the connection pool (after `done`). */
  close(): Promise<void>;
}

export function startLoad(o: LoadOptions): LoadRun {
  const tally: ClientTally = {
    sent: 0,
    skipped: 0,
    inFlight: 0,
    streaming: 0,
    abortsPlanned: 0,
    outcomes: emptyOutcomes(),
    statuses: {},
    transportErrors: {},
    latencyJsonMs: [],
    ttfbStreamMs: [],
    latencyStreamMs: [],
  };
  const agent = new Agent({ connections: o.maxOutstanding, keepAliveTimeout: 10_000, pipelining: 1 });
  const inc = (rec: Record<string, number>, key: string) => (rec[key] = (rec[key] ?? 0) + 1);
  const open = new Set<Promise<void>>();

  async function one(i: number): Promise<void> {
    const r = o.random;
    const stream = r() < o.streamShare;
    const chat = r() < 0.8;
    const maxTokens = 8 + Math.floor(r() * 57);
    const abortAfter = r() < o.abortShare ? r() * o.maxAbortDelayMs : -1;
    const sheddable = r() < o.sheddableShare;
    const tenant = `tenant-${Math.floor(r() * o.tenants)}`;
    const text = prompt(r);
    const body = chat
      ? { model: o.model, stream, max_tokens: maxTokens, messages: [{ role: 'user', content: text }], ...(stream && i % 2 === 0 ? { stream_options: { include_usage: true } } : {}) }
      : { model: o.model, stream, max_tokens: maxTokens, prompt: text };
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-llm-d-inference-fairness-id': tenant };
    if (sheddable) headers['x-llm-d-inference-objective'] = 'batch';

    if (stream) tally.streaming++;
    if (abortAfter >= 0) tally.abortsPlanned++;
    const ac = new AbortController();
    let why: 'abort' | 'timeout' | undefined;
    const abortTimer = abortAfter >= 0 ? setTimeout(() => ((why ??= 'abort'), ac.abort()), abortAfter) : undefined;
    const timeoutTimer = setTimeout(() => ((why ??= 'timeout'), ac.abort()), o.requestTimeoutMs);
    const t0 = performance.now();
    let gotHeaders = false;
    let outcome: Outcome;
    try {
      const res = await request(`${o.apiUrl}${chat ? '/v1/chat/completions' : '/v1/completions'}`, {
        method: 'POST',
        headers,
        body: JSON.stringify(body),
        signal: ac.signal,
        dispatcher: agent,
      });
      gotHeaders = true;
      inc(tally.statuses, String(res.statusCode));
      const sse = String(res.headers['content-type'] ?? '').startsWith('text/event-stream');
      if (res.statusCode >= 200 && res.statusCode < 300 && sse) {
        let text = '';
        let first = -1;
        for await (const chunk of res.body) {
          if (first < 0) first = performance.now() - t0;
          text += (chunk as Buffer).toString();
        }
        if (text.includes('data: {"error"')) outcome = 'stream-error-event';
        else if (text.trimEnd().endsWith('data: [DONE]')) {
          outcome = 'ok';
          tally.ttfbStreamMs.push(first);
          tally.latencyStreamMs.push(performance.now() - t0);
        } else outcome = 'stream-truncated';
      } else {
        const text = await res.body.text();
        if (res.statusCode >= 200 && res.statusCode < 300) {
          try {
            JSON.parse(text);
            outcome = 'ok';
            tally.latencyJsonMs.push(performance.now() - t0);
          } catch {
            outcome = 'json-invalid';
          }
        } else outcome = 'http-error';
      }
    } catch (err) {
      if (why === 'abort') outcome = gotHeaders ? 'aborted-after-headers' : 'aborted-before-headers';
      else if (why === 'timeout') outcome = 'timeout';
      else {
        outcome = 'transport-error';
        const e = err as { code?: string; name?: string; message?: string };
        inc(tally.transportErrors, e.code ?? e.name ?? String(e.message));
      }
    } finally {
      clearTimeout(abortTimer);
      clearTimeout(timeoutTimer);
    }
    tally.outcomes[outcome]++;
  }

  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let finishArrivals!: () => void;
  const arrivalsOver = new Promise<void>((r) => (finishArrivals = r));
  const startedAt = performance.now();
  const endAt = startedAt + o.durationMs;
  let nextAt = startedAt + expGapMs(o.rps, o.random);

  const launchDue = (): void => {
    timer = undefined;
    const now = performance.now();
    while (!stopped && nextAt <= now && nextAt < endAt) {
      if (open.size >= o.maxOutstanding) tally.skipped++;
      else {
        const i = tally.sent++;
        tally.inFlight++;
        const p: Promise<void> = one(i)
          .catch(() => {
            // one() classifies every error itself; this is a last resort so nothing is lost
            tally.outcomes['transport-error']++;
            inc(tally.transportErrors, 'internal');
          })
          .finally(() => {
            tally.inFlight--;
            open.delete(p);
          });
        open.add(p);
      }
      nextAt += expGapMs(o.rps, o.random);
    }
    if (stopped || nextAt >= endAt) {
      finishArrivals();
      return;
    }
    timer = setTimeout(launchDue, Math.max(0, nextAt - performance.now()));
  };
  timer = setTimeout(launchDue, Math.max(0, nextAt - performance.now()));

  const done = (async () => {
    await arrivalsOver;
    while (open.size > 0) await Promise.allSettled([...open]);
    return tally;
  })();

  return {
    tally,
    done,
    stop() {
      stopped = true;
      if (timer !== undefined) {
        clearTimeout(timer);
        timer = undefined;
      }
      finishArrivals();
    },
    close: () => agent.close(),
  };
}

export interface HealthProbe {
  /** Round-trip times (ms) since the last `take()`, failed probes, and the bench's own loop delay max (ms) in that window. */
  take(): { rtts: number[]; failures: number; ownMaxMs: number };
  /** Every RTT so far. */
  all: number[];
  failures: number;
  /** The bench's own event-loop delay (ms, max and p99 over the run): how much of an RTT may be ours. */
  ownDelay(): { maxMs: number; p99Ms: number };
  stop(): Promise<void>;
}

/**
 * GET `url` every `periodMs` on a dedicated connection (never queued behind the load), sequentially.
 * The RTT is an upper bound of the gateway's event-loop delay: it also contains the network stack and
 * the bench's own event loop.
 */
export function startHealthProbe(origin: string, path: string, periodMs: number, timeoutMs: number): HealthProbe {
  const client = new Client(origin, { pipelining: 1, keepAliveTimeout: 30_000 });
  const own = monitorEventLoopDelay({ resolution: 10 });
  own.enable();
  const ownWindow = monitorEventLoopDelay({ resolution: 10 });
  ownWindow.enable();
  const all: number[] = [];
  let window: number[] = [];
  let windowFailures = 0;
  let failures = 0;
  let running = true;
  const loop = (async () => {
    while (running) {
      const t0 = performance.now();
      try {
        const res = await client.request({ method: 'GET', path, signal: AbortSignal.timeout(timeoutMs) });
        await res.body.dump();
        if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}`);
        const rtt = performance.now() - t0;
        all.push(rtt);
        window.push(rtt);
      } catch {
        failures++;
        windowFailures++;
        const rtt = performance.now() - t0;
        all.push(rtt);
        window.push(rtt);
      }
      const wait = periodMs - (performance.now() - t0);
      if (running && wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
  })();
  return {
    all,
    get failures() {
      return failures;
    },
    take() {
      const out = { rtts: window, failures: windowFailures, ownMaxMs: ownWindow.max / 1e6 };
      window = [];
      windowFailures = 0;
      ownWindow.reset();
      return out;
    },
    ownDelay: () => ({ maxMs: own.max / 1e6, p99Ms: own.percentile(99) / 1e6 }),
    async stop() {
      running = false;
      await loop;
      own.disable();
      ownWindow.disable();
      await client.close();
    },
  };
}
