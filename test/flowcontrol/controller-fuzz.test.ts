import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FlowOutcome, FlowTicket } from '../../src/flowcontrol/types.js';
import { seededRandom } from '../../src/util/clock.js';
import { Harness, band } from './harness.js';

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
