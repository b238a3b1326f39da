/** Flow-control policies: ordering, fairness and usage limits (reference §2.7–2.9, §6.8). */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  edfOrderingPolicyDefinition,
  fcfsOrderingPolicyDefinition,
  flowControlPolicyDefinitions,
  globalStrictFairnessPolicyDefinition,
  parseSloTtftHeader,
  priorityHoldbackPolicyDefinition,
  roundRobinFairnessPolicyDefinition,
  sloDeadlineOrderingPolicyDefinition,
  softReflectiveCeilingPolicyDefinition,
  staticUsageLimitPolicyDefinition,
  type FairnessPolicy,
  type FlowView,
  type OrderingPolicy,
  type QueuedItemView,
  type UsageLimitPolicy,
} from '../../src/flowcontrol/policies/index.js';
import type { PluginDefinition, PluginDeps } from '../../src/plugins/registry.js';
import { ManualClock, seededRandom } from '../../src/util/clock.js';
import { Harness, listBand } from './harness.js';

const deps: PluginDeps = {
  clock: new ManualClock(),
  random: seededRandom(1),
  pool: { endpoints: [] },
  logger: { warn() {}, info() {}, debug() {} },
  plugins: new Map(),
};

function create<T>(def: PluginDefinition, params: unknown = {}, name = def.type): T {
  return def.create(name, def.params.parse(params), deps) as T;
}

const fcfs = create<OrderingPolicy>(fcfsOrderingPolicyDefinition);
const edf = create<OrderingPolicy>(edfOrderingPolicyDefinition);
const slo = create<OrderingPolicy>(sloDeadlineOrderingPolicyDefinition);

interface Item extends QueuedItemView {
  readonly label: string;
}

function item(label: string, v: Partial<QueuedItemView> & { enqueuedAt: number }): Item {
  return {
    label,
    enqueuedAt: v.enqueuedAt,
    receivedAt: v.receivedAt ?? v.enqueuedAt,
    ttlDeadline: v.ttlDeadline ?? Infinity,
    sloDeadline: v.sloDeadline ?? Infinity,
    byteSize: v.byteSize ?? 100,
  };
}

const order = (policy: OrderingPolicy, items: Item[]): string[] =>
  [...items].sort((a, b) => policy.compare(a, b)).map((i) => i.label);

/** Every permutation-independent sort must yield the same order (a total order, so heaps are deterministic). */
function assertTotalOrder(policy: OrderingPolicy, items: Item[]): void {
  const random = seededRandom(7);
  const expected = order(policy, items);
  for (let round = 0; round < 50; round++) {
    const shuffled = [...items];
    for (let i = shuffled.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [shuffled[i], shuffled[j]] = [shuffled[j]!, shuffled[i]!];
    }
    assert.deepEqual(order(policy, shuffled), expected);
  }
  for (const a of items) {
    assert.equal(policy.compare(a, a), 0);
    for (const b of items) {
      assert.ok(!Number.isNaN(policy.compare(a, b)));
      assert.equal(Math.sign(policy.compare(a, b)) + Math.sign(policy.compare(b, a)), 0, `${a.label} vs ${b.label}`);
    }
  }
}

function flow(id: string, length: number, head?: QueuedItemView): FlowView {
  return { id, priority: 0, length, head: () => (length > 0 ? head : undefined) };
}

function ceilings(policy: UsageLimitPolicy, saturation: number, priorities: number[]): number[] {
  const out = new Float64Array(priorities.length).fill(1.0);
  policy.computeCeilings(saturation, priorities, out);
  return [...out];
}

function assertClose(actual: number[], expected: number[], eps = 1e-4): void {
  assert.equal(actual.length, expected.length, `${actual} vs ${expected}`);
  actual.forEach((v, i) => assert.ok(Math.abs(v - expected[i]!) < eps, `[${i}] ${v} ≠ ${expected[i]} (got ${actual})`));
}

describe('flow-control policy definitions', () => {
  test('types and kinds', () => {
    assert.deepEqual(
      flowControlPolicyDefinitions.map((d) => [d.type, d.kinds]),
      [
        ['fcfs-ordering-policy', ['orderingPolicy']],
        ['edf-ordering-policy', ['orderingPolicy']],
        ['slo-deadline-ordering-policy', ['orderingPolicy']],
        ['global-strict-fairness-policy', ['fairnessPolicy']],
        ['round-robin-fairness-policy', ['fairnessPolicy']],
        ['static-usage-limit-policy', ['usageLimitPolicy']],
        ['priority-holdback-policy', ['usageLimitPolicy']],
        ['soft-reflective-ceiling-policy', ['usageLimitPolicy']],
      ],
    );
  });

  test('parameterless policies accept {} and reject any parameter', () => {
    for (const def of flowControlPolicyDefinitions) {
      if (def.type === 'static-usage-limit-policy' || def.type === 'priority-holdback-policy') continue;
      assert.deepEqual(def.params.parse({}), {}, def.type);
      assert.equal(def.params.safeParse({ threshold: 0.5 }).success, false, def.type);
      assert.equal(def.params.safeParse('x').success, false, def.type);
    }
  });

  test('parsed parameters parse again to the same value (validate output reloads)', () => {
    const samples: [PluginDefinition, unknown][] = [
      ...flowControlPolicyDefinitions
        .filter((d) => d.type !== 'priority-holdback-policy')
        .map((d): [PluginDefinition, unknown] => [d, {}]),
      [staticUsageLimitPolicyDefinition, { threshold: 0.8 }],
      [priorityHoldbackPolicyDefinition, { minCeiling: 0.5 }],
      [priorityHoldbackPolicyDefinition, { minCeiling: 0, maxCeiling: 0.9, domain: 'value', shape: 'linear' }],
    ];
    for (const [def, raw] of samples) {
      const once = def.params.parse(raw);
      assert.deepEqual(def.params.parse(once), once, def.type);
    }
  });

  test('instances carry type and name', () => {
    for (const def of flowControlPolicyDefinitions) {
      const params = def.type === 'priority-holdback-policy' ? { minCeiling: 0.5 } : {};
      const plugin = create<{ type: string; name: string }>(def, params, `my-${def.type}`);
      assert.equal(plugin.type, def.type);
      assert.equal(plugin.name, `my-${def.type}`);
    }
  });
});

describe('ordering policies', () => {
  test('fcfs: enqueuedAt ascending; ties → receivedAt, then byteSize', () => {
    const items = [
      item('c', { enqueuedAt: 30 }),
      item('a', { enqueuedAt: 10, ttlDeadline: 5, sloDeadline: 1 }),
      item('b2', { enqueuedAt: 20, receivedAt: 15, byteSize: 9 }),
      item('b1', { enqueuedAt: 20, receivedAt: 12, byteSize: 900 }),
      item('b3', { enqueuedAt: 20, receivedAt: 15, byteSize: 10 }),
    ];
    assert.deepEqual(order(fcfs, items), ['a', 'b1', 'b2', 'b3', 'c']);
    assert.ok(fcfs.compare(items[1]!, items[0]!) < 0);
    assertTotalOrder(fcfs, items);
  });

  test('edf: earliest ttlDeadline first, Infinity (no TTL) last, ties → FCFS', () => {
    const items = [
      item('none-early', { enqueuedAt: 1 }),
      item('late', { enqueuedAt: 2, ttlDeadline: 500 }),
      item('soon-2', { enqueuedAt: 20, ttlDeadline: 100 }),
      item('soon-1', { enqueuedAt: 10, ttlDeadline: 100 }),
      item('none-late', { enqueuedAt: 5 }),
      item('earliest', { enqueuedAt: 50, ttlDeadline: 60, sloDeadline: Infinity }),
    ];
    assert.deepEqual(order(edf, items), ['earliest', 'soon-1', 'soon-2', 'late', 'none-early', 'none-late']);
    assertTotalOrder(edf, items);
  });

  test('edf ignores the SLO deadline; slo ignores the TTL deadline', () => {
    const a = item('a', { enqueuedAt: 1, ttlDeadline: 100, sloDeadline: 900 });
    const b = item('b', { enqueuedAt: 2, ttlDeadline: 900, sloDeadline: 100 });
    assert.deepEqual(order(edf, [b, a]), ['a', 'b']);
    assert.deepEqual(order(slo, [a, b]), ['b', 'a']);
  });

  test('slo-deadline: earliest first, Infinity last, ties → earlier receivedAt (then FCFS)', () => {
    const items = [
      item('loose', { enqueuedAt: 1, receivedAt: 1, sloDeadline: 5000 }),
      item('none', { enqueuedAt: 2, receivedAt: 0 }),
      item('tight', { enqueuedAt: 3, receivedAt: 3, sloDeadline: 103 }),
      item('mid', { enqueuedAt: 4, receivedAt: 4, sloDeadline: 1004 }),
      // same deadline as mid, received earlier but enqueued later → received wins
      item('mid-earlier', { enqueuedAt: 9, receivedAt: 2, sloDeadline: 1004 }),
      item('none-2', { enqueuedAt: 1, receivedAt: 1 }),
      // full tie on deadline and receivedAt → enqueuedAt
      item('mid-same-recv', { enqueuedAt: 5, receivedAt: 4, sloDeadline: 1004 }),
    ];
    assert.deepEqual(order(slo, items), ['tight', 'mid-earlier', 'mid', 'mid-same-recv', 'loose', 'none', 'none-2']);
    assertTotalOrder(slo, items);
  });

  test('a NaN deadline reads as "no deadline" (keeps the order total)', () => {
    const a = item('nan', { enqueuedAt: 1, ttlDeadline: NaN, sloDeadline: NaN });
    const b = item('finite', { enqueuedAt: 2, ttlDeadline: 10, sloDeadline: 10 });
    const c = item('inf', { enqueuedAt: 3 });
    assert.deepEqual(order(edf, [a, b, c]), ['finite', 'nan', 'inf']);
    assert.deepEqual(order(slo, [c, a, b]), ['finite', 'nan', 'inf']);
  });
});

describe('parseSloTtftHeader (x-llm-d-slo-ttft-ms)', () => {
  const cases: [string | undefined, number | undefined][] = [
    [undefined, undefined],
    ['', undefined],
    ['   ', undefined],
    ['250', 250],
    ['  250\t', 250],
    ['0', 0],
    ['-0', 0],
    ['+7', 7],
    ['007', 7],
    ['-1', undefined],
    ['1.5', undefined],
    ['1e3', undefined],
    ['0x10', undefined],
    ['12ms', undefined],
    ['1_000', undefined],
    ['abc', undefined],
    ['9007199254740991', 9007199254740991],
    ['9007199254740992', undefined],
    ['99999999999999999999999', undefined],
  ];
  for (const [input, expected] of cases) {
    test(`${JSON.stringify(input)} → ${expected}`, () => {
      const got = parseSloTtftHeader(input);
      assert.equal(got, expected);
      if (got === 0) assert.ok(Object.is(got, 0), 'not -0');
    });
  }
});

describe('global-strict-fairness-policy (through the controller, whose band index answers it)', () => {
  const policy = create<FairnessPolicy>(globalStrictFairnessPolicyDefinition);
  /** Queues `submits` (label, flow, ms after the previous one) while saturated, then drains: the dispatch order. */
  const drainOrder = (ordering: OrderingPolicy, submits: [string, string, number, { sloTtftMs?: number }?][]): string[] => {
    const h = new Harness({ fairness: policy, ordering, saturation: 1 });
    for (const [label, fairnessId, after, opts] of submits) {
      h.timers.advance(after);
      h.submit(label, { fairnessId, ...opts });
    }
    h.unblock(0);
    return h.labels();
  };

  test('with FCFS the band is one global queue: a flow\'s second request passes another flow\'s later first one', () => {
    // Not by flow id (a1 would go first), not in turns (b1, a1, b2): by head, across flows.
    assert.deepEqual(drainOrder(fcfs, [['b1', 'b', 0], ['b2', 'b', 10], ['a1', 'a', 10]]), ['b1', 'b2', 'a1']);
  });

  test('heads that tie go to the least flow id, not to the first arrival', () => {
    assert.deepEqual(drainOrder(fcfs, [['z1', 'z', 0], ['a1', 'a', 0], ['m1', 'm', 0]]), ['a1', 'm1', 'z1']);
  });

  test('with SLO deadlines: the flow whose head is due first, though it came last', () => {
    assert.deepEqual(
      drainOrder(slo, [['a1', 'a', 0, { sloTtftMs: 900 }], ['b1', 'b', 10, { sloTtftMs: 500 }], ['c1', 'c', 10, { sloTtftMs: 100 }]]),
      ['c1', 'b1', 'a1'],
    );
  });

  test('an idle band: the arrival alone is chosen (the solo view)', () => {
    const h = new Harness({ fairness: policy, ordering: fcfs, saturation: 0 });
    h.submit('now', { fairnessId: 'x' });
    assert.deepEqual(h.labels(), ['now']);
  });
});

describe('round-robin-fairness-policy', () => {
  const policy = create<FairnessPolicy>(roundRobinFairnessPolicyDefinition);
  const busy = (...ids: string[]) => ids.map((id) => flow(id, 1, item(id, { enqueuedAt: 0 })));
  const pick = (flows: FlowView[], selector = policy.newBandSelector()) => selector.select(listBand(flows), fcfs)?.id ?? null;

  test('rotates through non-empty flows in id order, wrapping around', () => {
    const selector = policy.newBandSelector();
    const flows = busy('c', 'a', 'b');
    const picks = Array.from({ length: 7 }, () => pick(flows, selector));
    assert.deepEqual(picks, ['a', 'b', 'c', 'a', 'b', 'c', 'a']);
  });

  test('ignores head order: unit of fairness is the dispatch turn', () => {
    const selector = policy.newBandSelector();
    const flows = [flow('a', 5, item('a', { enqueuedAt: 100 })), flow('b', 5, item('b', { enqueuedAt: 1 }))];
    assert.deepEqual([pick(flows, selector), pick(flows, selector), pick(flows, selector)], ['a', 'b', 'a']);
  });

  test('skips empty flows', () => {
    const selector = policy.newBandSelector();
    const flows = [flow('a', 1, item('a', { enqueuedAt: 0 })), flow('b', 0), flow('c', 1, item('c', { enqueuedAt: 0 })), flow('d', 0)];
    assert.deepEqual([pick(flows, selector), pick(flows, selector), pick(flows, selector)], ['a', 'c', 'a']);
  });

  test('cursor flow removed: continue at the first id greater than it', () => {
    const selector = policy.newBandSelector();
    assert.equal(pick(busy('a', 'b', 'c', 'd'), selector), 'a');
    assert.equal(pick(busy('a', 'b', 'c', 'd'), selector), 'b');
    // 'b' was garbage-collected: next is 'c', not a restart at 'a'
    assert.equal(pick(busy('a', 'c', 'd'), selector), 'c');
    assert.equal(pick(busy('a', 'c', 'd'), selector), 'd');
    // 'd' (the last id) removed: wrap to the first
    assert.equal(pick(busy('a', 'c'), selector), 'a');
  });

  test('a new flow sorting after the cursor gets the next turn', () => {
    const selector = policy.newBandSelector();
    assert.equal(pick(busy('a', 'c'), selector), 'a');
    assert.equal(pick(busy('a', 'b', 'c'), selector), 'b');
  });

  test('ids in UTF-16 code-unit order, as Array.prototype.sort', () => {
    const selector = policy.newBandSelector();
    const ids = ['b', 'B', 'a', '\u{1F600}', '\uFF5E', 'a0', ''];
    const picks = Array.from({ length: ids.length }, () => pick(busy(...ids), selector));
    assert.deepEqual(picks, [...ids].sort());
  });

  test('empty band → none, and the cursor resets (next pass starts at the first flow)', () => {
    const selector = policy.newBandSelector();
    assert.equal(pick(busy('a', 'b', 'c'), selector), 'a');
    assert.equal(pick(busy('a', 'b', 'c'), selector), 'b');
    assert.equal(pick([flow('a', 0), flow('b', 0), flow('c', 0)], selector), null);
    assert.equal(pick(busy('a', 'b', 'c'), selector), 'a');
    assert.equal(pick([], selector), null);
  });

  test('each band selector keeps its own cursor', () => {
    const band1 = policy.newBandSelector();
    const band2 = policy.newBandSelector();
    const flows = busy('a', 'b', 'c');
    assert.equal(pick(flows, band1), 'a');
    assert.equal(pick(flows, band1), 'b');
    assert.equal(pick(flows, band2), 'a');
    assert.equal(pick(flows, band1), 'c');
  });

  test('3 flows × 3 requests: each consecutive chunk of 3 dispatches holds all 3 flows', () => {
    const selector = policy.newBandSelector();
    const queues = new Map([
      ['x', 3],
      ['y', 3],
      ['z', 3],
    ]);
    const dispatched: string[] = [];
    for (;;) {
      const id = pick(
        [...queues].map(([id, n]) => flow(id, n, item(id, { enqueuedAt: 0 }))),
        selector,
      );
      if (id === null) break;
      queues.set(id, queues.get(id)! - 1);
      dispatched.push(id);
    }
    assert.equal(dispatched.length, 9);
    for (let c = 0; c < 9; c += 3) assert.deepEqual(dispatched.slice(c, c + 3).sort(), ['x', 'y', 'z']);
  });
});

describe('static-usage-limit-policy', () => {
  test('threshold (default 1.0) for every band', () => {
    assert.deepEqual(staticUsageLimitPolicyDefinition.params.parse({}), { threshold: 1 });
    const dflt = create<UsageLimitPolicy>(staticUsageLimitPolicyDefinition);
    assert.deepEqual(ceilings(dflt, 0.99, [10, 0, -1]), [1, 1, 1]);
    const policy = create<UsageLimitPolicy>(staticUsageLimitPolicyDefinition, { threshold: 0.8 });
    assert.deepEqual(ceilings(policy, 0.2, [10, 0, -1]), [0.8, 0.8, 0.8]);
    assert.deepEqual(ceilings(policy, 5, [3]), [0.8]);
    assert.deepEqual(ceilings(policy, 0, []), []);
    // > 1 allowed (deliberate overcommit)
    assert.deepEqual(ceilings(create(staticUsageLimitPolicyDefinition, { threshold: 1.5 }), 0, [0]), [1.5]);
  });

  test('writes only the provisioned bands', () => {
    const policy = create<UsageLimitPolicy>(staticUsageLimitPolicyDefinition, { threshold: 0.5 });
    const out = new Float64Array(4).fill(1);
    policy.computeCeilings(0, [2, 1], out);
    assert.deepEqual([...out], [0.5, 0.5, 1, 1]);
  });

  test('config errors', () => {
    const p = staticUsageLimitPolicyDefinition.params;
    for (const bad of [{ threshold: 0 }, { threshold: -1 }, { threshold: '1' }, { treshold: 1 }]) {
      assert.equal(p.safeParse(bad).success, false, JSON.stringify(bad));
    }
  });
});

describe('priority-holdback-policy (reference §6.8)', () => {
  const rank = create<UsageLimitPolicy>(priorityHoldbackPolicyDefinition, { minCeiling: 0.5 });
  const value = create<UsageLimitPolicy>(priorityHoldbackPolicyDefinition, { minCeiling: 0.5, domain: 'value' });

  test('defaults', () => {
    assert.deepEqual(priorityHoldbackPolicyDefinition.params.parse({ minCeiling: 0.5 }), {
      minCeiling: 0.5,
      maxCeiling: 1,
      shape: 'linear',
      domain: 'rank',
    });
  });

  test('rank domain [0.5, 1.0]', () => {
    assertClose(ceilings(rank, 0.3, [100, 10]), [1, 0.5]);
    assertClose(ceilings(rank, 0.3, [100, 50, 10]), [1, 0.75, 0.5]);
    assertClose(ceilings(rank, 0.3, [100, 50, 10, 0]), [1, 0.8333, 0.6667, 0.5]);
    // values ignored in rank: same ceilings for very different priorities
    assertClose(ceilings(rank, 0.3, [1000, 999, -1000]), [1, 0.75, 0.5]);
    assertClose(ceilings(rank, 0.3, [10, 10, 10]), [1, 0.75, 0.5]);
  });

  test('rank domain [0.8, 0.9] × 3 → [0.9, 0.85, 0.8]', () => {
    const p = create<UsageLimitPolicy>(priorityHoldbackPolicyDefinition, { minCeiling: 0.8, maxCeiling: 0.9 });
    assertClose(ceilings(p, 0, [3, 2, 1]), [0.9, 0.85, 0.8]);
  });

  test('value domain [0.5, 1.0]', () => {
    assertClose(ceilings(value, 0.3, [90, 50, 10]), [1, 0.75, 0.5]);
    assertClose(ceilings(value, 0.3, [100, 50, 10]), [1, 0.7222, 0.5]);
    assertClose(ceilings(value, 0.3, [100, 2, 1]), [1, 0.50505, 0.5], 1e-5);
    assertClose(ceilings(value, 0.3, [10, 10, 10]), [1, 1, 1]);
    assertClose(ceilings(value, 0.3, [100, 10, 10]), [1, 0.5, 0.5]);
    assertClose(ceilings(value, 0.3, [5, 0, -5]), [1, 0.75, 0.5]);
  });

  test('N = 0 writes nothing; N = 1 → maxCeiling (both domains); independent of saturation', () => {
    const p = create<UsageLimitPolicy>(priorityHoldbackPolicyDefinition, { minCeiling: 0.2, maxCeiling: 0.7 });
    assert.deepEqual(ceilings(p, 0.5, []), []);
    assertClose(ceilings(p, 0.5, [42]), [0.7]);
    assertClose(ceilings(create(priorityHoldbackPolicyDefinition, { minCeiling: 0.2, maxCeiling: 0.7, domain: 'value' }), 0.5, [42]), [0.7]);
    assert.deepEqual(ceilings(rank, 0, [3, 2, 1]), ceilings(rank, 5, [3, 2, 1]));
  });

  test('ceilings never increase down the list', () => {
    for (const p of [rank, value]) {
      const c = ceilings(p, 0.5, [50, 40, 40, 7, 0, -3, -100]);
      for (let i = 1; i < c.length; i++) assert.ok(c[i]! <= c[i - 1]!, String(c));
    }
  });

  test('config errors; minCeiling 0.0 is valid', () => {
    const p = priorityHoldbackPolicyDefinition.params;
    for (const bad of [
      {},
      { maxCeiling: 0.9 },
      { minCeiling: 0.5, shape: 'sigmoid' },
      { minCeiling: 0.5, domain: 'log' },
      { minCeiling: -0.1 },
      { minCeiling: 1.0 },
      { minCeiling: 0.5, maxCeiling: 0 },
      { minCeiling: 0, maxCeiling: 0 },
      { minCeiling: 0.5, maxCeiling: 1.1 },
      { minCeiling: 0.5, maxCeiling: 0.5 },
      { minCeiling: 0.6, maxCeiling: 0.5 },
      { minCeiling: '0.5' },
      { minCeiling: 0.5, extra: true },
    ]) {
      assert.equal(p.safeParse(bad).success, false, JSON.stringify(bad));
    }
    assert.equal(p.safeParse({ minCeiling: 0.0 }).success, true);
    assert.equal(p.safeParse({ minCeiling: 0.99, maxCeiling: 1 }).success, true);
    const err = p.safeParse({ minCeiling: 0.9, maxCeiling: 0.5 });
    assert.ok(!err.success && err.error.issues.some((i) => /less than maxCeiling/.test(i.message)));
  });
});

describe('soft-reflective-ceiling-policy (reference §6.8)', () => {
  const fresh = () => create<UsageLimitPolicy>(softReflectiveCeilingPolicyDefinition);

  test('N = 0 writes nothing; N = 1 → [1] at any saturation', () => {
    const p = fresh();
    assert.deepEqual(ceilings(p, 0.7, []), []);
    for (const s of [0, 0.5, 0.7, 0.99, 1, 1.5]) assert.deepEqual(ceilings(p, s, [100]), [1]);
  });

  test('band 0 is always 1.0', () => {
    const p = fresh();
    for (const s of [0, 0.3, 0.5, 0.7, 0.99, 1, 1.5]) assert.equal(ceilings(p, s, [100, 0, -50])[0], 1);
  });

  test('s ≥ 1 → lower bands 0', () => {
    const p = fresh();
    assert.deepEqual(ceilings(p, 1.0, [100, 0, -50]), [1, 0, 0]);
    assert.deepEqual(ceilings(p, 2.5, [100, 0, -50, -60]), [1, 0, 0, 0]);
  });

  test('N = 3, s = 0.3 → all open', () => {
    assert.deepEqual(ceilings(fresh(), 0.3, [100, 0, -50]), [1, 1, 1]);
  });

  test('N = 4, s = 0.7 → band 1 open (0.7 < 0.7667), bands 2–3 gated to 0 or 1, together', () => {
    const p = fresh();
    const seen = new Set<number>();
    for (let call = 0; call < 6; call++) {
      const c = ceilings(p, 0.7, [100, 50, 0, -50]);
      assert.equal(c[0], 1);
      assert.equal(c[1], 1);
      assert.ok(c[2] === 0 || c[2] === 1);
      assert.equal(c[3], c[2], 'gated bands share the decision');
      seen.add(c[2]!);
    }
    assert.deepEqual([...seen].sort(), [0, 1]);
  });

  test('N = 2, s = 0.7 → band 1: 0,1,0,1,0,1 (period 2, first tick = 1)', () => {
    const p = fresh();
    assert.deepEqual(
      Array.from({ length: 6 }, () => ceilings(p, 0.7, [100, -50])[1]),
      [0, 1, 0, 1, 0, 1],
    );
  });

  test('N = 2, s = 0.75 → band 1: 0,0,1,0,0,1 (period 3)', () => {
    const p = fresh();
    assert.deepEqual(
      Array.from({ length: 6 }, () => ceilings(p, 0.75, [100, -50])[1]),
      [0, 0, 1, 0, 0, 1],
    );
  });

  test('a band whose reflective ceiling equals the saturation exactly is gated, not open (N = 5, s = 0.8: band 1 at r = 0.8 opens one call in 4)', () => {
    const p = fresh();
    assert.deepEqual(
      Array.from({ length: 4 }, () => ceilings(p, 0.8, [4, 3, 2, 1, 0])[1]),
      [0, 0, 0, 1],
    );
  });

  test('N = 2, s = 0.5 → period 1: always open while alternating', () => {
    const p = fresh();
    assert.deepEqual(Array.from({ length: 3 }, () => ceilings(p, 0.5, [1, 0])), [[1, 1], [1, 1], [1, 1]]);
  });

  test('the tick advances only on calls with an alternating band', () => {
    const p = fresh();
    assert.equal(ceilings(p, 0.7, [100, -50])[1], 0); // tick 1
    // outside the regime: open below, closed at/over 1 — tick untouched
    assert.deepEqual(ceilings(p, 0.3, [100, -50]), [1, 1]);
    assert.deepEqual(ceilings(p, 1.2, [100, -50]), [1, 0]);
    assert.deepEqual(ceilings(p, 0.4, [100, 0, -50]), [1, 1, 1]);
    assert.equal(ceilings(p, 0.7, [100, -50])[1], 1); // tick 2
    assert.equal(ceilings(p, 0.7, [100, -50])[1], 0); // tick 3
  });

  test('one policy-wide counter: a different band count continues the same tick', () => {
    const p = fresh();
    assert.equal(ceilings(p, 0.75, [1, 0])[1], 0); // tick 1
    assert.equal(ceilings(p, 0.75, [1, 0, -1])[2], 0); // tick 2 (band 1: r = 0.625 ≤ 0.75 → gated too)
    assert.deepEqual(ceilings(p, 0.75, [1, 0, -1]), [1, 1, 1]); // tick 3 → open
  });

  test('ceilings never increase down the list', () => {
    const p = fresh();
    for (const s of [0.1, 0.45, 0.55, 0.6, 0.7, 0.8, 0.95, 0.999, 1, 3]) {
      for (let call = 0; call < 4; call++) {
        const c = ceilings(p, s, [9, 7, 5, 3, 1, 0]);
        for (let i = 1; i < c.length; i++) assert.ok(c[i]! <= c[i - 1]!, `s=${s}: ${c}`);
      }
    }
  });

  test('any parameter is an error', () => {
    const p = softReflectiveCeilingPolicyDefinition.params;
    assert.equal(p.safeParse({}).success, true);
    for (const bad of [{ threshold: 0.5 }, { period: 2 }, { minCeiling: 0.1 }]) {
      assert.equal(p.safeParse(bad).success, false, JSON.stringify(bad));
    }
  });
});
