/**
 * The model of one vLLM instance, free of HTTP: `maxNumSeqs` running slots, a FIFO waiting queue,
 * a per-instance LRU of chained prompt-block hashes (prefix cache; a prompt's tail is evicted
 * before its head, as vLLM frees a request's blocks in reverse order), and a latency model
 * (TTFT = overhead + cost per uncached prompt token; then one token every `itlMs`).
 *
 * Prefill/decode disaggregation (vLLM NixlConnector, as the llm-d simulator): a prefill request
 * (`remoteDecode`) produces exactly one token and finishes with `remote_decode`; a decode request
 * whose prompt KV comes from a prefiller (`remotePrefill`) pays a KV-transfer latency
 * (`kvTransferMs + kvTransferMsPerToken × uncached prompt tokens`) instead of the prefill cost.
 *
 * Parallel sampling (vLLM V1, `n > 1`): the HTTP layer submits n child requests that share one
 * GenerationInput; each takes its own running slot (or queue place) and generates its own tokens.
 * A child submitted with a `sibling` shares that sibling's prompt blocks once the sibling holds
 * them (vLLM V1 caches a step's full blocks as it schedules them, so the 2nd..nth child of a
 * prompt hit the 1st's blocks even in the same step).
 *
 * Time is injected (a Clock for "now" and SimTimers for callbacks) so tests can drive it with
 * virtual time; every token's due time is computed from the first-token time, so real timers
 * do not accumulate drift.
 */
import { MAX_TIMER_DELAY_MS, systemClock, type Clock } from '../util/clock.js';

/** Timer facility; the default wraps setTimeout/setImmediate. */
export interface SimTimers {
  set(callback: () => void, delayMs: number): unknown;
  clear(handle: unknown): void;
}

interface RealTimerHandle {
  readonly immediate: boolean;
  readonly ref: NodeJS.Timeout | NodeJS.Immediate;
}

export const realTimers: SimTimers = {
  set(callback, delayMs): RealTimerHandle {
    // setTimeout(0) waits ≥1 ms; zero-latency benchmarks want the next turn of the loop instead.
    if (delayMs <= 0) return { immediate: true, ref: setImmediate(callback) };
    // Past Node's longest timer, setTimeout fires after 1 ms: a "server that never answers" would answer at once.
    return { immediate: false, ref: setTimeout(callback, Math.min(delayMs, MAX_TIMER_DELAY_MS)) };
  },
  clear(handle) {
    const h = handle as RealTimerHandle;
    if (h.immediate) clearImmediate(h.ref as NodeJS.Immediate);
    else clearTimeout(h.ref as NodeJS.Timeout);
  },
};

/** Settings that can change at run time (POST /admin/config). */
export interface SimLatencySettings {
  ttftOverheadMs: number;
  prefillMsPerToken: number;
  itlMs: number;
  maxNumSeqs: number;
  maxWaiting: number;
  /** P/D decode: fixed part of the KV-transfer latency that replaces prefill. */
  kvTransferMs: number;
  /** P/D decode: KV-transfer cost per uncached prompt token. */
  kvTransferMsPerToken: number;
}

/** What SimEngineOptions default to (also shown by `sluice sim --help`). */
export const ENGINE_DEFAULTS = {
  maxNumSeqs: 8,
  maxWaiting: 1000,
  ttftOverheadMs: 20,
  prefillMsPerToken: 0.1,
  itlMs: 5,
  kvTransferMs: 1,
  kvTransferMsPerToken: 0.01,
  blockSizeTokens: 16,
  numGpuBlocks: 4096,
  defaultOutputTokens: 16,
  maxOutputTokens: 256,
} as const;

export interface SimEngineOptions {
  /** Concurrent running requests (vLLM --max-num-seqs). Default 8. */
  maxNumSeqs?: number;
  /** Waiting-queue capacity; a request beyond it is refused (HTTP 429). Default 1000. */
  maxWaiting?: number;
  /** Fixed part of the time to first token. Default 20. */
  ttftOverheadMs?: number;
  /** Prefill cost per uncached prompt token. Default 0.1. */
  prefillMsPerToken?: number;
  /** Inter-token latency. Default 5. */
  itlMs?: number;
  /** P/D decode (kv_transfer_params.do_remote_prefill): fixed KV-transfer latency. Default 1. */
  kvTransferMs?: number;
  /** P/D decode: KV-transfer cost per uncached prompt token. Default 0.01. */
  kvTransferMsPerToken?: number;
  /** Tokens per KV block (vLLM --block-size). Default 16. */
  blockSizeTokens?: number;
  /** KV blocks in the GPU cache: LRU capacity and the denominator of kv_cache_usage_perc. Default 4096. */
  numGpuBlocks?: number;
  /** Output length when the request sets no max_tokens. Default 16. */
  defaultOutputTokens?: number;
  /** Upper bound on output length. Default 256. */
  maxOutputTokens?: number;
  clock?: Clock;
  timers?: SimTimers;
}

/** One generation request as the engine sees it (already validated by the HTTP layer). */
export interface GenerationInput {
  /** Text whose length gives the prompt tokens (chars/4) and whose blocks are hashed (unless promptTokenIds is set). */
  promptText: string;
  /**
   * A prompt given as token ids: exactly that many prompt tokens, and block identity comes from the
   * ids (blockSizeTokens ids a block), so token-id prompts sharing leading ids share cached blocks.
   * promptText is then not used.
   */
  promptTokenIds?: readonly number[];
  /** max_completion_tokens ?? max_tokens, when the client set one. */
  maxTokens?: number;
  /** Tokens the context window leaves after the prompt (vLLM's max_model_len − prompt), when limited. */
  contextRoom?: number;
  /** vLLM cache_salt: seeds the hash chain so salted tenants never share blocks. */
  cacheSalt?: string;
  /** P/D prefill leg (kv_transfer_params.do_remote_decode): one token, finish reason `remote_decode`. */
  remoteDecode?: boolean;
  /** P/D decode leg (kv_transfer_params.do_remote_prefill): KV-transfer latency instead of prefill. */
  remotePrefill?: boolean;
}

export type FinishReason = 'stop' | 'length' | 'abort' | 'remote_decode';

export interface GenerationResult {
  finishReason: FinishReason;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  /** The whole output; only filled for listeners without onToken (non-streaming answers). */
  text: string;
}

export interface GenerationListener {
  /**
   * Called for each output token when it is produced (streaming); `finishReason` is set on the
   * last token only. When absent, the engine skips
   * per-token timers and only reports completion, which keeps non-streaming load cheap.
   */
  onToken?(text: string, index: number, finishReason: FinishReason | null): void;
  /** Called once when the request finishes normally (not after abort()). */
  onFinish(result: GenerationResult): void;
}

export type RequestState = 'waiting' | 'running' | 'finished' | 'aborted';

export interface SimRequestHandle {
  readonly id: number;
  readonly state: RequestState;
  readonly promptTokens: number;
  readonly outputTokens: number;
  /** Prompt tokens found in the prefix cache; known once the request is admitted. */
  readonly cachedTokens: number;
  /** Frees the slot (or queue place) at once and admits the next waiting request. Idempotent. */
  abort(): void;
}

/** How one child of a parallel-sampling (`n > 1`) request relates to its siblings. */
export interface SubmitOptions {
  /**
   * An earlier child of the same prompt (same GenerationInput). Once it holds its KV blocks (it was
   * admitted), this child's full prompt blocks hit them, as in vLLM V1.
   */
  sibling?: SimRequestHandle;
  /** Which of the n children (0 = the output an n = 1 request gets): varies the output text. */
  choice?: number;
}

export type SubmitResult =
  | { accepted: true; request: SimRequestHandle }
  | { accepted: false; reason: 'queue_full' };

/** Values the /metrics gauges report; each may be pinned by the admin API. */
export interface SimGauges {
  waiting: number;
  running: number;
  kvUsage: number;
}

/** `null` (or absent in a patch) means "report the real value". */
export interface SimPins {
  waiting: number | null;
  running: number | null;
  kvUsage: number | null;
}

export interface SimCounters {
  promptTokens: number;
  generationTokens: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
  /** Finished requests by finish reason (vLLM counts aborts here too). */
  requestSuccess: Record<FinishReason, number>;
}

/** vLLM's time_to_first_token_seconds buckets (upper bounds, seconds). */
export const TTFT_BUCKETS_SECONDS: readonly number[] = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
  160, 640, 2560,
];

export interface HistogramSnapshot {
  /** Non-cumulative counts per bucket of TTFT_BUCKETS_SECONDS, plus one overflow slot (+Inf). */
  counts: readonly number[];
  sum: number;
  count: number;
}

export const CHARS_PER_TOKEN = 4;

/** Prompt-token estimate shared by the engine and its callers. */
export function estimateTokens(text: string): number {
  return Math.max(1, Math.ceil(text.length / CHARS_PER_TOKEN));
}

/** A prompt's tokens: the number of its token ids, else the estimate from its text. */
export function promptTokensOf(input: Pick<GenerationInput, 'promptText' | 'promptTokenIds'>): number {
  return input.promptTokenIds !== undefined ? input.promptTokenIds.length : estimateTokens(input.promptText);
}

const VOCABULARY = [
  'the', 'model', 'is', 'simulated', 'and', 'tokens', 'flow', 'through', 'a', 'sluice', 'gate',
  'with', 'steady', 'latency', 'while', 'prefix', 'cache', 'blocks', 'stay', 'warm', 'for',
  'each', 'request', 'in', 'order', 'so', 'tests', 'remain', 'repeatable', 'every', 'time', 'today',
];
const FIRST_TOKENS = VOCABULARY;
const LATER_TOKENS = VOCABULARY.map((w) => ' ' + w);

/** Deterministic output token `index` for a request seeded by its prompt. */
export function outputToken(seed: number, index: number): string {
  const w = (seed + index * 7) % VOCABULARY.length;
  return index === 0 ? FIRST_TOKENS[w]! : LATER_TOKENS[w]!;
}

/**
 * 53-bit string hash (cyrb53) of text[start, end) seeded with the previous block's hash, so a block
 * hash identifies the whole prefix up to and including that block.
 */
function chainHash(text: string, start: number, end: number, prev: number): number {
  let h1 = 0xdeadbeef ^ (prev >>> 0);
  let h2 = 0x41c6ce57 ^ Math.floor(prev / 4294967296);
  for (let i = start; i < end; i++) {
    const ch = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ ch, 2654435761);
    h2 = Math.imul(h2 ^ ch, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 4294967296 * (2097151 & h2) + (h1 >>> 0);
}

/** Chained hashes of every full block of `text` (blockChars characters each). */
export function promptBlockHashes(text: string, blockChars: number, cacheSalt?: string): number[] {
  const full = Math.floor(text.length / blockChars);
  const hashes = new Array<number>(full);
  let prev = cacheSalt ? chainHash(cacheSalt, 0, cacheSalt.length, 0) : 0;
  for (let b = 0; b < full; b++) {
    prev = chainHash(text, b * blockChars, (b + 1) * blockChars, prev);
    hashes[b] = prev;
  }
  return hashes;
}

/**
 * Chained hashes of every full block of a token-id prompt (blockTokens ids each): each id is read as
 * two UTF-16 units, so the text hash chains the ids.
 */
export function tokenIdBlockHashes(ids: readonly number[], blockTokens: number, cacheSalt?: string): number[] {
  let units = '';
  for (const id of ids) units += String.fromCharCode(id & 0xffff, (id >>> 16) & 0xffff);
  return promptBlockHashes(units, blockTokens * 2, cacheSalt);
}

/** LRU set of block hashes; Map iteration order is insertion order, so the first key is the oldest. */
export class BlockLru {
  private readonly entries = new Map<number, true>();
  constructor(private capacity: number) {}

  get size(): number {
    return this.entries.size;
  }

  has(hash: number): boolean {
    return this.entries.has(hash);
  }

  /** Marks the hash most recently used, inserting it (and evicting the oldest) if absent. */
  touch(hash: number): void {
    if (this.entries.has(hash)) this.entries.delete(hash);
    else if (this.entries.size >= this.capacity) {
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.entries.delete(oldest.value);
    }
    this.entries.set(hash, true);
  }

  /** Number of leading hashes present (consecutive from the first), touching the ones that hit (see touchChain). */
  matchPrefix(hashes: readonly number[], limit: number): number {
    let hits = 0;
    const n = Math.min(limit, hashes.length);
    while (hits < n && this.entries.has(hashes[hits]!)) hits++;
    this.touchChain(hashes, hits);
    return hits;
  }

  /**
   * Touches the first `count` hashes of a prompt's chain, the last one first: the head of the prompt
   * ends most recent and is evicted last. vLLM frees a finished request's blocks in reverse order so
   * that the tail blocks are evicted first and the prefix stays reusable.
   */
  touchChain(hashes: readonly number[], count = hashes.length): void {
    for (let i = count - 1; i >= 0; i--) this.touch(hashes[i]!);
  }

  clear(): void {
    this.entries.clear();
  }
}

class EngineRequest implements SimRequestHandle {
  state: RequestState = 'waiting';
  cachedTokens = 0;
  blockHashes: number[] = [];
  /** Admitted at least once: its prompt blocks are allocated (a sibling may share them). */
  blocksAllocated = false;
  admittedAt = 0;
  firstTokenAt = 0;
  itlMs = 0;
  tokensEmitted = 0;
  timer: unknown = undefined;

  constructor(
    readonly id: number,
    private readonly engine: SimEngine,
    readonly input: GenerationInput,
    readonly listener: GenerationListener,
    readonly promptTokens: number,
    readonly outputTokens: number,
    readonly finishReason: FinishReason,
    readonly arrivedAt: number,
    readonly tokenSeed: number,
    readonly sibling: EngineRequest | undefined,
  ) {}

  abort(): void {
    this.engine.abortRequest(this);
  }
}

export class SimEngine {
  readonly blockSizeTokens: number;
  readonly numGpuBlocks: number;
  readonly defaultOutputTokens: number;
  readonly maxOutputTokens: number;
  private readonly clock: Clock;
  private readonly timers: SimTimers;
  private current: SimLatencySettings;
  private pins: SimPins = { waiting: null, running: null, kvUsage: null };

  private readonly running = new Set<EngineRequest>();
  // FIFO as array + head index: O(1) dequeue; aborted entries are skipped lazily.
  private queue: EngineRequest[] = [];
  private queueHead = 0;
  private waitingCount = 0;
  private nextId = 1;
  private readonly lru: BlockLru;

  readonly counters: SimCounters = {
    promptTokens: 0,
    generationTokens: 0,
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
    requestSuccess: { stop: 0, length: 0, abort: 0, remote_decode: 0 },
  };
  private readonly ttftCounts = new Array<number>(TTFT_BUCKETS_SECONDS.length + 1).fill(0);
  private ttftSum = 0;
  private ttftCount = 0;

  constructor(opts: SimEngineOptions = {}) {
    const d = ENGINE_DEFAULTS;
    this.current = {
      ttftOverheadMs: opts.ttftOverheadMs ?? d.ttftOverheadMs,
      prefillMsPerToken: opts.prefillMsPerToken ?? d.prefillMsPerToken,
      itlMs: opts.itlMs ?? d.itlMs,
      maxNumSeqs: opts.maxNumSeqs ?? d.maxNumSeqs,
      maxWaiting: opts.maxWaiting ?? d.maxWaiting,
      kvTransferMs: opts.kvTransferMs ?? d.kvTransferMs,
      kvTransferMsPerToken: opts.kvTransferMsPerToken ?? d.kvTransferMsPerToken,
    };
    this.blockSizeTokens = opts.blockSizeTokens ?? d.blockSizeTokens;
    this.numGpuBlocks = opts.numGpuBlocks ?? d.numGpuBlocks;
    this.defaultOutputTokens = opts.defaultOutputTokens ?? d.defaultOutputTokens;
    this.maxOutputTokens = opts.maxOutputTokens ?? d.maxOutputTokens;
    this.clock = opts.clock ?? systemClock;
    this.timers = opts.timers ?? realTimers;
    this.lru = new BlockLru(this.numGpuBlocks);
    assertPositiveInt('maxNumSeqs', this.current.maxNumSeqs);
    assertNonNegativeInt('maxWaiting', this.current.maxWaiting);
    assertPositiveInt('blockSizeTokens', this.blockSizeTokens);
    assertPositiveInt('numGpuBlocks', this.numGpuBlocks);
    assertPositiveInt('defaultOutputTokens', this.defaultOutputTokens);
    assertPositiveInt('maxOutputTokens', this.maxOutputTokens);
  }

  // ---- run-time settings -------------------------------------------------------------------

  get settings(): Readonly<SimLatencySettings> {
    return { ...this.current };
  }

  /** Latency changes apply to requests admitted afterwards; a larger maxNumSeqs admits at once. */
  configure(patch: Partial<SimLatencySettings>): void {
    const next = { ...this.current, ...patch };
    assertPositiveInt('maxNumSeqs', next.maxNumSeqs);
    assertNonNegativeInt('maxWaiting', next.maxWaiting);
    for (const k of ['ttftOverheadMs', 'prefillMsPerToken', 'itlMs', 'kvTransferMs', 'kvTransferMsPerToken'] as const) {
      if (!(Number.isFinite(next[k]) && next[k] >= 0)) throw new Error(`${k} must be a number ≥ 0`);
    }
    this.current = next;
    this.admitWaiting();
  }

  get pinned(): Readonly<SimPins> {
    return { ...this.pins };
  }

  /** Keys present in the patch are set (a number pins, null unpins); absent keys are unchanged. */
  pin(patch: Partial<SimPins>): void {
    this.pins = { ...this.pins, ...patch };
  }

  // ---- observation -------------------------------------------------------------------------

  /** Real gauge values, ignoring pins. */
  actualGauges(): SimGauges {
    return { waiting: this.waitingCount, running: this.running.size, kvUsage: this.kvUsage() };
  }

  /** What /metrics reports: pinned values where pinned, real ones elsewhere. */
  reportedGauges(): SimGauges {
    const p = this.pins;
    return {
      waiting: p.waiting ?? this.waitingCount,
      running: p.running ?? this.running.size,
      kvUsage: p.kvUsage ?? this.kvUsage(),
    };
  }

  ttftHistogram(): HistogramSnapshot {
    return { counts: [...this.ttftCounts], sum: this.ttftSum, count: this.ttftCount };
  }

  /**
   * KV blocks the running requests hold (prompt + tokens generated so far) over the GPU block count.
   * As in vLLM with prefix caching, running requests that share a prompt prefix share its full
   * blocks, counted once; each request's partial last prompt block and generated tokens are its own.
   */
  private kvUsage(): number {
    const now = this.clock.now();
    const shared = new Set<number>();
    let own = 0;
    for (const r of this.running) {
      for (const hash of r.blockHashes) shared.add(hash);
      own += Math.ceil((r.promptTokens + this.tokensProducedBy(r, now)) / this.blockSizeTokens) - r.blockHashes.length;
    }
    return Math.min(1, (shared.size + own) / this.numGpuBlocks);
  }

  /** vllm:generation_tokens_total as vLLM shows it: every token produced so far, running requests' too (vLLM counts them per engine step). */
  generationTokensNow(): number {
    let n = this.counters.generationTokens;
    const now = this.clock.now();
    for (const r of this.running) n += this.outputSoFar(r, now);
    return n;
  }

  /** Tokens a request has put out: those streamed, or for a whole answer those its time has produced. */
  private outputSoFar(r: EngineRequest, now: number): number {
    return r.listener.onToken ? r.tokensEmitted : this.tokensProducedBy(r, now);
  }

  private tokensProducedBy(r: EngineRequest, now: number): number {
    if (r.admittedAt === 0 || now < r.firstTokenAt) return 0;
    if (r.itlMs <= 0) return r.outputTokens;
    return Math.min(r.outputTokens, 1 + Math.floor((now - r.firstTokenAt) / r.itlMs));
  }

  // ---- requests ----------------------------------------------------------------------------

  /**
   * Whether `count` requests submitted now would all be accepted (a free slot each, else a queue
   * place): a request fanned out into several (n > 1, a prompt batch) is taken whole or refused.
   */
  hasRoomFor(count: number): boolean {
    const s = this.current;
    const free = this.waitingCount === 0 ? Math.max(0, s.maxNumSeqs - this.running.size) : 0;
    return free + (s.maxWaiting - this.waitingCount) >= count;
  }

  submit(input: GenerationInput, listener: GenerationListener, options?: SubmitOptions): SubmitResult {
    const s = this.current;
    const freeSlot = this.running.size < s.maxNumSeqs && this.waitingCount === 0;
    if (!freeSlot && this.waitingCount >= s.maxWaiting) return { accepted: false, reason: 'queue_full' };

    const ids = input.promptTokenIds;
    const promptTokens = promptTokensOf(input);
    // The output's natural length: max_tokens, else the default, at most --max-output-tokens.
    const natural = Math.min(input.maxTokens ?? this.defaultOutputTokens, this.maxOutputTokens);
    const room = input.contextRoom ?? Infinity;
    const outputTokens = input.remoteDecode ? 1 : Math.max(1, Math.min(natural, room));
    // vLLM reports 'length' when generation stops at a limit (the client's max_tokens, the context
    // window), 'stop' on a natural end (here: the output --max-output-tokens allows).
    const finishReason: FinishReason = input.remoteDecode
      ? 'remote_decode'
      : outputTokens === input.maxTokens || outputTokens < natural
        ? 'length'
        : 'stop';
    // The n children of one prompt differ by choice: 13 is odd, so choices 0..31 start at distinct words.
    const seed = (ids !== undefined ? ids.length + ((ids[0] ?? 0) >>> 0) : input.promptText.length + (input.promptText.charCodeAt(0) || 0)) +
      13 * (options?.choice ?? 0);
    const sibling = options?.sibling instanceof EngineRequest ? options.sibling : undefined;
    const r = new EngineRequest(
      this.nextId++, this, input, listener, promptTokens, outputTokens, finishReason,
      this.clock.now(), seed, sibling,
    );
    if (freeSlot) this.admit(r);
    else {
      this.queue.push(r);
      this.waitingCount++;
    }
    return { accepted: true, request: r };
  }

  /** Aborts everything and cancels every timer (server shutdown). */
  dispose(): void {
    // Empty the queue first, or aborting the running requests would admit the waiting ones.
    for (let i = this.queueHead; i < this.queue.length; i++) {
      const r = this.queue[i]!;
      if (r.state === 'waiting') r.state = 'aborted';
    }
    this.queue = [];
    this.queueHead = 0;
    this.waitingCount = 0;
    for (const r of [...this.running]) this.abortRequest(r);
  }

  /** @internal — called through SimRequestHandle.abort(). */
  abortRequest(r: EngineRequest): void {
    if (r.state === 'waiting') {
      r.state = 'aborted';
      // The last one waiting gone: the queue (whose entries hold prompts and listeners) goes too.
      if (--this.waitingCount === 0) {
        this.queue = [];
        this.queueHead = 0;
      }
      return;
    }
    if (r.state !== 'running') return;
    r.state = 'aborted';
    if (r.timer !== undefined) this.timers.clear(r.timer);
    r.timer = undefined;
    this.running.delete(r);
    this.counters.generationTokens += this.outputSoFar(r, this.clock.now());
    this.counters.requestSuccess.abort++;
    this.admitWaiting();
  }

  private admitWaiting(): void {
    while (this.running.size < this.current.maxNumSeqs && this.waitingCount > 0) {
      const r = this.queue[this.queueHead++]!;
      if (r.state !== 'waiting') continue;
      this.waitingCount--;
      this.admit(r);
    }
    if (this.queueHead > 1024 && this.queueHead * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.queueHead);
      this.queueHead = 0;
    }
    if (this.waitingCount === 0 && this.queueHead > 0) {
      this.queue = [];
      this.queueHead = 0;
    }
  }

  private admit(r: EngineRequest): void {
    const s = this.current;
    const now = this.clock.now();
    r.state = 'running';
    r.admittedAt = now;
    r.itlMs = s.itlMs;
    this.running.add(r);

    const sibling = r.sibling?.blocksAllocated ? r.sibling : undefined;
    const ids = r.input.promptTokenIds;
    r.blockHashes = sibling !== undefined
      ? sibling.blockHashes // same prompt: same blocks
      : ids !== undefined
        ? tokenIdBlockHashes(ids, this.blockSizeTokens, r.input.cacheSalt)
        : promptBlockHashes(r.input.promptText, this.blockSizeTokens * CHARS_PER_TOKEN, r.input.cacheSalt);
    r.blocksAllocated = true;
    // Like vLLM, the last prompt token is always computed, so a full-prompt hit stops one block short.
    const lookupLimit = Math.floor((r.promptTokens - 1) / this.blockSizeTokens);
    let hitBlocks = this.lru.matchPrefix(r.blockHashes, lookupLimit);
    // A sibling already holds every full block of this prompt (computed or being computed).
    if (sibling !== undefined) hitBlocks = Math.max(hitBlocks, Math.min(lookupLimit, r.blockHashes.length));
    r.cachedTokens = Math.min(r.promptTokens, hitBlocks * this.blockSizeTokens);
    this.counters.prefixCacheQueries += r.promptTokens;
    this.counters.prefixCacheHits += r.cachedTokens;

    const uncached = r.promptTokens - r.cachedTokens;
    const prefillMs = r.input.remotePrefill ? this.transferDelayMs(uncached) : this.prefillDelayMs(uncached);
    r.firstTokenAt = now + prefillMs;
    r.timer = this.timers.set(() => this.onPrefillDone(r), prefillMs);
  }

  private prefillDelayMs(uncachedTokens: number): number {
    return this.current.ttftOverheadMs + this.current.prefillMsPerToken * uncachedTokens;
  }

  /** P/D decode: the uncached blocks are pulled from the prefiller instead of computed. */
  private transferDelayMs(uncachedTokens: number): number {
    return this.current.kvTransferMs + this.current.kvTransferMsPerToken * uncachedTokens;
  }

  private onPrefillDone(r: EngineRequest): void {
    r.timer = undefined;
    if (r.state !== 'running') return;
    // Blocks become reusable once computed, i.e. after prefill.
    this.lru.touchChain(r.blockHashes);
    this.counters.promptTokens += r.promptTokens;
    this.observeTtft((r.firstTokenAt - r.arrivedAt) / 1000);

    if (r.listener.onToken) {
      this.emitToken(r);
    } else if (r.outputTokens <= 1 || r.itlMs <= 0) {
      this.finish(r);
    } else {
      const doneAt = r.firstTokenAt + (r.outputTokens - 1) * r.itlMs;
      r.timer = this.timers.set(() => {
        r.timer = undefined;
        if (r.state === 'running') this.finish(r);
      }, Math.max(0, doneAt - this.clock.now()));
    }
  }

  private emitToken(r: EngineRequest): void {
    r.timer = undefined;
    // With no inter-token latency every token is due now: emit them in one turn, not one timer each.
    do {
      if (r.state !== 'running') return; // the listener aborted (client went away mid-write)
      const index = r.tokensEmitted++;
      const isLast = r.tokensEmitted >= r.outputTokens;
      r.listener.onToken!(outputToken(r.tokenSeed, index), index, isLast ? r.finishReason : null);
      if (r.state !== 'running') return;
      if (isLast) {
        this.finish(r);
        return;
      }
    } while (r.itlMs <= 0);
    const dueAt = r.firstTokenAt + r.tokensEmitted * r.itlMs;
    r.timer = this.timers.set(() => this.emitToken(r), Math.max(0, dueAt - this.clock.now()));
  }

  private finish(r: EngineRequest): void {
    r.state = 'finished';
    this.running.delete(r);
    this.counters.generationTokens += r.outputTokens;
    this.counters.requestSuccess[r.finishReason]++;
    let text = '';
    if (!r.listener.onToken) {
      for (let i = 0; i < r.outputTokens; i++) text += outputToken(r.tokenSeed, i);
    }
    this.admitWaiting();
    r.listener.onFinish({
      finishReason: r.finishReason,
      promptTokens: r.promptTokens,
      // Like vLLM, a decoder that pulled the prompt's KV from a prefiller counts all of it as cached.
      cachedTokens: r.input.remotePrefill ? r.promptTokens : r.cachedTokens,
      completionTokens: r.outputTokens,
      text,
    });
  }

  private observeTtft(seconds: number): void {
    let i = 0;
    while (i < TTFT_BUCKETS_SECONDS.length && seconds > TTFT_BUCKETS_SECONDS[i]!) i++;
    this.ttftCounts[i]!++;
    this.ttftSum += seconds;
    this.ttftCount++;
  }
}

function assertPositiveInt(name: string, v: number): void {
  if (!(Number.isInteger(v) && v >= 1)) throw new Error(`${name} must be an integer ≥ 1 (got ${v})`);
}

function assertNonNegativeInt(name: string, v: number): void {
  if (!(Number.isInteger(v) && v >= 0)) throw new Error(`${name} must be an integer ≥ 0 (got ${v})`);
}
