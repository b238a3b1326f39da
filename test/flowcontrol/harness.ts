/**
 * Test doubles for the flow controller: fake timers driven by a ManualClock, small local policies
 * (the real ones are tested on their own), and a harness that records every outcome.
 */
import type { FlowControlConfig, PriorityBandConfig } from '../../src/config/types.js';
import { FlowController, type FlowControllerOptions, type Timers } from '../../src/flowcontrol/controller.js';
import type {
  BandView,
  FairnessPolicy,
  FlowSelector,
  FlowView,
  OrderingPolicy,
  QueuedItemView,
  UsageLimitPolicy,
} from '../../src/flowcontrol/policies/types.js';
import type { FlowOutcome, FlowRequest, FlowTicket, OutcomeCause } from '../../src/flowcontrol/types.js';
import { ManualClock } from '../../src/util/clock.js';

interface PendingTimer {
  id: number;
  due: number;
  fn: () => void;
}

/** Timers that fire only when the test moves the clock; each fires with the clock at its due time. */
export class FakeTimers implements Timers {
  private nextId = 1;
  private readonly pending = new Map<number, PendingTimer>();
  private immediates: (() => void)[] = [];
  setTimeoutCalls = 0;
  setImmediateCalls = 0;

  constructor(readonly clock: ManualClock) {}

  setTimeout(fn: () => void, ms: number): unknown {
    this.setTimeoutCalls++;
    const timer = { id: this.nextId++, due: this.clock.now() + Math.max(0, ms), fn };
    this.pending.set(timer.id, timer);
    return timer.id;
  }

  clearTimeout(handle: unknown): void {
    this.pending.delete(handle as number);
  }

  setImmediate(fn: () => void): unknown {
    this.setImmediateCalls++;
    this.immediates.push(fn);
    return fn;
  }

  get pendingTimers(): number {
    return this.pending.size;
  }

  get pendingImmediates(): number {
    return this.immediates.length;
  }

  /** Due times of the pending timers, ascending. */
  dueTimes(): number[] {
    return [...this.pending.values()].map((t) => t.due).sort((a, b) => a - b);
  }

  /** Runs the immediates queued so far (and any they queue), like one or more event-loop turns. */
  runImmediates(): void {
    for (let turns = 0; this.immediates.length > 0; turns++) {
      if (turns > 1_000_000) throw new Error('fake timers: runaway immediate loop');
      const batch = this.immediates;
      this.immediates = [];
      for (const fn of batch) fn();
    }
  }

  /** Moves the clock forward by `ms`, firing every timer that falls due on the way, in order. */
  advance(ms: number): void {
    this.advanceTo(this.clock.now() + ms);
  }

  advanceTo(target: number): void {
    // A controller that keeps re-arming a timer at the same instant would hang the test: fail it.
    for (let fired = 0; ; fired++) {
      if (fired > 1_000_000) throw new Error('fake timers: runaway timer loop');
      let next: PendingTimer | undefined;
      for (const t of this.pending.values()) {
        if (t.due <= target && (next === undefined || t.due < next.due || (t.due === next.due && t.id < next.id))) next = t;
      }
      if (next === undefined) break;
      this.pending.delete(next.id);
      if (next.due > this.clock.now()) this.clock.set(next.due);
      next.fn();
      this.runImmediates();
    }
    if (target > this.clock.now()) this.clock.set(target);
  }
}

// ------------------------------------------------------------------------------- local policies

export const fcfsOrdering: OrderingPolicy = {
  type: 'fcfs-ordering-policy',
  name: 'fcfs-ordering-policy',
  compare: (a, b) => a.enqueuedAt - b.enqueuedAt,
};

/** Earliest SLO deadline first, ties by receipt. */
export const sloOrdering: OrderingPolicy = {
  type: 'slo-deadline-ordering-policy',
  name: 'slo-deadline-ordering-policy',
  compare: (a: QueuedItemView, b: QueuedItemView) => {
    if (a.sloDeadline !== b.sloDeadline) return a.sloDeadline < b.sloDeadline ? -1 : 1;
    return a.receivedAt - b.receivedAt;
  },
};

/** The band as one global queue: the flow with the best head wins (the controller's index); ties go to the least id. */
export const oldestHeadFairness: FairnessPolicy = {
  type: 'global-strict-fairness-policy',
  name: 'global-strict-fairness-policy',
  newBandSelector: (): FlowSelector => ({ select: (band) => band.bestHead() }),
};

/** Round robin by id cursor (survives the flow's removal). */
export const roundRobinFairness: FairnessPolicy = {
  type: 'round-robin-fairness-policy',
  name: 'round-robin-fairness-policy',
  newBandSelector: (): FlowSelector => {
    let cursor: string | undefined;
    return {
      select(band) {
        const next = band.flowAfter(cursor) ?? band.flowAfter(undefined);
        cursor = next?.id;
        return next;
      },
    };
  },
};

/**
 * A BandView over a plain list of flows, for the round-robin policy's tests: `flowAfter` by a scan
 * in id order (empty flows skipped, as the controller holds none). Round robin takes turns by id:
 * asking for the best head is a bug, so it throws.
 */
export function listBand(flows: readonly FlowView[]): BandView {
  const live = flows.filter((f) => f.length > 0 && f.head() !== undefined).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return {
    flowAfter: (id) => live.find((f) => id === undefined || f.id > id),
    bestHead: () => {
      throw new Error('round robin asked for the best head');
    },
  };
}

/** Every band gets `threshold`. */
export function staticCeiling(threshold = 1): UsageLimitPolicy {
  return {
    type: 'static-usage-limit-policy',
    name: 'static-usage-limit-policy',
    computeCeilings(_s, _priorities, out) {
      out.fill(threshold);
    },
  };
}

/** Fixed ceilings per priority (missing ones stay at the pre-filled 1.0). */
export function ceilingsByPriority(ceilings: Record<number, number>): UsageLimitPolicy {
  return {
    type: 'test-ceilings',
    name: 'test-ceilings',
    computeCeilings(_s, priorities, out) {
      for (let i = 0; i < priorities.length; i++) {
        const c = ceilings[priorities[i]!];
        if (c !== undefined) out[i] = c;
      }
    },
  };
}

// --------------------------------------------------------------------------------------- config

export const defaultBandTemplate: Omit<PriorityBandConfig, 'priority'> = {
  maxBytes: 1_000_000_000,
  maxRequests: 5000,
  fairnessPolicyRef: 'global-strict-fairness-policy',
  orderingPolicyRef: 'fcfs-ordering-policy',
};

export function band(priority: number, over: Partial<PriorityBandConfig> = {}): PriorityBandConfig {
  return { ...defaultBandTemplate, priority, ...over };
}

export function makeConfig(over: Partial<FlowControlConfig> = {}): FlowControlConfig {
  return {
    maxBytes: 0,
    maxRequests: 0,
    defaultRequestTTL: 60_000,
    noEndpointRequestTTL: 60_000,
    defaultPriorityBand: defaultBandTemplate,
    priorityBands: [],
    usageLimitPolicyPluginRef: 'static-usage-limit-policy',
    saturationDetector: { pluginRef: 'utilization-detector' },
    affinityLookahead: 0,
    ...over,
  };
}

// -------------------------------------------------------------------------------------- harness

export interface OutcomeRecord {
  label: string;
  outcome: FlowOutcome;
  queuedMs: number;
  cause: OutcomeCause | undefined;
  /** Clock time of the callback. */
  at: number;
}

export interface SubmitOptions {
  priority?: number;
  fairnessId?: string;
  byteSize?: number;
  receivedAt?: number;
  sloTtftMs?: number;
  /** The client's `x-llm-d-inference-ttl`, in ms. */
  requestTtlMs?: number;
  /** Runs inside onOutcome, after the outcome is recorded. */
  then?: (outcome: FlowOutcome) => void;
  /** The request's `prefersToWait` (absent: the request has none). */
  prefersToWait?: () => boolean;
}

export interface HarnessOptions {
  config?: Partial<FlowControlConfig>;
  objectivePriorities?: number[];
  carriedPriorities?: number[];
  usageLimit?: UsageLimitPolicy;
  fairness?: FairnessPolicy;
  ordering?: OrderingPolicy;
  /** Initial saturation (tests change `h.saturation`), or a function of the harness. */
  saturation?: number | ((h: Harness) => number);
  poolEmpty?: boolean;
  nextSaturationChangeAt?: (h: Harness) => number | undefined;
  onDispatchCycle?: (seconds: number) => void;
  onAffinityOvertake?: () => void;
  start?: number;
}

export class Harness {
  readonly clock: ManualClock;
  readonly timers: FakeTimers;
  readonly fc: FlowController;
  saturation = 0;
  saturationFn: ((h: Harness) => number) | undefined;
  poolEmpty: boolean;
  saturationSamples = 0;
  readonly outcomes: OutcomeRecord[] = [];
  readonly fairnessRequests: string[] = [];
  readonly orderingRequests: string[] = [];

  constructor(opts: HarnessOptions = {}) {
    this.clock = new ManualClock(opts.start ?? 0);
    this.timers = new FakeTimers(this.clock);
    if (typeof opts.saturation === 'function') this.saturationFn = opts.saturation;
    else this.saturation = opts.saturation ?? 0;
    this.poolEmpty = opts.poolEmpty ?? false;
    const fairness = opts.fairness ?? oldestHeadFairness;
    const ordering = opts.ordering ?? fcfsOrdering;
    const options: FlowControllerOptions = {
      config: makeConfig(opts.config),
      objectivePriorities: opts.objectivePriorities ?? [],
      carriedPriorities: opts.carriedPriorities ?? [],
      fairness: (name) => {
        this.fairnessRequests.push(name);
        return fairness;
      },
      ordering: (name) => {
        this.orderingRequests.push(name);
        return ordering;
      },
      usageLimit: opts.usageLimit ?? staticCeiling(1),
      clock: this.clock,
      timers: this.timers,
      saturation: () => {
        this.saturationSamples++;
        return this.saturationFn ? this.saturationFn(this) : this.saturation;
      },
      poolEmpty: () => this.poolEmpty,
    };
    const next = opts.nextSaturationChangeAt;
    if (next) options.nextSaturationChangeAt = () => next(this);
    if (opts.onDispatchCycle) options.onDispatchCycle = opts.onDispatchCycle;
    if (opts.onAffinityOvertake) options.onAffinityOvertake = opts.onAffinityOvertake;
    this.fc = new FlowController(options);
  }

  /** Enqueues a request labelled `label`; its outcome(s) land in `outcomes`. */
  submit(label: string, opts: SubmitOptions = {}): FlowTicket {
    const req: FlowRequest = {
      fairnessId: opts.fairnessId ?? 'default-flow',
      priority: opts.priority ?? 0,
      byteSize: opts.byteSize ?? 100,
      receivedAt: opts.receivedAt ?? this.clock.now(),
      ...(opts.sloTtftMs !== undefined ? { sloTtftMs: opts.sloTtftMs } : {}),
      ...(opts.requestTtlMs !== undefined ? { requestTtlMs: opts.requestTtlMs } : {}),
      ...(opts.prefersToWait !== undefined ? { prefersToWait: opts.prefersToWait } : {}),
      onOutcome: (outcome, queuedMs, cause) => {
        this.outcomes.push({ label, outcome, queuedMs, cause, at: this.clock.now() });
        opts.then?.(outcome);
      },
    };
    return this.fc.enqueue(req);
  }

  /** Labels with the given outcome, in callback order. */
  labels(outcome: FlowOutcome = 'Dispatched'): string[] {
    return this.outcomes.filter((o) => o.outcome === outcome).map((o) => o.label);
  }

  outcomeOf(label: string): OutcomeRecord | undefined {
    const found = this.outcomes.filter((o) => o.label === label);
    if (found.length > 1) throw new Error(`${label} got ${found.length} outcomes`);
    return found[0];
  }

  /** Sets saturation, kicks and lets the coalesced dispatch run. */
  unblock(saturation = 0): void {
    this.saturation = saturation;
    this.fc.kick();
    this.timers.runImmediates();
  }
}
