/**
 * Flow-controller micro-benchmark: the pure controller (no HTTP), saturation under our control.
 *
 * For queue depths of 10, 1k and 100k requests spread over 8 bands and 16 flows:
 *   enqueue      — ns per enqueue while dispatch is blocked (saturation 1.0);
 *   drain        — ns per dispatch when the gate opens and the whole queue drains in one run;
 *   steady       — ns per (enqueue + dispatch) pair with the queue held at that depth;
 *   memory       — heap bytes per queued request (controller state + a minimal FlowRequest),
 *                  measured after global.gc when available;
 * plus the unsaturated path (enqueue dispatches at once, nothing queued), and
 *   many flows   — one band whose 100k (quick: 10k) queued requests each have a fairness id of their
 *                  own (clients choose it), with the shipped global-strict and round-robin policies:
 *                  the fairness policy's cost per dispatch as the flow count grows.
 *
 *   node --expose-gc --import tsx bench/flowcontrol.ts [--quick]
 *   npx tsx bench/flowcontrol.ts                     (memory then reads "n/a")
 *
 * Writes bench/results/flowcontrol.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FlowControlConfig } from '../src/config/types.js';
import { FlowController, type Timers } from '../src/flowcontrol/controller.js';
import type { FairnessPolicy, OrderingPolicy, UsageLimitPolicy } from '../src/flowcontrol/policies/types.js';
import { createFcfsOrderingPolicy } from '../src/flowcontrol/policies/fcfs-ordering-policy.js';
import { createGlobalStrictFairnessPolicy } from '../src/flowcontrol/policies/global-strict-fairness-policy.js';
import { createRoundRobinFairnessPolicy } from '../src/flowcontrol/policies/round-robin-fairness-policy.js';
import type { FlowRequest } from '../src/flowcontrol/types.js';
import { ManualClock } from '../src/util/clock.js';

const QUICK = process.argv.includes('--quick');
const DEPTHS = [10, 1_000, 100_000];
const BAND_PRIORITIES = [70, 60, 50, 40, 30, 20, 10]; // + band 0 = 8 bands
const ALL_PRIORITIES = [...BAND_PRIORITIES, 0];
const FLOWS = Array.from({ length: 16 }, (_, i) => `tenant-${i}`);
/** Enough work per measurement that small depths are not lost in timer noise. */
const MIN_OPS = QUICK ? 50_000 : 400_000;

// Policies equivalent to the llm-d defaults, local so the bench measures the controller alone.
const fcfs: OrderingPolicy = { type: 'fcfs', name: 'fcfs', compare: (a, b) => a.enqueuedAt - b.enqueuedAt };
// Global strict's work (the best head of a band) is the controller's index, so the shipped policy.
const bestHead: FairnessPolicy = createGlobalStrictFairnessPolicy('global-strict');
const staticLimit: UsageLimitPolicy = {
  type: 'static',
  name: 'static',
  computeCeilings: (_s, _p, out) => void out.fill(1),
};
/** Timers that never fire: expiry and saturation timers are armed (their cost counts) but idle. */
const inertTimers: Timers = { setTimeout: () => 0, clearTimeout: () => {}, setImmediate: () => 0 };

const template = {
  maxBytes: 1e12,
  maxRequests: 1e9,
  fairnessPolicyRef: 'global-strict',
  orderingPolicyRef: 'fcfs',
};
const config: FlowControlConfig = {
  maxBytes: 0,
  maxRequests: 0,
  defaultRequestTTL: 60_000,
  noEndpointRequestTTL: 60_000,
  defaultPriorityBand: template,
  priorityBands: BAND_PRIORITIES.map((priority) => ({ ...template, priority })),
  usageLimitPolicyPluginRef: 'static',
  saturationDetector: { pluginRef: 'utilization-detector' },
  affinityLookahead: 0,
};

// Module-level gate state: requests then share one onOutcome function and carry no closure.
/** Saturation the controller samples while dispatches are allowed. */
let gateSaturation = 1;
/** Dispatches left before saturation reads 1.0 again (each Dispatched spends one). */
let allowance = Infinity;
let outcomes = 0;

function sharedOnOutcome(): void {
  outcomes++;
  allowance--;
}

function setGate(saturation: number, allowed = Infinity): void {
  gateSaturation = saturation;
  allowance = allowed;
}

function makeController(clock: ManualClock, fairness: FairnessPolicy = bestHead, ordering: OrderingPolicy = fcfs): FlowController {
  return new FlowController({
    config,
    objectivePriorities: [],
    fairness: () => fairness,
    ordering: () => ordering,
    usageLimit: staticLimit,
    clock,
    timers: inertTimers,
    saturation: () => (allowance > 0 ? gateSaturation : 1),
    poolEmpty: () => false,
  });
}

function makeRequests(n: number, offset: number, clock: ManualClock): FlowRequest[] {
  const requests: FlowRequest[] = new Array(n);
  for (let i = 0; i < n; i++) {
    const k = offset + i;
    requests[i] = {
      fairnessId: FLOWS[k % FLOWS.length]!,
      priority: ALL_PRIORITIES[(k * 7) % ALL_PRIORITIES.length]!,
      byteSize: 512 + (k % 1024),
      receivedAt: clock.now(),
      onOutcome: sharedOnOutcome,
    };
  }
  return requests;
}

function nsPer(ops: number, startNs: bigint): number {
  return Number(process.hrtime.bigint() - startNs) / ops;
}

interface DepthResult {
  depth: number;
  enqueueNs: number;
  drainNs: number;
  steadyPairNs: number;
  memory: MemoryResult | null;
}

function benchDepth(depth: number): DepthResult {
  const rounds = Math.max(1, Math.ceil(MIN_OPS / depth));
  let enqueueTotal = 0;
  let drainTotal = 0;
  const clock = new ManualClock(0);
  const fc = makeController(clock);

  for (let round = 0; round < rounds; round++) {
    const requests = makeRequests(depth, round * depth, clock);
    setGate(1);
    let t = process.hrtime.bigint();
    for (let i = 0; i < depth; i++) {
      if ((i & 63) === 0) clock.advance(1); // ~64 arrivals per ms: realistic clock ties
      fc.enqueue(requests[i]!);
    }
    enqueueTotal += Number(process.hrtime.bigint() - t);
    if (fc.queued !== depth) throw new Error(`expected ${depth} queued, have ${fc.queued}`);
    setGate(0);
    t = process.hrtime.bigint();
    const n = fc.runDispatch();
    drainTotal += Number(process.hrtime.bigint() - t);
    if (n !== depth || fc.queued !== 0) throw new Error(`drained ${n} of ${depth}`);
  }

  // Steady state at this depth: one arrival and one dispatch per step.
  setGate(1);
  for (const req of makeRequests(depth, 0, clock)) fc.enqueue(req);
  const steps = Math.max(MIN_OPS / 4, 10_000);
  const arrivals = makeRequests(steps, depth, clock);
  setGate(0, 0);
  const t = process.hrtime.bigint();
  for (let i = 0; i < steps; i++) {
    if ((i & 63) === 0) clock.advance(1);
    fc.enqueue(arrivals[i]!); // gated: allowance 0
    allowance = 1;
    fc.runDispatch();
  }
  const steadyPairNs = nsPer(steps, t);
  if (fc.queued !== depth) throw new Error(`steady state drifted to ${fc.queued}`);
  setGate(0);
  fc.runDispatch();

  return {
    depth,
    enqueueNs: enqueueTotal / (rounds * depth),
    drainNs: drainTotal / (rounds * depth),
    steadyPairNs,
    memory: measureMemory(depth),
  };
}

interface MemoryResult {
  /** Controller state per queued request (heap nodes, flow/expiry heap slots, bookkeeping). */
  controllerBytes: number;
  /** The caller's FlowRequest object (5 fields + shared callback), for scale. */
  requestBytes: number;
}

function measureMemory(depth: number): MemoryResult | null {
  const gc = (globalThis as { gc?: () => void }).gc;
  // Below ~1k requests the delta drowns in heap noise.
  if (gc === undefined || depth < 1_000) return null;
  const clock = new ManualClock(0);
  const fc = makeController(clock);
  setGate(1);
  gc();
  gc();
  const start = process.memoryUsage().heapUsed;
  const requests = makeRequests(depth, 0, clock);
  gc();
  gc();
  const built = process.memoryUsage().heapUsed;
  for (let i = 0; i < depth; i++) {
    if ((i & 63) === 0) clock.advance(1);
    fc.enqueue(requests[i]!);
  }
  gc();
  gc();
  const queued = process.memoryUsage().heapUsed;
  if (fc.queued !== depth) throw new Error('memory rig did not queue everything');
  fc.shutdown();
  return { controllerBytes: (queued - built) / depth, requestBytes: (built - start) / depth };
}

function benchUnsaturated(): number {
  const clock = new ManualClock(0);
  const fc = makeController(clock);
  setGate(0.1);
  const n = MIN_OPS;
  const requests = makeRequests(n, 0, clock);
  const before = outcomes;
  const t = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    if ((i & 63) === 0) clock.advance(1);
    fc.enqueue(requests[i]!);
  }
  const ns = nsPer(n, t);
  if (outcomes - before !== n || fc.queued !== 0) throw new Error('unsaturated path queued something');
  return ns;
}

/** Per dispatch with every queued request in a flow of its own: the shipped policies, one band. */
export interface ManyFlowsResult {
  fairness: string;
  flows: number;
  enqueueNs: number;
  drainNs: number;
  steadyPairNs: number;
}

const MANY_FLOWS = QUICK ? 10_000 : 100_000;

function benchManyFlows(fairness: FairnessPolicy): ManyFlowsResult {
  const clock = new ManualClock(0);
  const fc = makeController(clock, fairness, createFcfsOrderingPolicy('fcfs'));
  const request = (k: number): FlowRequest => ({
    fairnessId: `client-${k}`,
    priority: 0,
    byteSize: 512,
    receivedAt: clock.now(),
    onOutcome: sharedOnOutcome,
  });
  const fill = (offset: number): void => {
    for (let i = 0; i < MANY_FLOWS; i++) {
      if ((i & 63) === 0) clock.advance(1);
      fc.enqueue(request(offset + i));
    }
  };
  setGate(1);
  let t = process.hrtime.bigint();
  fill(0);
  const enqueueNs = nsPer(MANY_FLOWS, t);
  // Steady state: one new flow arrives and one leaves per step.
  const steps = QUICK ? 2_000 : 10_000;
  setGate(0, 0);
  t = process.hrtime.bigint();
  for (let i = 0; i < steps; i++) {
    if ((i & 63) === 0) clock.advance(1);
    fc.enqueue(request(MANY_FLOWS + i));
    allowance = 1;
    fc.runDispatch();
  }
  const steadyPairNs = nsPer(steps, t);
  const steadyQueued = fc.queued;
  if (steadyQueued !== MANY_FLOWS) throw new Error(`many flows: steady state drifted to ${steadyQueued}`);
  setGate(0);
  t = process.hrtime.bigint();
  const n = fc.runDispatch();
  const drainNs = nsPer(n, t);
  if (fc.queued !== 0) throw new Error(`many flows: drained ${n} of ${MANY_FLOWS}`);
  return { fairness: fairness.type, flows: MANY_FLOWS, enqueueNs, drainNs, steadyPairNs };
}

function fmt(ns: number): string {
  return ns >= 1000 ? `${(ns / 1000).toFixed(2)} µs` : `${ns.toFixed(0)} ns`;
}

function main(): void {
  // Warm-up so the JIT has settled before anything is timed.
  benchDepth(1_000);
  benchUnsaturated();

  const results = DEPTHS.map(benchDepth);
  const unsaturatedNs = benchUnsaturated();
  const manyFlows = [createGlobalStrictFairnessPolicy('global-strict'), createRoundRobinFairnessPolicy('round-robin')].map(benchManyFlows);

  const rows = results.map((r) => ({
    depth: r.depth.toLocaleString('en-US'),
    enqueue: fmt(r.enqueueNs),
    'enqueue/s': Math.round(1e9 / r.enqueueNs).toLocaleString('en-US'),
    dispatch: fmt(r.drainNs),
    'dispatch/s': Math.round(1e9 / r.drainNs).toLocaleString('en-US'),
    'steady enq+disp': fmt(r.steadyPairNs),
    'bytes/queued (controller)':
      r.memory === null ? (r.depth < 1_000 ? 'too small' : 'n/a (--expose-gc)') : Math.round(r.memory.controllerBytes),
    '+ FlowRequest': r.memory === null ? 'n/a' : Math.round(r.memory.requestBytes),
  }));
  console.log(`flow controller, ${BAND_PRIORITIES.length + 1} bands × ${FLOWS.length} flows, FCFS + global-strict, TTL on`);
  console.table(rows);
  console.log(`unsaturated enqueue → immediate dispatch: ${fmt(unsaturatedNs)} per request (${Math.round(1e9 / unsaturatedNs).toLocaleString('en-US')}/s)`);
  console.log(`one band, ${MANY_FLOWS.toLocaleString('en-US')} flows of one request each (FCFS):`);
  console.table(
    manyFlows.map((r) => ({ fairness: r.fairness, enqueue: fmt(r.enqueueNs), dispatch: fmt(r.drainNs), 'steady enq+disp': fmt(r.steadyPairNs) })),
  );

  const out = {
    date: new Date().toISOString(),
    node: process.version,
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    quick: QUICK,
    gcExposed: typeof (globalThis as { gc?: unknown }).gc === 'function',
    setup: { bands: BAND_PRIORITIES.length + 1, flows: FLOWS.length, ordering: 'fcfs', fairness: 'global-strict', ttlMs: 60_000 },
    depths: results,
    unsaturatedEnqueueDispatchNs: unsaturatedNs,
    manyFlows,
  };
  const file = join(dirname(fileURLToPath(import.meta.url)), 'results', 'flowcontrol.json');
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, JSON.stringify(out, null, 2) + '\n');
  console.log(`wrote ${file}`);
}

main();
