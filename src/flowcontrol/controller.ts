/**
 * The flow controller (SPEC §6, reference §2.4–2.10): every request waits here until the pool has
 * room for it, then leaves exactly once with an outcome.
 *
 * Structure: priority bands (highest first) → flows (fairness id) → requests, each flow an indexed
 * heap ordered by the band's ordering policy. One more heap holds every queued request that can
 * expire, keyed by its current deadline, with ONE timer for the earliest — so expiry is exact and
 * costs O(log n), not a periodic sweep.
 *
 * Single-threaded and synchronous: `enqueue` runs the dispatch loop at once (an unsaturated gateway
 * adds no latency), and `Dispatched` is reported inside the dispatch cycle so the caller can count
 * the request in flight before the next saturation sample.
 *
 * Deliberate divergences from llm-d, each because Node's single thread makes the simpler thing exact:
 * - A cancelled or expired request leaves its heap at once (llm-d leaves "zombies" until the next
 *   1 s sweep, still counting against capacity).
 * - TTL expiry fires at the deadline, not at the next 1 s sweep.
 * - A flow is removed as soon as it is empty (llm-d collects flows idle for 5 min). There is no
 *   per-flow state worth keeping; a round-robin cursor is the selector's and survives by id.
 * - Dispatch runs on events (arrival, `kick`, the saturation-change timer) rather than a 1 ms ticker,
 *   looping cycles until one dispatches nothing and re-sampling saturation every cycle.
 * - Band limits ≤ 0 are treated as unlimited (the config loader never produces them).
 */
import sortedBtree from 'sorted-btree';
import type { FlowControlConfig, PriorityBandConfig } from '../config/types.js';
import { MAX_TIMER_DELAY_MS, type Clock } from '../util/clock.js';
import { IndexedHeap, NOT_IN_HEAP } from './heap.js';
import type {
  BandView,
  FairnessPolicy,
  FlowSelector,
  FlowView,
  OrderingPolicy,
  QueuedItemView,
  UsageLimitPolicy,
} from './policies/types.js';
import type { FlowOutcome, FlowRequest, FlowTicket, OutcomeCause } from './types.js';
import { effectiveRequestTtl } from './request-ttl.js';

export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  setImmediate(fn: () => void): unknown;
}

/** Node's timers, unref'ed: a queued request must not keep the process alive on its own. */
export const nodeTimers: Timers = {
  setTimeout(fn, ms) {
    return setTimeout(fn, ms).unref();
  },
  clearTimeout(handle) {
    clearTimeout(handle as NodeJS.Timeout);
  },
  setImmediate(fn) {
    return setImmediate(fn).unref();
  },
};

export interface FlowControllerOptions {
  config: FlowControlConfig;
  /** Priorities of the known objectives; each gets a band (reference §2.4). */
  objectivePriorities: readonly number[];
  /**
   * A reload: priorities of requests still queued that the new configuration has no band for. Each
   * gets a band so its requests keep their place, but the usage-limit policy sees the configured
   * bands only (a rank-based ceiling must not shift for a band nothing new can reach): such a band
   * takes the ceiling of the nearest configured band below it (or else the lowest).
   */
  carriedPriorities?: readonly number[];
  /** Resolves a band's `fairnessPolicyRef`. */
  fairness(name: string): FairnessPolicy;
  /** Resolves a band's `orderingPolicyRef`. */
  ordering(name: string): OrderingPolicy;
  usageLimit: UsageLimitPolicy;
  clock: Clock;
  /** Default: Node's timers, unref'ed. */
  timers?: Timers;
  /** Effective (stage-aware) saturation now; sampled once per dispatch cycle. Never clamped. */
  saturation(): number;
  /** Whether the pool has no endpoints; sampled each cycle, at enqueue and at expiry: the TTL regime. */
  poolEmpty(): boolean;
  /**
   * Clock time at which saturation may change with no event (e.g. metrics turning stale). While
   * anything is queued the controller runs dispatch again then.
   */
  nextSaturationChangeAt?(): number | undefined;
  /** Metrics hook: wall-clock seconds one dispatch run took. */
  onDispatchCycle?(seconds: number): void;
  /** Metrics hook: a request was dispatched ahead of earlier ones of its flow (affinity look-ahead). */
  onAffinityOvertake?(): void;
}

export interface FlowControlFlowDebug {
  fairnessId: string;
  requests: number;
  bytes: number;
  /** Wait of the flow's longest-queued request. */
  oldestWaitMs: number;
}

export interface FlowControlBandDebug {
  priority: number;
  maxRequests: number;
  maxBytes: number;
  fairnessPolicy: string;
  orderingPolicy: string;
  requests: number;
  bytes: number;
  flows: FlowControlFlowDebug[];
}

/** What GET /debug/flowcontrol shows. */
export interface FlowControlDebug {
  /** Saturation sampled by the latest dispatch cycle; null before the first. */
  saturation: number | null;
  /** Clock ms of that sample: the value is as old as the last cycle (cycles run while requests queue). */
  saturationSampledAt: number | null;
  poolEmpty: boolean;
  /** Clock ms when `poolEmpty` last changed, either way (the controller's start if never). */
  poolEmptyChangedAt: number;
  /** Ceiling of each band as of the latest cycle (null before the first). */
  ceilings: { priority: number; ceiling: number | null }[];
  bands: FlowControlBandDebug[];
  totals: { requests: number; bytes: number };
  limits: { maxRequests: number; maxBytes: number; defaultRequestTTLMs: number; noEndpointRequestTTLMs: number };
  shuttingDown: boolean;
  callbackErrors: number;
  policyErrors: number;
}

/** Matches `FlowControlSnapshot` in src/metrics/metrics.ts. */
export interface FlowControlMetricsSnapshot {
  flows: { fairnessId: string; priority: number; requests: number; bytes: number }[];
  bands: { priority: number; requestsUtilization: number; bytesUtilization: number }[];
}

/**
 * The bands to provision (reference §2.4), highest priority first: every configured band, band 0,
 * and one per objective priority — negative ones from `defaultNegativePriorityBand` when set,
 * otherwise from `defaultPriorityBand`. The first configured entry for a priority wins.
 */
export function provisionBands(config: FlowControlConfig, objectivePriorities: readonly number[]): PriorityBandConfig[] {
  const byPriority = new Map<number, PriorityBandConfig>();
  for (const band of config.priorityBands) if (!byPriority.has(band.priority)) byPriority.set(band.priority, band);
  const fromTemplate = (priority: number): PriorityBandConfig => {
    const template =
      priority < 0 && config.defaultNegativePriorityBand !== undefined
        ? config.defaultNegativePriorityBand
        : config.defaultPriorityBand;
    return { ...template, priority };
  };
  if (!byPriority.has(0)) byPriority.set(0, fromTemplate(0));
  for (const priority of objectivePriorities) if (!byPriority.has(priority)) byPriority.set(priority, fromTemplate(priority));
  return [...byPriority.values()].sort((a, b) => b.priority - a.priority);
}

/** llm-d's backstop slack: two of its 1 s expiry sweeps, time for a regime flip to be noticed. */
const BACKSTOP_SLACK_MS = 2000;

const NO_OP_TICKET: FlowTicket = Object.freeze({ cancel() {} });

interface TicketOwner {
  cancel(item: QueuedRequest): void;
}

/** A queued request: the ordering policies' view, the caller's ticket and the heaps' node at once. */
class QueuedRequest implements QueuedItemView, FlowTicket {
  /** Position in the flow heap / expiry heap (maintained by IndexedHeap). */
  flowIndex = NOT_IN_HEAP;
  expiryIndex = NOT_IN_HEAP;
  /** Current-regime deadline; Infinity (and out of the expiry heap) when it cannot expire. */
  expiryAt = Infinity;
  done = false;
  /** Times a later request of its flow was dispatched before it (bounded by the look-ahead). */
  overtaken = 0;

  constructor(
    private readonly owner: TicketOwner,
    readonly request: FlowRequest,
    readonly flow: Flow,
    /** Arrival order: breaks ordering-policy ties so equal keys stay FIFO. */
    readonly seq: number,
    readonly enqueuedAt: number,
    readonly receivedAt: number,
    readonly ttlDeadline: number,
    readonly sloDeadline: number,
    readonly byteSize: number,
  ) {}

  /** Set when a config reload handed this request to a new controller; the ticket follows it. */
  movedTo: QueuedRequest | undefined = undefined;

  cancel(): void {
    if (this.movedTo !== undefined) this.movedTo.cancel();
    else if (!this.done) this.owner.cancel(this);
  }
}

class Flow implements FlowView {
  readonly heap: IndexedHeap<QueuedRequest>;
  bytes = 0;
  /** Position in the band's heap of flows by head (Band.bestHead); NOT_IN_HEAP while not in it. */
  headIndex = NOT_IN_HEAP;

  constructor(
    readonly id: string,
    readonly band: Band,
  ) {
    this.heap = new IndexedHeap<QueuedRequest>(band.compareItems, 'flowIndex');
  }

  get priority(): number {
    return this.band.priority;
  }

  get length(): number {
    return this.heap.size;
  }

  head(): QueuedItemView | undefined {
    return this.heap.peek();
  }
}

/**
 * What the fairness policy sees of a request that arrives at an empty controller: a band with one
 * flow holding it alone. One reusable instance, filled per use (the idle fast path allocates nothing).
 */
class SoloFlow implements BandView, FlowView, QueuedItemView {
  id = '';
  priority = 0;
  readonly length = 1;
  enqueuedAt = 0;
  receivedAt = 0;
  ttlDeadline = Infinity;
  sloDeadline = Infinity;
  byteSize = 0;

  head(): QueuedItemView {
    return this;
  }

  flowAfter(id: string | undefined): FlowView | undefined {
    return id === undefined || this.id > id ? this : undefined;
  }

  bestHead(): FlowView {
    return this;
  }
}

const { default: BTree } = sortedBtree;
type FlowsById = InstanceType<typeof BTree<string, Flow>>;

/**
 * A priority band: its flows (each non-empty; a flow leaves the band when it empties) and what its
 * fairness policy asks of them (BandView). The index behind each question is built at the first
 * such question, so a band pays only for what its policy asks; each costs O(log F) per change, for
 * clients choose fairness ids and a band may hold 100 000 flows.
 */
class Band implements BandView {
  readonly priority: number;
  /** Limits; Infinity when unlimited. */
  readonly maxRequests: number;
  readonly maxBytes: number;
  readonly flows = new Map<string, Flow>();
  requests = 0;
  bytes = 0;
  readonly compareItems: (a: QueuedRequest, b: QueuedRequest) => number;
  /** The flows by head, ties by id (bestHead). */
  private byHead: IndexedHeap<Flow> | undefined;
  private readonly compareHeads: (a: Flow, b: Flow) => number;
  /** The flows by id (flowAfter). */
  private byId: FlowsById | undefined;
  /** nextHigherPair's answer, reused. */
  private readonly pair = [] as unknown as [string, Flow];

  constructor(
    /** Position among the bands, highest priority first. */
    readonly index: number,
    readonly config: PriorityBandConfig,
    readonly ordering: OrderingPolicy,
    readonly selector: FlowSelector,
  ) {
    this.priority = config.priority;
    this.maxRequests = config.maxRequests > 0 ? config.maxRequests : Infinity;
    this.maxBytes = config.maxBytes > 0 ? config.maxBytes : Infinity;
    this.compareItems = (a, b) => ordering.compare(a, b) || a.seq - b.seq;
    this.compareHeads = (a, b) => ordering.compare(a.heap.peek()!, b.heap.peek()!) || compareIds(a.id, b.id);
  }

  bestHead(): Flow | undefined {
    let byHead = this.byHead;
    if (byHead === undefined) {
      byHead = this.byHead = new IndexedHeap<Flow>(this.compareHeads, 'headIndex');
      byHead.reset([...this.flows.values()]);
    }
    return byHead.peek();
  }

  flowAfter(id: string | undefined): Flow | undefined {
    let byId = this.byId;
    if (byId === undefined) byId = this.byId = new BTree<string, Flow>([...this.flows], compareIds);
    return byId.nextHigherPair(id, this.pair)?.[1];
  }

  /** A new flow, still empty: headChanged follows when its first request is in. */
  addFlow(flow: Flow): void {
    this.flows.set(flow.id, flow);
    this.byId?.set(flow.id, flow);
  }

  /** `flow`'s head may have changed: it is new, it lost its head, or it has a better one. */
  headChanged(flow: Flow): void {
    const byHead = this.byHead;
    if (byHead !== undefined && !byHead.update(flow)) byHead.push(flow);
  }

  /** `flow` is empty: it leaves the band. */
  removeFlow(flow: Flow): void {
    this.flows.delete(flow.id);
    this.byId?.delete(flow.id);
    this.byHead?.remove(flow);
  }

  /** The flows in id order (debug output). */
  flowsById(): Flow[] {
    return [...this.flows.values()].sort((a, b) => compareIds(a.id, b.id));
  }

  /** Forgets every flow (the controller emptied the band). */
  clearFlows(): void {
    this.byHead?.clear();
    this.byId?.clear();
    this.flows.clear();
    this.requests = 0;
    this.bytes = 0;
  }
}

/** Ids by UTF-16 code unit, the order of `Array.prototype.sort()`. */
function compareIds(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function compareExpiry(a: QueuedRequest, b: QueuedRequest): number {
  return a.expiryAt - b.expiryAt || a.seq - b.seq;
}

/** receivedAt + `x-llm-d-slo-ttft-ms`; Infinity when absent or negative. */
function sloDeadline(req: FlowRequest): number {
  const slo = req.sloTtftMs;
  return slo !== undefined && slo >= 0 ? req.receivedAt + slo : Infinity;
}

/**
 * `saturation ≥ ceiling`, give or take rounding: a set point reached exactly stops the band whatever
 * the last bit of either side (4 of 6 in flight reads 0.6666666666666666, a rank ceiling of 2/3
 * 0.6666666666666667, which let a fifth request through).
 */
function atCeiling(saturation: number, ceiling: number): boolean {
  return saturation >= ceiling - 1e-9;
}

export class FlowController {
  /** onOutcome / metrics-hook calls that threw (each swallowed: the controller must keep going). */
  callbackErrors = 0;
  /** saturation / poolEmpty / policy calls that threw (the cycle fails closed or skips the band). */
  policyErrors = 0;

  private readonly config: FlowControlConfig;
  private readonly clock: Clock;
  private readonly timers: Timers;
  private readonly usageLimit: UsageLimitPolicy;
  private readonly sampleSaturation: () => number;
  private readonly samplePoolEmpty: () => boolean;
  private readonly nextSaturationChangeAt: (() => number | undefined) | undefined;
  private readonly onDispatchCycle: ((seconds: number) => void) | undefined;
  private readonly onAffinityOvertake: (() => void) | undefined;

  /** Highest priority first. */
  private readonly bands: Band[];
  private readonly bandByPriority = new Map<number, Band>();
  private readonly defaultBand: Band;
  /** The configured bands' priorities, highest first: what the usage-limit policy sees. */
  private readonly priorities: readonly number[];
  /** Per band. */
  private readonly ceilings: Float64Array;
  /** Per configured band: `ceilings` itself unless a reload carried bands over (`carriedPriorities`). */
  private readonly configuredCeilings: Float64Array;
  /** For each band, the configured band whose ceiling it takes (only with carried bands). */
  private readonly ceilingOf: Int32Array | undefined = undefined;
  private ceilingsSampled = false;

  private readonly globalMaxRequests: number;
  private readonly globalMaxBytes: number;
  /** TTL budget while the pool has endpoints (S) and while it is empty (N); ≤ 0 = never. */
  private readonly saturatedBudgetMs: number;
  private readonly noEndpointBudgetMs: number;

  private readonly expiry = new IndexedHeap<QueuedRequest>(compareExpiry, 'expiryIndex');
  private totalRequests = 0;
  private totalBytes = 0;
  private nextSeq = 0;

  private regimeEmpty = false;
  private regimeSince: number;
  private lastSaturation: number | null = null;
  private lastSaturationAt: number | null = null;

  private dispatching = false;
  private shuttingDown = false;
  private immediatePending = false;
  private expiryTimer: unknown = undefined;
  private expiryTimerAt = Infinity;
  private saturationTimer: unknown = undefined;
  private saturationTimerAt = Infinity;

  private readonly owner: TicketOwner = { cancel: (item) => this.evictCancelled(item) };
  private readonly solo = new SoloFlow();
  /** flowControl.affinityLookahead; 0 = strict ordering. */
  private readonly lookahead: number;
  /** Scratch: requests taken off a flow heap while looking ahead. */
  private readonly lookedAt: QueuedRequest[] = [];

  constructor(opts: FlowControllerOptions) {
    this.config = opts.config;
    this.clock = opts.clock;
    this.timers = opts.timers ?? nodeTimers;
    this.usageLimit = opts.usageLimit;
    this.sampleSaturation = opts.saturation;
    this.samplePoolEmpty = opts.poolEmpty;
    this.nextSaturationChangeAt = opts.nextSaturationChangeAt;
    this.onDispatchCycle = opts.onDispatchCycle;
    this.onAffinityOvertake = opts.onAffinityOvertake;

    this.bands = provisionBands(opts.config, [...opts.objectivePriorities, ...(opts.carriedPriorities ?? [])]).map(
      (band, index) =>
        new Band(index, band, opts.ordering(band.orderingPolicyRef), opts.fairness(band.fairnessPolicyRef).newBandSelector()),
    );
    for (const band of this.bands) this.bandByPriority.set(band.priority, band);
    this.defaultBand = this.bandByPriority.get(0)!;
    this.ceilings = new Float64Array(this.bands.length).fill(1);
    // Descending, as the bands are.
    this.priorities = provisionBands(opts.config, opts.objectivePriorities).map((band) => band.priority);
    if (this.priorities.length === this.bands.length) {
      this.configuredCeilings = this.ceilings;
    } else {
      this.configuredCeilings = new Float64Array(this.priorities.length);
      const lowest = this.priorities.length - 1;
      this.ceilingOf = Int32Array.from(this.bands, (band) => {
        const below = this.priorities.findIndex((p) => p <= band.priority);
        return below < 0 ? lowest : below;
      });
    }

    this.globalMaxRequests = opts.config.maxRequests > 0 ? opts.config.maxRequests : Infinity;
    this.globalMaxBytes = opts.config.maxBytes > 0 ? opts.config.maxBytes : Infinity;
    this.lookahead = opts.config.affinityLookahead;
    this.saturatedBudgetMs = opts.config.defaultRequestTTL;
    this.noEndpointBudgetMs = opts.config.noEndpointRequestTTL;
    this.regimeSince = this.clock.now();
  }

  get queued(): number {
    return this.totalRequests;
  }

  get queuedBytes(): number {
    return this.totalBytes;
  }

  enqueue(req: FlowRequest): FlowTicket {
    if (this.shuttingDown) {
      this.notify(req, 'RejectedOther', 0, 'shutting-down');
      return NO_OP_TICKET;
    }
    const now = this.clock.now();
    this.observeRegime(now);
    // A priority with no band is served by band 0; the request keeps its own priority for metrics.
    // (Only a request that began under another configuration can have one: every objective's
    // priority has a band, and a reload provisions bands for the priorities queued.)
    const band = this.bandByPriority.get(req.priority) ?? this.defaultBand;
    const size = req.byteSize;
    if (!this.hasCapacity(band, size)) {
      const never = size > band.maxBytes || size > this.globalMaxBytes;
      this.notify(req, this.regimeEmpty ? 'RejectedNoEndpoints' : 'RejectedCapacity', 0, never ? 'larger-than-capacity' : undefined);
      return NO_OP_TICKET;
    }

    if (this.totalRequests === 0 && !this.dispatching) return this.enqueueIdle(req, band, now);
    const item = this.insert(req, band, now);
    // Inside a running dispatch loop (an onOutcome enqueuing) the loop picks it up; it arms timers.
    if (!this.dispatching) this.runDispatch();
    return item;
  }

  /**
   * Nothing is queued: one dispatch cycle decides this request alone, before any flow or queue
   * entry exists for it — the common case of a gateway with room must cost next to nothing. The
   * answer and the policy calls are those of queueing it and running the cycle: one ceiling
   * computation, the gate of every band down to its own, and its band's fairness selector over a
   * band holding just its flow (so e.g. a round-robin cursor moves as it would).
   */
  private enqueueIdle(req: FlowRequest, band: Band, now: number): FlowTicket {
    const startedAt = this.onDispatchCycle !== undefined ? performance.now() : 0;
    let dispatched = false;
    this.dispatching = true;
    try {
      const saturation = this.sampleGate(now);
      dispatched = saturation !== undefined && this.passesGate(saturation, band.index) && this.selectsAlone(req, band, now);
      if (dispatched) {
        this.notify(req, 'Dispatched', 0);
        // Requests its outcome callback enqueued joined the queue: the run goes on, as runDispatch's.
        while (this.totalRequests > 0 && !this.shuttingDown && this.dispatchCycle());
      }
    } finally {
      this.dispatching = false;
    }
    const ticket = dispatched ? NO_OP_TICKET : this.insert(req, band, now);
    this.reportDispatchRun(startedAt);
    this.armTimers();
    return ticket;
  }

  /** No band down to `bandIndex` is at its ceiling (a lower band never passes a waiting higher one). */
  private passesGate(saturation: number, bandIndex: number): boolean {
    for (let i = 0; i <= bandIndex; i++) if (atCeiling(saturation, this.ceilings[i]!)) return false;
    return true;
  }

  /** The band's fairness selector, asked to choose among the request's flow alone, chooses it. */
  private selectsAlone(req: FlowRequest, band: Band, now: number): boolean {
    const solo = this.solo;
    solo.id = req.fairnessId;
    solo.priority = band.priority;
    solo.enqueuedAt = now;
    solo.receivedAt = req.receivedAt;
    solo.ttlDeadline = this.ttlDeadline(req, now);
    solo.sloDeadline = sloDeadline(req);
    solo.byteSize = req.byteSize;
    try {
      return band.selector.select(solo, band.ordering) === solo;
    } catch {
      this.policyErrors++;
      return false;
    }
  }

  /** The ordering policies' TTL key: enqueue time + the request's TTL with endpoints (Infinity when ≤ 0). */
  private ttlDeadline(req: FlowRequest, enqueuedAt: number): number {
    const ttl = effectiveRequestTtl(this.saturatedBudgetMs, req.requestTtlMs);
    return ttl > 0 ? enqueuedAt + ttl : Infinity;
  }

  /** Puts an admitted request into its flow's heap and, when it can expire, the expiry heap. */
  private insert(req: FlowRequest, band: Band, enqueuedAt: number): QueuedRequest {
    const flow = band.flows.get(req.fairnessId) ?? this.addFlow(band, req.fairnessId);
    const size = req.byteSize;
    const item = new QueuedRequest(
      this.owner,
      req,
      flow,
      this.nextSeq++,
      enqueuedAt,
      req.receivedAt,
      this.ttlDeadline(req, enqueuedAt),
      sloDeadline(req),
      size,
    );
    flow.heap.push(item);
    if (flow.heap.peek() === item) band.headChanged(flow);
    flow.bytes += size;
    band.requests++;
    band.bytes += size;
    this.totalRequests++;
    this.totalBytes += size;
    const expiryAt = this.expiryFor(req, enqueuedAt);
    if (expiryAt !== Infinity) {
      item.expiryAt = expiryAt;
      this.expiry.push(item);
    }
    return item;
  }

  /**
   * When a request queued at `enqueuedAt` expires in the current regime (Infinity: it cannot, a
   * budget of 0 means wait). Its budget — `noEndpointRequestTTL` for an empty pool, else
   * `defaultRequestTTL` as its client's `x-llm-d-inference-ttl` shortens it — counts from the
   * regime's start (a flip between an empty and a non-empty pool starts it afresh), but never past
   * llm-d's backstop, enqueue + max(both budgets) + 2 s, so a pool that keeps flipping holds no
   * request for ever. Without both budgets there is no backstop.
   */
  private expiryFor(req: FlowRequest, enqueuedAt: number): number {
    const s = effectiveRequestTtl(this.saturatedBudgetMs, req.requestTtlMs);
    const n = this.noEndpointBudgetMs;
    const budget = this.regimeEmpty ? n : s;
    if (budget <= 0) return Infinity;
    const regime = Math.max(enqueuedAt, this.regimeSince) + budget;
    return s > 0 && n > 0 ? Math.min(regime, enqueuedAt + Math.max(s, n) + BACKSTOP_SLACK_MS) : regime;
  }

  /**
   * Config reload (SPEC §3.7: queued requests are kept): every queued request moves, in arrival
   * order and with its original enqueue time, into `next` — bands, policies and TTLs of the new
   * configuration apply from now on; capacity limits are not re-checked (they were admitted).
   * Callers' tickets keep working. This controller is retired: later enqueues are rejected.
   */
  handOver(next: FlowController): void {
    if (this.shuttingDown) return;
    this.shuttingDown = true;
    this.clearExpiryTimer();
    this.clearSaturationTimer();
    const moving = this.drainAll();
    next.observeRegime(next.clock.now());
    // The same regime goes on: budgets keep counting from when it began, not from the reload.
    if (next.regimeEmpty === this.regimeEmpty) next.regimeSince = Math.min(next.regimeSince, this.regimeSince);
    for (const item of moving) {
      const band = next.bandByPriority.get(item.request.priority) ?? next.defaultBand;
      const moved = (item.movedTo = next.insert(item.request, band, item.enqueuedAt));
      // A reload does not reset the bound on how often the affinity look-ahead may pass it.
      moved.overtaken = item.overtaken;
    }
    next.runDispatch();
  }

  /**
   * Flow control turned off by a reload: every queued request is dispatched now, in arrival order,
   * and this controller is retired.
   */
  dispatchAll(): void {
    if (this.shuttingDown) return;
    this.shuttingDown = true;
    this.clearExpiryTimer();
    this.clearSaturationTimer();
    const now = this.clock.now();
    for (const item of this.drainAll()) this.finish(item, 'Dispatched', now - item.enqueuedAt);
  }

  /**
   * The priorities of the requests queued now (a reload provisions bands for them, so that one whose
   * objective left the configuration keeps a band from the template instead of landing in band 0).
   */
  queuedPriorities(): number[] {
    const priorities = new Set<number>();
    for (const band of this.bands) for (const flow of band.flows.values()) for (const item of flow.heap.values()) priorities.add(item.request.priority);
    return [...priorities];
  }

  /** Empties every structure; returns what was queued, in arrival order. */
  private drainAll(): QueuedRequest[] {
    const items: QueuedRequest[] = [];
    for (const band of this.bands) {
      for (const flow of band.flows.values()) {
        for (const item of flow.heap.values()) items.push(item);
        flow.heap.clear();
        flow.bytes = 0;
      }
      band.clearFlows();
    }
    this.expiry.clear();
    this.totalRequests = 0;
    this.totalBytes = 0;
    return items.sort((a, b) => a.seq - b.seq);
  }

  /** Something that may change saturation happened: one coalesced dispatch run on the next turn. */
  kick(): void {
    if (this.immediatePending || this.shuttingDown || this.totalRequests === 0) return;
    this.immediatePending = true;
    this.timers.setImmediate(this.onImmediate);
  }

  /** Runs dispatch cycles until one dispatches nothing; returns how many requests were dispatched. */
  runDispatch(): number {
    if (this.dispatching || this.shuttingDown) return 0;
    if (this.totalRequests === 0) {
      this.armTimers();
      return 0;
    }
    this.dispatching = true;
    const startedAt = this.onDispatchCycle !== undefined ? performance.now() : 0;
    let dispatched = 0;
    try {
      while (this.totalRequests > 0 && !this.shuttingDown && this.dispatchCycle()) dispatched++;
    } finally {
      this.dispatching = false;
    }
    this.reportDispatchRun(startedAt);
    this.armTimers();
    return dispatched;
  }

  private reportOvertake(): void {
    try {
      this.onAffinityOvertake?.();
    } catch {
      this.callbackErrors++;
    }
  }

  private reportDispatchRun(startedAt: number): void {
    if (this.onDispatchCycle === undefined) return;
    try {
      this.onDispatchCycle((performance.now() - startedAt) / 1000);
    } catch {
      this.callbackErrors++;
    }
  }

  /** Every queued request leaves as EvictedOther (shutting-down); later enqueues are rejected likewise. */
  shutdown(): void {
    if (this.shuttingDown) return;
    this.shuttingDown = true;
    this.clearExpiryTimer();
    this.clearSaturationTimer();
    // Answer in arrival order; the state is already empty, so callbacks re-entering see it so.
    const victims = this.drainAll();
    const now = this.clock.now();
    for (const item of victims) this.finish(item, 'EvictedOther', now - item.enqueuedAt, 'shutting-down');
  }

  snapshot(): FlowControlDebug {
    const now = this.clock.now();
    // Sampled by dispatch cycles, which run only with something queued: an idle pool's may be old.
    if (!this.shuttingDown) this.observeRegime(now);
    return {
      saturation: this.lastSaturation,
      saturationSampledAt: this.lastSaturationAt,
      poolEmpty: this.regimeEmpty,
      poolEmptyChangedAt: this.regimeSince,
      ceilings: this.bands.map((band, i) => ({
        priority: band.priority,
        ceiling: this.ceilingsSampled ? this.ceilings[i]! : null,
      })),
      bands: this.bands.map((band) => ({
        priority: band.priority,
        maxRequests: band.config.maxRequests,
        maxBytes: band.config.maxBytes,
        fairnessPolicy: band.config.fairnessPolicyRef,
        orderingPolicy: band.config.orderingPolicyRef,
        requests: band.requests,
        bytes: band.bytes,
        flows: band.flowsById().map((flow) => {
          // The head is the best by ordering, not necessarily the oldest (EDF/SLO): scan.
          let oldest = Infinity;
          for (const item of flow.heap.values()) if (item.enqueuedAt < oldest) oldest = item.enqueuedAt;
          return {
            fairnessId: flow.id,
            requests: flow.length,
            bytes: flow.bytes,
            oldestWaitMs: flow.length > 0 ? now - oldest : 0,
          };
        }),
      })),
      totals: { requests: this.totalRequests, bytes: this.totalBytes },
      limits: {
        maxRequests: this.config.maxRequests,
        maxBytes: this.config.maxBytes,
        defaultRequestTTLMs: this.saturatedBudgetMs,
        noEndpointRequestTTLMs: this.noEndpointBudgetMs,
      },
      shuttingDown: this.shuttingDown,
      callbackErrors: this.callbackErrors,
      policyErrors: this.policyErrors,
    };
  }

  metricsSnapshot(): FlowControlMetricsSnapshot {
    const flows: FlowControlMetricsSnapshot['flows'] = [];
    const bands: FlowControlMetricsSnapshot['bands'] = [];
    for (const band of this.bands) {
      for (const flow of band.flows.values()) {
        flows.push({ fairnessId: flow.id, priority: band.priority, requests: flow.length, bytes: flow.bytes });
      }
      bands.push({
        priority: band.priority,
        requestsUtilization: Number.isFinite(band.maxRequests) ? band.requests / band.maxRequests : 0,
        bytesUtilization: Number.isFinite(band.maxBytes) ? band.bytes / band.maxBytes : 0,
      });
    }
    return { flows, bands };
  }

  // ------------------------------------------------------------------------------------ dispatch

  /** One cycle (reference §2.6): true when it dispatched a request. */
  private dispatchCycle(): boolean {
    const now = this.clock.now();
    const saturation = this.sampleGate(now);
    if (saturation === undefined) return false; // fail closed: no trustworthy gate this cycle

    const bands = this.bands;
    const ceilings = this.ceilings;
    for (let i = 0; i < bands.length; i++) {
      // Gate before selection, even for an empty band: no lower band passes a waiting higher one.
      if (atCeiling(saturation, ceilings[i]!)) return false;
      const band = bands[i]!;
      if (band.requests === 0) continue;
      let chosen: FlowView | undefined;
      try {
        chosen = band.selector.select(band, band.ordering);
      } catch {
        this.policyErrors++;
        continue;
      }
      // Only a flow of this band that holds a request (a policy could return any FlowView).
      const flow = chosen === undefined ? undefined : band.flows.get(chosen.id);
      if (flow === undefined || flow !== chosen || flow.length === 0) continue; // work-conserving: try the next band
      const item = this.lookahead > 0 && flow.length > 1 ? this.takeWithAffinity(flow) : flow.heap.pop()!;
      this.detach(item);
      this.finish(item, 'Dispatched', now - item.enqueuedAt);
      return true;
    }
    return false;
  }

  /**
   * Takes the request to dispatch from a flow (Sluice, `flowControl.affinityLookahead` = K). The
   * head goes, unless it would rather wait for its favourite (saturated) endpoint: then the first of
   * the next K requests, in the ordering policy's order, that must go goes instead — content to go
   * now, or already overtaken K times — and every request it passes counts as overtaken once. When
   * everyone looked at would rather wait, the head goes: the flow keeps moving, and no request is
   * overtaken more than K times.
   */
  private takeWithAffinity(flow: Flow): QueuedRequest {
    const heap = flow.heap;
    if (this.mustGo(heap.peek()!)) return heap.pop()!;
    const looked = this.lookedAt;
    looked.push(heap.pop()!);
    let chosen: QueuedRequest | undefined;
    while (looked.length <= this.lookahead && heap.size > 0) {
      const next = heap.pop()!;
      if (this.mustGo(next)) {
        chosen = next;
        break;
      }
      looked.push(next);
    }
    if (chosen === undefined) chosen = looked.shift()!;
    else {
      for (const passed of looked) passed.overtaken++;
      this.reportOvertake();
    }
    for (const back of looked) heap.push(back);
    looked.length = 0;
    return chosen;
  }

  private mustGo(item: QueuedRequest): boolean {
    if (item.overtaken >= this.lookahead) return true;
    const { request } = item;
    if (request.prefersToWait === undefined) return true;
    try {
      return request.prefersToWait() !== true;
    } catch {
      this.callbackErrors++;
      return true;
    }
  }

  /**
   * The start of a dispatch cycle: pool regime, saturation, and every band's ceiling (exactly one
   * usage-limit call). undefined when a policy threw; NaN saturation reads as Infinity (fail closed).
   */
  private sampleGate(now: number): number | undefined {
    let saturation: number;
    try {
      this.observeRegime(now);
      saturation = this.sampleSaturation();
      this.configuredCeilings.fill(1);
      this.usageLimit.computeCeilings(saturation, this.priorities, this.configuredCeilings);
      const from = this.ceilingOf;
      if (from !== undefined) for (let i = 0; i < from.length; i++) this.ceilings[i] = this.configuredCeilings[from[i]!]!;
    } catch {
      this.policyErrors++;
      return undefined;
    }
    if (Number.isNaN(saturation)) saturation = Infinity;
    this.lastSaturation = saturation;
    this.lastSaturationAt = now;
    this.ceilingsSampled = true;
    return saturation;
  }

  private readonly onImmediate = (): void => {
    this.immediatePending = false;
    this.runDispatch();
  };

  private readonly onSaturationTimer = (): void => {
    this.saturationTimer = undefined;
    this.saturationTimerAt = Infinity;
    this.runDispatch();
  };

  // -------------------------------------------------------------------------------- bookkeeping

  private hasCapacity(band: Band, size: number): boolean {
    return (
      this.totalBytes + size <= this.globalMaxBytes &&
      this.totalRequests + 1 <= this.globalMaxRequests &&
      band.bytes + size <= band.maxBytes &&
      band.requests + 1 <= band.maxRequests
    );
  }

  private addFlow(band: Band, id: string): Flow {
    const flow = new Flow(id, band);
    band.addFlow(flow);
    return flow;
  }

  /** Takes a request out of every structure (its flow heap entry may already be popped). */
  private detach(item: QueuedRequest): void {
    const flow = item.flow;
    const band = flow.band;
    if (item.flowIndex !== NOT_IN_HEAP) flow.heap.remove(item);
    if (item.expiryIndex !== NOT_IN_HEAP) this.expiry.remove(item);
    const size = item.byteSize;
    flow.bytes -= size;
    band.requests--;
    band.bytes -= size;
    this.totalRequests--;
    this.totalBytes -= size;
    if (flow.length === 0) band.removeFlow(flow);
    else band.headChanged(flow);
  }

  private finish(item: QueuedRequest, outcome: FlowOutcome, queuedMs: number, cause?: OutcomeCause): void {
    item.done = true;
    // Wall clocks can step back; a negative wait would only confuse histograms.
    this.notify(item.request, outcome, queuedMs > 0 ? queuedMs : 0, cause);
  }

  private notify(req: FlowRequest, outcome: FlowOutcome, queuedMs: number, cause?: OutcomeCause): void {
    try {
      req.onOutcome(outcome, queuedMs, cause);
    } catch {
      this.callbackErrors++;
    }
  }

  private evictCancelled(item: QueuedRequest): void {
    this.detach(item);
    this.finish(item, 'EvictedContextCancelled', this.clock.now() - item.enqueuedAt);
    if (this.totalRequests === 0) this.armTimers(); // releases the timers of an idle controller
  }

  // ------------------------------------------------------------------------------ TTL and regime

  /** Samples the pool-empty regime; a flip starts a fresh budget for everything queued. */
  private observeRegime(now: number): void {
    let empty: boolean;
    try {
      empty = this.samplePoolEmpty();
    } catch {
      this.policyErrors++;
      return; // keep the last known regime
    }
    if (empty === this.regimeEmpty) return;
    this.regimeEmpty = empty;
    this.regimeSince = now;
    this.rebuildExpiry();
  }

  /** Re-keys every queued request for the current regime (expiryFor). */
  private rebuildExpiry(): void {
    const expiring: QueuedRequest[] = [];
    for (const band of this.bands) {
      for (const flow of band.flows.values()) {
        for (const item of flow.heap.values()) {
          item.expiryAt = this.expiryFor(item.request, item.enqueuedAt);
          if (item.expiryAt !== Infinity) expiring.push(item);
        }
      }
    }
    this.expiry.reset(expiring);
    // The timer may now be too late (a shorter budget) — re-arm from scratch.
    this.clearExpiryTimer();
    if (!this.dispatching) this.armExpiryTimer();
  }

  private readonly onExpiryTimer = (): void => {
    this.expiryTimer = undefined;
    this.expiryTimerAt = Infinity;
    if (this.shuttingDown) return;
    const now = this.clock.now();
    this.observeRegime(now);
    for (;;) {
      const head = this.expiry.peek();
      if (head === undefined || head.expiryAt > now) break;
      this.detach(head);
      // Re-read per item: a callback that enqueues may flip the regime.
      this.finish(head, this.regimeEmpty ? 'EvictedNoEndpoints' : 'EvictedTTL', now - head.enqueuedAt);
    }
    this.armTimers();
  };

  // ------------------------------------------------------------------------------------- timers

  private armTimers(): void {
    if (this.shuttingDown) return;
    this.armExpiryTimer();
    this.armSaturationTimer();
  }

  /** Keeps one timer at or before the earliest deadline; an early timer just re-arms when it fires. */
  private armExpiryTimer(): void {
    const head = this.expiry.peek();
    if (head === undefined) {
      this.clearExpiryTimer();
      return;
    }
    if (this.expiryTimer !== undefined) {
      if (this.expiryTimerAt <= head.expiryAt) return;
      this.clearExpiryTimer();
    }
    this.expiryTimerAt = head.expiryAt;
    const delay = Math.min(MAX_TIMER_DELAY_MS, Math.max(0, head.expiryAt - this.clock.now()));
    this.expiryTimer = this.timers.setTimeout(this.onExpiryTimer, delay);
  }

  private clearExpiryTimer(): void {
    if (this.expiryTimer === undefined) return;
    this.timers.clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    this.expiryTimerAt = Infinity;
  }

  private armSaturationTimer(): void {
    if (this.totalRequests === 0) {
      this.clearSaturationTimer();
      return;
    }
    let at: number | undefined;
    try {
      at = this.nextSaturationChangeAt?.();
      // A usage-limit policy whose ceilings change by themselves (alternation) gets its next cycle.
      if (this.usageLimit.changesNextCycle?.() === true) at = Math.min(at ?? Infinity, this.clock.now() + 1);
    } catch {
      this.policyErrors++;
      at = undefined;
    }
    if (at === undefined || !Number.isFinite(at)) {
      this.clearSaturationTimer();
      return;
    }
    // A timer already due at or before `at` stays (as the expiry timer): an early one re-arms when it
    // fires. While a policy alternates `at` moves with every call, so re-arming on each would cost a
    // timer per enqueue.
    if (this.saturationTimer !== undefined && this.saturationTimerAt <= at) return;
    this.clearSaturationTimer();
    this.saturationTimerAt = at;
    // At least 1 ms: a time already past must not spin (llm-d's own ticker runs every 1 ms).
    const delay = Math.min(MAX_TIMER_DELAY_MS, Math.max(1, at - this.clock.now()));
    this.saturationTimer = this.timers.setTimeout(this.onSaturationTimer, delay);
  }

  private clearSaturationTimer(): void {
    if (this.saturationTimer === undefined) return;
    this.timers.clearTimeout(this.saturationTimer);
    this.saturationTimer = undefined;
    this.saturationTimerAt = Infinity;
  }
}
