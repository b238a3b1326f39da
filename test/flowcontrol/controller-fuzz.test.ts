import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FlowOutcome, FlowTicket } from '../../src/flowcontrol/types.js';
import { seededRandom } from '../../src/util/clock.js';
import { createGlobalStrictFairnessPolicy } from '../../src/flowcontrol/policies/global-strict-fairness-policy.js';
import { createRoundRobinFairnessPolicy } from '../../src/flowcontrol/policies/round-robin-fairness-policy.js';
import { Harness, band, sloOrdering } from './harness.js';

const S = 200;
const N = 500;
const PRIORITIES = [10, 5, 3, 0, -1, 7, -9];
const SATURATIONS = [0, 0.5, 0.9, 1.0, 1.3];

interface Tracked {
  label: string;
  bytes: number;
  outcomes: FlowOutcome[];
  ticket?: FlowTicket;
  /** Enqueue order, and band + fairness id: FCFS within a flow is enqueue order. */
  seq: number;
  flow: string;
  /** Later requests of its flow dispatched while it waited. */
  overtaken: number;
}

/** Bands: the configured ones, band 0 and the objective's (3); other priorities land in band 0. */
const BANDS = new Set([10, 5, -1, 0, 3]);

/**
 * A random mix of enqueue / cancel / clock movement (expiry) / saturation and pool changes /
 * completions / re-entrant callbacks. Invariants are checked after every operation; callbacks only
 * record (a throw inside would be swallowed by the controller), and the records are checked outside.
 */
function fuzz(seed: number, ops: number, finish: 'drain' | 'shutdown', affinityLookahead = 0): void {
  const random = seededRandom(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  let inFlight = 0;
  let lastSampled = 0;
  const violations: string[] = [];
  const h = new Harness({
    config: {
      defaultRequestTTL: S,
      noEndpointRequestTTL: N,
      maxRequests: 40,
      maxBytes: 40_000,
      priorityBands: [band(10, { maxRequests: 12 }), band(5, { maxBytes: 8_000 }), band(-1, { maxRequests: 6 })],
      affinityLookahead,
    },
    objectivePriorities: [3],
    // Dispatches raise saturation until completions bring it down: re-sampling matters.
    saturation: (hh) => (lastSampled = hh.saturation + inFlight * 0.05),
  });
  const all: Tracked[] = [];
  const live = new Map<string, Tracked>();
  let liveBytes = 0;

  let overtakes = 0;
  const submit = (): void => {
    const priority = pick(PRIORITIES);
    // Fewer, longer flows when looking ahead: the look-ahead works inside one flow.
    const fairnessId = `f${Math.floor(random() * (affinityLookahead > 0 ? 2 : 6))}`;
    const flow = `${BANDS.has(priority) ? priority : 0}/${fairnessId}`;
    const tracked: Tracked = { label: `r${all.length}`, bytes: Math.floor(random() * 2000), outcomes: [], seq: all.length, flow, overtaken: 0 };
    all.push(tracked);
    const reenter = random();
    live.set(tracked.label, tracked);
    liveBytes += tracked.bytes;
    tracked.ticket = h.fc.enqueue({
      fairnessId,
      priority,
      // Asked only with a look-ahead; a coin flip per question, as a fleet changing under it would.
      ...(affinityLookahead > 0 ? { prefersToWait: () => random() < 0.5 } : {}),
      byteSize: tracked.bytes,
      receivedAt: h.clock.now() - Math.floor(random() * 20),
      ...(random() < 0.3 ? { sloTtftMs: Math.floor(random() * 1000) } : {}),
      onOutcome: (outcome, queuedMs) => {
        tracked.outcomes.push(outcome);
        if (tracked.outcomes.length > 1) violations.push(`${tracked.label}: ${tracked.outcomes.join(',')}`);
        if (live.delete(tracked.label)) liveBytes -= tracked.bytes;
        if (outcome === 'Dispatched') {
          inFlight++;
          if (lastSampled >= 1) violations.push(`${tracked.label} dispatched at saturation ${lastSampled}`);
          for (const earlier of live.values()) {
            if (earlier.flow !== flow || earlier.seq > tracked.seq) continue;
            overtakes++;
            if (++earlier.overtaken > affinityLookahead) violations.push(`${earlier.label} overtaken ${earlier.overtaken} times (look-ahead ${affinityLookahead})`);
          }
        }
        if (outcome === 'EvictedTTL' && queuedMs < S) violations.push(`${tracked.label} TTL after ${queuedMs}`);
        if (outcome === 'EvictedNoEndpoints' && queuedMs < N) violations.push(`${tracked.label} N after ${queuedMs}`);
        // Re-entrant callers: a retry, or a disconnect of some other request.
        if (reenter < 0.04) submit();
        else if (reenter < 0.07 && all.length > 0) pick(all).ticket?.cancel();
      },
    });
  };

  for (let op = 0; op < ops; op++) {
    const r = random();
    if (r < 0.4) submit();
    else if (r < 0.55) {
      // Mostly disconnect a waiting request; sometimes a finished one (must be a no-op).
      const pool = random() < 0.7 && live.size > 0 ? [...live.values()] : all;
      if (pool.length > 0) pick(pool).ticket?.cancel();
    } else if (r < 0.7) h.timers.advance(Math.floor(random() * 120));
    else if (r < 0.8) {
      h.saturation = pick(SATURATIONS);
      h.fc.kick();
      if (random() < 0.5) h.timers.runImmediates();
    } else if (r < 0.85) {
      h.poolEmpty = !h.poolEmpty;
      h.fc.kick();
    } else if (r < 0.92) {
      inFlight = Math.max(0, inFlight - 1 - Math.floor(random() * 5));
      h.fc.kick();
    } else if (r < 0.96) h.timers.runImmediates();
    else h.fc.runDispatch();

    assert.equal(h.fc.queued, live.size, `queued count after op ${op}`);
    assert.equal(h.fc.queuedBytes, liveBytes, `queued bytes after op ${op}`);
  }
  assert.deepEqual(violations, []);

  if (finish === 'drain') {
    h.poolEmpty = false;
    inFlight = 0;
    h.saturation = 0;
    h.fc.runDispatch();
  } else {
    h.fc.shutdown();
  }
  h.timers.advance(10_000);
  h.timers.runImmediates();
  assert.deepEqual(violations, []);
  assert.equal(h.fc.queued, 0);
  assert.equal(h.fc.queuedBytes, 0);
  const snap = h.fc.snapshot();
  assert.deepEqual(snap.totals, { requests: 0, bytes: 0 });
  for (const b of snap.bands) assert.deepEqual([b.requests, b.bytes, b.flows.length], [0, 0, 0]);
  const missing = all.filter((t) => t.outcomes.length !== 1).map((t) => `${t.label}:${t.outcomes.join(',')}`);
  assert.deepEqual(missing, [], 'every request got exactly one outcome');

  // The mix really exercised every path.
  const seen = new Set(all.flatMap((t) => t.outcomes));
  const expected: FlowOutcome[] = [
    'Dispatched',
    'RejectedCapacity',
    'RejectedNoEndpoints',
    'EvictedTTL',
    'EvictedNoEndpoints',
    'EvictedContextCancelled',
  ];
  if (finish === 'shutdown') expected.push('EvictedOther');
  if (process.env.FUZZ_DEBUG) {
    const counts: Record<string, number> = {};
    for (const t of all) for (const o of t.outcomes) counts[o] = (counts[o] ?? 0) + 1;
    console.log(seed, all.length, counts, { overtakes, maxOvertaken: Math.max(...all.map((t) => t.overtaken)) });
  }
  for (const outcome of expected) assert.ok(seen.has(outcome), `fuzz produced ${outcome}`);
  assert.equal(h.fc.callbackErrors, 0);
  assert.equal(h.fc.policyErrors, 0);
  if (affinityLookahead > 0) assert.ok(overtakes > 0, 'the look-ahead reordered some dispatches');
  else assert.equal(overtakes, 0, 'strict order within every flow');
}

describe('exactly-once outcomes under a random mix of operations', () => {
  test('10k ops, seed 1, drained at the end', () => fuzz(1, 10_000, 'drain'));
  test('10k ops, seed 7, shut down at the end', () => fuzz(7, 10_000, 'shutdown'));
  test('10k ops, seed 3, affinity look-ahead 3: no request overtaken more than 3 times', () => fuzz(3, 10_000, 'drain', 3));
  test('10k ops, seed 5, affinity look-ahead 8, shut down at the end', () => fuzz(5, 10_000, 'shutdown', 8));
});

/**
 * The controller answers the fairness policies' questions from indexes kept as flows come and go
 * (BandView). Checked against a scan of a model of the band, after random arrivals (some with a
 * better head than their flow had), cancels, expiries and single dispatches over 60 flows.
 */
describe('fairness policies over the controller\'s band indexes agree with a scan of every flow', () => {
  interface Queued {
    label: string;
    flow: string;
    seq: number;
    sloDeadline: number;
    receivedAt: number;
    ticket: FlowTicket;
  }
  const byId = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

  function run(seed: number, policy: 'global-strict' | 'round-robin'): void {
    const random = seededRandom(seed);
    let allowance = 0;
    const h = new Harness({
      fairness: policy === 'global-strict' ? createGlobalStrictFairnessPolicy('g') : createRoundRobinFairnessPolicy('r'),
      ordering: sloOrdering,
      config: { defaultRequestTTL: 400 },
      saturation: () => (allowance > 0 ? 0 : 1),
    });
    const queued = new Map<string, Queued>();
    let cursor: string | undefined;
    let dispatches = 0;
    /** What a scan of the band's flows would dispatch next. */
    const expected = (): Queued | undefined => {
      const live = [...queued.values()];
      if (policy === 'global-strict') {
        // Best head by ordering, ties to the least flow id; within a flow, arrival order.
        return live.sort((a, b) => sloOrdering.compare(a as never, b as never) || byId(a.flow, b.flow) || a.seq - b.seq)[0];
      }
      const flows = [...new Set(live.map((q) => q.flow))].sort(byId);
      const flow = flows.find((f) => cursor === undefined || f > cursor) ?? flows[0];
      return live.filter((q) => q.flow === flow).sort((a, b) => sloOrdering.compare(a as never, b as never) || a.seq - b.seq)[0];
    };
    for (let op = 0; op < 3000; op++) {
      const r = random();
      if (r < 0.55) {
        const label = `r${op}`;
        const flow = `tenant-${Math.floor(random() * 60)}`;
        const receivedAt = h.clock.now() - Math.floor(random() * 50);
        const sloTtftMs = Math.floor(random() * 300);
        const entry = { label, flow, seq: op, sloDeadline: receivedAt + sloTtftMs, receivedAt } as Queued;
        queued.set(label, entry);
        entry.ticket = h.submit(label, {
          fairnessId: flow,
          receivedAt,
          sloTtftMs,
          then: (outcome) => {
            queued.delete(label);
            if (outcome === 'Dispatched') allowance--;
          },
        });
      } else if (r < 0.65 && queued.size > 0) {
        const victims = [...queued.values()];
        victims[Math.floor(random() * victims.length)]!.ticket.cancel();
      } else if (r < 0.7) {
        h.timers.advance(Math.floor(random() * 40)); // some expire
      } else if (queued.size > 0) {
        const want = expected()!;
        const before = h.labels().length;
        allowance = 1;
        h.fc.kick();
        h.timers.runImmediates();
        assert.equal(h.labels().length, before + 1);
        const got = h.labels().at(-1);
        assert.equal(got, want.label, `dispatch ${dispatches} (op ${op})`);
        cursor = want.flow;
        dispatches++;
      }
      if (queued.size === 0) cursor = undefined;
    }
    assert.ok(dispatches > 500, `${dispatches} dispatches checked`);
    assert.ok(h.labels('EvictedTTL').length > 50, 'expiries took flows and heads away too');
  }

  test('global-strict, SLO-deadline ordering, seed 11', () => run(11, 'global-strict'));
  test('global-strict, SLO-deadline ordering, seed 12', () => run(12, 'global-strict'));
  test('round-robin, seed 13', () => run(13, 'round-robin'));
});
