/**
 * An endpoint (one model server) as the gateway knows it: identity, labels, role and stage,
 * the last good metrics scraped from it (with their timestamp), and Sluice's own in-flight count.
 *
 * Endpoints are mutable objects owned by the Pool and mutated only on the event loop (scraper
 * results, proxy in-flight accounting); scheduling and detectors read them synchronously.
 */

import { AgeList, type AgeLinked } from '../util/age-list.js';

export const ROLE_LABEL = 'llm-d.ai/role';
export const ENGINE_LABEL = 'llm-d.ai/engine-type';
/** GIE's older name for ENGINE_LABEL, still read by llm-d when the new one is absent. */
export const LEGACY_ENGINE_LABEL = 'inference.networking.k8s.io/engine-type';

/** The engine-type label an endpoint's labels carry: the current one, else the legacy one. */
export function engineLabelOf(labels: Readonly<Record<string, string>>): typeof ENGINE_LABEL | typeof LEGACY_ENGINE_LABEL | undefined {
  return labels[ENGINE_LABEL] !== undefined ? ENGINE_LABEL : labels[LEGACY_ENGINE_LABEL] !== undefined ? LEGACY_ENGINE_LABEL : undefined;
}

/** The engine type an endpoint's labels name, else the pool's default (`pool.metrics.defaultEngine`). */
export function engineTypeOf(labels: Readonly<Record<string, string>>, defaultEngine = 'vllm'): string {
  const label = engineLabelOf(labels);
  return label === undefined ? defaultEngine : labels[label]!;
}

export type Stage = 'prefill' | 'decode' | 'interleaved';

/**
 * A request (or a prefill leg) in flight on an endpoint, which the pool may give up on when the
 * server stalls or goes silent (Pool.rescueStuck): the proxy then sends it to another server, or
 * ends its answer with an error if part of it reached the client.
 */
export interface InFlightAttempt extends AgeLinked<InFlightAttempt> {
  /** Clock time (ms) the server was last heard of for it: the request sent, its status line, a chunk. */
  heardAt: number;
  /**
   * Gives up on it: `why` says what became of its server (`stalled (…)`, `silent (…)`). Whether it
   * did (not for an attempt paused for its client, or already ended).
   */
  abandon(why: string): boolean;
}

/** The `llm-d.ai/role` values llm-d knows (SPEC §6); any other reads as decode. */
export const KNOWN_ROLES: readonly string[] = ['prefill', 'decode', 'both', 'prefill-decode', 'encode', 'encode-prefill', 'encode-prefill-decode'];

/** Normalised role: the label value with `both` mapped to `prefill-decode`; '' when unlabelled. */
export function roleOf(labels: Readonly<Record<string, string>>): string {
  const r = labels[ROLE_LABEL];
  if (r === undefined) return '';
  return r === 'both' ? 'prefill-decode' : r;
}

/**
 * Stage partition of SPEC §6: prefill (`prefill`, `encode-prefill`), interleaved (`prefill-decode`,
 * `both`, `encode-prefill-decode`), decode (everything else, including no label); `encode` → null.
 */
export function stageOf(role: string): Stage | null {
  switch (role) {
    case 'prefill':
    case 'encode-prefill':
      return 'prefill';
    case 'prefill-decode':
    case 'both':
    case 'encode-prefill-decode':
      return 'interleaved';
    case 'encode':
      return null;
    default:
      return 'decode';
  }
}

export interface LoraInfo {
  running: string[];
  waiting: string[];
  maxLora: number;
}

export interface CacheConfigInfo {
  blockSize: number;
  numGpuBlocks: number;
}

/** What we read from a model server's /metrics (SPEC §7.1). */
export interface EndpointMetrics {
  /** vllm:num_requests_waiting, summed over engine series. */
  waiting: number;
  /** vllm:num_requests_running, summed over engine series. */
  running: number;
  /** vllm:kv_cache_usage_perc (fallback gpu_cache_usage_perc), 0..1, averaged over engines. */
  kvUsage: number;
  lora?: LoraInfo;
  cacheConfig?: CacheConfigInfo;
  /** Sum of the engine's work counters (vllm-metrics.ts), when the page has any: it moves while the engine works. */
  progress?: number;
  /** The model the server serves: the `model_name` label of its running-requests series (vLLM: the first served name). */
  model?: string;
}

export interface EndpointSpec {
  name: string;
  address: string;
  port: number;
  labels: Record<string, string>;
  /** The engine type when the labels name none (`pool.metrics.defaultEngine`; vllm when unset). */
  defaultEngine?: string;
}

/**
 * Running slots assumed for a server that has never shown a queue, before its peak doubles it (each
 * scrape can show more running): vLLM's max-num-seqs is rarely below this.
 */
export const SLOW_START_SLOTS = 8;

export class Endpoint {
  readonly name: string;
  readonly address: string;
  readonly port: number;
  // What the labels say; changed only by relabel() (a reload that changed nothing but labels).
  labels!: Readonly<Record<string, string>>;
  role!: string;
  stage!: Stage | null;
  engineType!: string;
  /** `http://host:port` (IPv6 bracketed) — the upstream origin. */
  readonly origin: string;
  /** `host:port` with IPv6 bracketed (for x-prefiller-host-port and logs). */
  readonly hostPort: string;

  /** Last good metrics, or undefined if never scraped successfully. */
  metrics: EndpointMetrics | undefined = undefined;
  /** Clock time (ms) of the last good scrape; 0 = never. A failed scrape leaves it unchanged. */
  metricsAt = 0;
  /** Last scrape error message (cleared on success). */
  lastError: string | undefined = undefined;
  /** Total failed scrapes. */
  scrapeErrors = 0;
  /**
   * Set when a request could not connect (refused, unreachable): the server is gone whatever its
   * last metrics say, so it reads as stale until a scrape begun after that succeeds.
   */
  connectFailure: string | undefined = undefined;
  /** Requests that could not connect, ever; and that count when the scrape now running was sent. */
  connectFailures = 0;
  connectFailuresAtScrapeStart = 0;
  /** Requests Sluice has outstanding on this endpoint right now. */
  inFlight = 0;
  /**
   * Prompt tokens this endpoint has yet to compute for them: the uncached part of each prompt sent
   * to it (scheduling/prompt-load.ts), until its answer's first byte (llm-d's in-flight tokens).
   */
  inFlightTokens = 0;
  /**
   * Of `inFlight` when the last good metrics were recorded, the requests the server's numbers can
   * include: those sent before the scrape was (recordScrape). A request sent while the scrape was
   * on its way is not in the page, though it is in flight when the page lands.
   */
  inFlightAtScrape = 0;
  /** Requests ever sent to this endpoint (acquire); a scrape notes it when it starts. */
  dispatched = 0;
  /** `dispatched` when the scrape now running (or the last one) was sent. */
  dispatchedAtScrapeStart = 0;
  /**
   * Running slots the server has shown it can hold: the most requests seen running while others
   * waited (vLLM's max-num-seqs, or fewer when its KV cache is the limit). 0 until a queue was seen.
   */
  observedSlots = 0;
  /** The most requests the server was ever scraped running (what it has shown it can start at least). */
  peakRunning = 0;
  /**
   * Slow-start slots grown by use (Pool.release): one more for each request answered (2xx) that
   * finished while Sluice had all the assumed slots outstanding and the server had never shown a
   * queue, at most twice what was assumed when the last page landed (`slowStartAtScrape`). A server
   * that answers within a scrape interval is rarely caught running much, yet it keeps up with every
   * request sent: without this, its peak would cap it at a handful of slots and its own answers
   * would read as a queue. A failed request proves nothing (a server failing at once would
   * otherwise draw ever more), and the cap keeps a small server that finishes fast from taking a
   * backlog before a page shows its queue.
   */
  grownSlots = 0;
  /** `slowStartSlots()` when the last good page landed (0 before the first): the growth's base. */
  slowStartAtScrape = 0;
  /** Set when the endpoint left the pool; in-flight requests still finish. */
  removed = false;
  /**
   * The endpoint that took over this one's server (same address and port under a new name, Pool.setEndpoints)
   * and its in-flight count: the requests still in flight here are released against it.
   */
  successor: Endpoint | undefined = undefined;
  // Outlier detection (outlier.ts): failed requests and ejections since the last 2xx answer, and
  // the clock time (ms) until which the endpoint is set aside (0 = never was).
  failureStreak = 0;
  ejections = 0;
  ejectedUntil = 0;
  /** Why it was last ejected (the failures and the last error), for logs and /debug/pool. */
  ejectedFor: string | undefined = undefined;
  /** When its page last changed, or it owed no work (clock ms): a stall's start (outlier.ts). */
  progressAt = 0;
  /** Set while it owes work and its page has not changed for `stallTimeout` (outlier.ts): why. */
  stalledFor: string | undefined = undefined;
  /** Clock time of the first scrape that got no answer at all since the last answered one (Pool.rescueStuck). */
  unansweredSince: number | undefined = undefined;
  /** What is in flight here and can be given up on (Pool.rescueStuck); linked through them, not a Set (age-list.ts: why). */
  readonly attempts = new AgeList<InFlightAttempt>();
  /**
   * When work was last given up on here while it stalled (clock ms; 0: not since its page last
   * moved, Pool.rescueStuck): still owed for one more stallTimeout, so that the stall does not end
   * only because its requests went elsewhere (the next ones would wait as long again).
   */
  gaveUpOnWorkAt = 0;
  /** Requests in flight sent while it was on probation (Pool.acquire): its probe. */
  probes = 0;
  /** Of inFlightTokens: held for a sidecar's prefill leg, which Sluice cannot see end (not owed work). */
  unseenPromptTokens = 0;
  /** The model its pages last named (EndpointMetrics.model); undefined until one did (Pool.eligibleFor). */
  servedModel: string | undefined = undefined;

  constructor(spec: EndpointSpec) {
    this.name = spec.name;
    this.address = spec.address;
    this.port = spec.port;
    this.relabel(spec.labels, spec.defaultEngine);
    const host = spec.address.includes(':') && !spec.address.startsWith('[') ? `[${spec.address}]` : spec.address;
    this.hostPort = `${host}:${spec.port}`;
    this.origin = `http://${this.hostPort}`;
  }

  /**
   * New labels for the same server (same name, address and port): its role, stage and engine type
   * follow them, while its in-flight count, metrics and learned slots stay — requests in flight
   * release against this object, so replacing it would let a limit be exceeded.
   */
  relabel(labels: Readonly<Record<string, string>>, defaultEngine?: string): void {
    this.labels = Object.freeze({ ...labels });
    this.role = roleOf(this.labels);
    this.stage = stageOf(this.role);
    this.engineType = engineTypeOf(this.labels, defaultEngine);
  }

  /** Set aside by outlier detection at `now` (ejected for failing, or stalled): it takes no requests. */
  isSetAside(now: number): boolean {
    return this.ejectedUntil > now || this.stalledFor !== undefined;
  }

  /** Age of the last good metrics in ms (Infinity when never scraped). */
  metricsAge(now: number): number {
    return this.metricsAt === 0 ? Infinity : now - this.metricsAt;
  }

  /**
   * The server's waiting queue now, reckoned from the last scrape and what Sluice did since (NaN
   * without metrics). `n = inFlight − inFlightAtScrape`: requests sent minus requests finished since
   * the scrape. A finished request freed a slot that a waiting one took, so `n < 0` shortens the
   * queue; a request sent since fills a free slot first (free = slots − running; none while the
   * server had a queue), then waits. Slots = `shownSlots` once a queue has been seen; before, the
   * slow start of `slowStartSlots`.
   */
  estimatedWaiting(): number {
    const m = this.metrics;
    if (m === undefined) return NaN;
    const n = this.inFlight - this.inFlightAtScrape;
    if (n <= 0) return Math.max(0, m.waiting + n);
    const slots = this.observedSlots > 0 ? this.shownSlots() : this.slowStartSlots();
    const free = m.waiting > 0 ? 0 : Math.max(0, slots - m.running);
    return m.waiting + Math.max(0, n - free);
  }

  /**
   * Slots assumed while the server has never shown a queue: SLOW_START_SLOTS, twice the most it was
   * seen running, or what finishing requests proved (`grownSlots`), whichever is most. So a server
   * just added (or never loaded) is not handed a whole backlog before its first scrape shows its size,
   * and one kept busy grows its share by use, as a TCP window does.
   */
  slowStartSlots(): number {
    const shown = 2 * this.peakRunning;
    const most = shown > this.grownSlots ? shown : this.grownSlots;
    return most > SLOW_START_SLOTS ? most : SLOW_START_SLOTS;
  }

  /**
   * Running slots, once the server has shown a queue (0 before): the most it was ever scraped
   * running, with or without a queue. One page with a brief queue and few running (a prompt held
   * back by the token budget or a LoRA limit) must not set it below what the server has run, for
   * good; while a page shows a queue, no slot counts as free anyway.
   */
  shownSlots(): number {
    if (this.observedSlots === 0) return 0;
    return this.peakRunning > this.observedSlots ? this.peakRunning : this.observedSlots;
  }

  /**
   * The queue a request sent now would join (NaN without metrics; `queue-scorer`): the scraped
   * waiting queue, plus one when no running slot is free, since the request then waits for a slot
   * too. Running = the scraped count plus what Sluice sent and saw finish since; slots are unknown,
   * and assumed free, until the server has shown a queue (`shownSlots`).
   */
  queueAhead(): number {
    const m = this.metrics;
    if (m === undefined) return NaN;
    if (m.waiting > 0) return m.waiting + 1;
    const slots = this.shownSlots();
    if (slots === 0) return 0;
    return m.running + this.inFlight - this.inFlightAtScrape >= slots ? 1 : 0;
  }
}
