import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { Pool, type PoolChangeReason } from '../../src/datalayer/pool.js';
import { stageSaturation } from '../../src/saturation/stages.js';
import type { Endpoint, EndpointMetrics, EndpointSpec } from '../../src/datalayer/endpoint.js';

const spec = (name: string, port: number, labels: Record<string, string> = {}): EndpointSpec => ({
  name,
  address: '10.0.0.1',
  port,
  labels,
});

const metrics = (waiting: number): EndpointMetrics => ({ waiting, running: 1, kvUsage: 0.5 });

function recordEvents(pool: Pool): Array<[PoolChangeReason, string | undefined]> {
  const events: Array<[PoolChangeReason, string | undefined]> = [];
  pool.onChange((reason, ep) => events.push([reason, ep?.name]));
  return events;
}

describe('Pool: endpoint set', () => {
  test('lists endpoints in order, by name, with a stable array', () => {
    const pool = new Pool([spec('a', 1, { 'llm-d.ai/role': 'prefill' }), spec('b', 2)]);
    assert.deepEqual(pool.endpoints.map((e) => e.name), ['a', 'b']);
    assert.equal(pool.endpoints, pool.endpoints);
    assert.ok(Object.isFrozen(pool.endpoints));
    assert.equal(pool.byName('a')?.stage, 'prefill');
    assert.equal(pool.byName('b')?.stage, 'decode');
    assert.equal(pool.byName('zzz'), undefined);
  });

  test('reload keeps endpoints whose server is unchanged (metrics, errors, in-flight; new labels applied), replaces moved ones, removes the rest', () => {
    const pool = new Pool([spec('keep', 1, { zone: 'x' }), spec('relabel', 2, { zone: 'x' }), spec('move', 3), spec('gone', 4)]);
    const keep = pool.byName('keep')!;
    const relabel = pool.byName('relabel')!;
    const move = pool.byName('move')!;
    const gone = pool.byName('gone')!;
    pool.recordScrape(keep, { metrics: metrics(7) }, 5000);
    pool.recordScrape(keep, { error: 'boom' }, 6000);
    pool.acquire(keep);
    pool.acquire(keep);
    pool.recordScrape(relabel, { metrics: metrics(3) }, 5000);
    pool.acquire(relabel);
    const before = pool.endpoints;
    const events = recordEvents(pool);

    const { added, removed, relabelled } = pool.setEndpoints([
      spec('new', 9),
      { ...spec('keep', 1, { zone: 'x' }) },
      spec('relabel', 2, { zone: 'y' }),
      { ...spec('move', 3), address: '10.0.0.2' },
    ]);

    assert.notEqual(pool.endpoints, before);
    assert.deepEqual(pool.endpoints.map((e) => e.name), ['new', 'keep', 'relabel', 'move']);
    assert.equal(pool.byName('keep'), keep);
    assert.deepEqual(keep.metrics, metrics(7));
    assert.equal(keep.metricsAt, 5000);
    assert.equal(keep.lastError, 'boom');
    assert.equal(keep.scrapeErrors, 1);
    assert.equal(keep.inFlight, 2);
    assert.equal(keep.removed, false);

    // Same server, new labels: the same object (its in-flight requests release against it), relabelled.
    assert.equal(pool.byName('relabel'), relabel);
    assert.equal(relabel.labels['zone'], 'y');
    assert.equal(relabel.inFlight, 1);
    assert.deepEqual(relabel.metrics, metrics(3));
    assert.deepEqual(relabelled, [relabel]);
    assert.notEqual(pool.byName('move'), move);
    assert.equal(pool.byName('move')!.address, '10.0.0.2');
    assert.deepEqual(added.map((e) => e.name).sort(), ['move', 'new']);
    assert.deepEqual(removed.map((e) => e.name).sort(), ['gone', 'move']);
    for (const old of [move, gone]) assert.equal(old.removed, true);
    assert.equal(relabel.removed, false);
    assert.equal(pool.byName('gone'), undefined);
    assert.deepEqual(events, [['endpoints', undefined]]);
  });

  test('a reload with the same set keeps the array and notifies nobody', () => {
    const pool = new Pool([spec('a', 1, { r: '1' }), spec('b', 2)]);
    const before = pool.endpoints;
    const events = recordEvents(pool);
    assert.deepEqual(pool.setEndpoints([spec('a', 1, { r: '1' }), spec('b', 2)]), { added: [], removed: [], relabelled: [] });
    assert.equal(pool.endpoints, before);
    assert.deepEqual(events, []);
  });

  test('a reorder replaces the array with the same objects', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)]);
    const [a, b] = pool.endpoints;
    const events = recordEvents(pool);
    assert.deepEqual(pool.setEndpoints([spec('b', 2), spec('a', 1)]), { added: [], removed: [], relabelled: [] });
    assert.deepEqual(pool.endpoints, [b, a]);
    assert.deepEqual(events, [['endpoints', undefined]]);
  });

  test('duplicate names or targets are rejected and change nothing', () => {
    const pool = new Pool([spec('a', 1)]);
    const before = pool.endpoints;
    assert.throws(() => pool.setEndpoints([spec('x', 1), spec('x', 2)]), /duplicate endpoint name 'x'/);
    assert.throws(() => pool.setEndpoints([spec('x', 1), spec('y', 1)]), /duplicate endpoint address 10\.0\.0\.1:1/);
    assert.equal(pool.endpoints, before);
    assert.equal(before[0]!.removed, false);
    assert.throws(() => new Pool([spec('a', 1), spec('a', 2)]), /duplicate/);
  });

  test('an empty pool is fine', () => {
    const pool = new Pool([]);
    assert.deepEqual(pool.endpoints, []);
    pool.setEndpoints([spec('a', 1)]);
    assert.equal(pool.endpoints.length, 1);
  });
});

describe('Pool: listeners', () => {
  test('onChange returns an unsubscribe function', () => {
    const pool = new Pool([spec('a', 1)]);
    const seen: PoolChangeReason[] = [];
    const off = pool.onChange((r) => seen.push(r));
    pool.notify('metrics');
    off();
    pool.notify('metrics');
    assert.deepEqual(seen, ['metrics']);
  });

  test('a throwing listener does not stop the others; its error is rethrown after', () => {
    const pool = new Pool([spec('a', 1)]);
    const seen: string[] = [];
    pool.onChange(() => {
      throw new Error('listener broke');
    });
    pool.onChange((r) => seen.push(r));
    assert.throws(() => pool.notify('inflight'), /listener broke/);
    assert.deepEqual(seen, ['inflight']);
  });

  test('a listener may unsubscribe itself while being notified', () => {
    const pool = new Pool([]);
    const seen: string[] = [];
    const off = pool.onChange(() => {
      seen.push('first');
      off();
    });
    pool.onChange(() => seen.push('second'));
    pool.notify('metrics');
    pool.notify('metrics');
    assert.deepEqual(seen, ['first', 'second', 'second']);
  });
});

describe('Pool: in-flight accounting', () => {
  test('acquire and release count and notify', () => {
    const pool = new Pool([spec('a', 1)]);
    const ep = pool.byName('a')!;
    const events = recordEvents(pool);
    pool.acquire(ep);
    pool.acquire(ep);
    pool.release(ep);
    assert.equal(ep.inFlight, 1);
    assert.deepEqual(events, [
      ['inflight', 'a'],
      ['inflight', 'a'],
      ['inflight', 'a'],
    ]);
  });

  test('release never goes below zero; the violation is counted and reported', () => {
    const violations: string[] = [];
    const pool = new Pool([spec('a', 1)], { onInvariantViolation: (msg) => violations.push(msg) });
    const ep = pool.byName('a')!;
    const events = recordEvents(pool);
    pool.acquire(ep);
    pool.release(ep);
    pool.release(ep);
    pool.release(ep);
    assert.equal(ep.inFlight, 0);
    assert.equal(pool.releaseUnderflows, 2);
    assert.equal(violations.length, 2);
    assert.match(violations[0]!, /release without a matching acquire on endpoint 'a'/);
    assert.equal(events.length, 2); // acquire + the one real release
  });

  test('prompt tokens: sent and done add and take away; more done than sent is counted and reported', () => {
    const violations: string[] = [];
    const pool = new Pool([spec('a', 1)], { onInvariantViolation: (msg) => violations.push(msg) });
    const ep = pool.byName('a')!;
    const events = recordEvents(pool);
    pool.promptSent(ep, 100);
    pool.promptSent(ep, 0); // nothing to count: no event
    pool.promptSent(ep, NaN); // not a count: it would stay in the sum for good
    pool.promptSent(ep, Infinity);
    pool.promptSent(ep, 20);
    pool.promptDone(ep, 100);
    assert.deepEqual([ep.inFlightTokens, pool.releaseUnderflows], [20, 0]);
    pool.promptDone(ep, 50);
    assert.deepEqual([ep.inFlightTokens, pool.releaseUnderflows], [0, 1]);
    assert.match(violations[0]!, /prompt tokens released without being sent on endpoint 'a'/);
    assert.equal(events.length, 4);
  });

  test('requests to a removed endpoint still release against the old object', () => {
    const pool = new Pool([spec('a', 1)]);
    const ep = pool.byName('a')!;
    pool.acquire(ep);
    pool.setEndpoints([]);
    assert.equal(ep.removed, true);
    pool.release(ep);
    assert.equal(ep.inFlight, 0);
    assert.equal(pool.releaseUnderflows, 0);
  });

  test('a server renamed (same address and port) keeps counting the requests in flight on it, released against the new endpoint', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)]);
    const a = pool.byName('a')!;
    pool.acquire(a);
    pool.acquire(a);
    pool.promptSent(a, 40);
    pool.setEndpoints([spec('a2', 1), spec('b', 2)]);
    const a2 = pool.byName('a2')!;
    assert.notEqual(a2, a);
    assert.deepEqual([a2.inFlight, a2.inFlightTokens], [2, 40], 'what runs on the server counts under its new name');
    // Renamed again while they run: the newest name counts them.
    pool.setEndpoints([spec('a3', 1), spec('b', 2)]);
    const a3 = pool.byName('a3')!;
    assert.deepEqual([a2.inFlight, a3.inFlight, a3.inFlightTokens], [0, 2, 40]);
    // A request scheduled on `a` before the renames, sent only now (a P/D leg, a retry): counted on a3 too.
    pool.acquire(a);
    pool.promptSent(a, 8);
    assert.deepEqual([a.inFlight, a3.inFlight, a3.inFlightTokens], [0, 3, 48]);
    pool.promptDone(a, 48);
    pool.release(a);
    pool.release(a);
    pool.release(a);
    assert.deepEqual([a.inFlight, a3.inFlight, a3.inFlightTokens, pool.releaseUnderflows], [0, 0, 0, 0]);
    // Another server with a request in flight hands nothing over.
    const b = pool.byName('b')!;
    pool.acquire(b);
    pool.setEndpoints([spec('a3', 1), spec('c', 3)]);
    assert.deepEqual([b.inFlight, pool.byName('c')!.inFlight], [1, 0]);
    // A server removed while busy, then added back under a new name, takes its requests back too.
    pool.setEndpoints([spec('a3', 1), spec('c', 3), spec('b2', 2)]);
    assert.deepEqual([b.inFlight, pool.byName('b2')!.inFlight], [0, 1]);
    pool.release(b);
    assert.deepEqual([pool.byName('b2')!.inFlight, pool.releaseUnderflows], [0, 0]);
  });

  test('a removed endpoint with requests in flight is taken back, counts and all, when the same server returns', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)]);
    const a = pool.byName('a')!;
    pool.acquire(a);
    pool.promptSent(a, 40);
    pool.setEndpoints([spec('b', 2)]);
    assert.equal(a.removed, true);
    // A reverted edit: the same name and server come back while the request still runs.
    const back = pool.setEndpoints([spec('a', 1), spec('b', 2)]);
    assert.deepEqual(back.added, [a]);
    assert.equal(pool.byName('a'), a);
    assert.deepEqual([a.removed, a.inFlight, a.inFlightTokens], [false, 1, 40]);
    pool.promptDone(a, 40);
    pool.release(a);
    assert.deepEqual([a.inFlight, pool.releaseUnderflows], [0, 0]);
    // Idle when removed (or moved to another port, or idle by the time it returns): a fresh object.
    pool.setEndpoints([spec('b', 2)]);
    assert.notEqual(pool.setEndpoints([spec('a', 1), spec('b', 2)]).added[0], a);
    const b = pool.byName('b')!;
    pool.acquire(b);
    pool.setEndpoints([spec('a', 1)]);
    assert.notEqual(pool.setEndpoints([spec('a', 1), spec('b', 3)]).added[0], b, 'another port is another server');
    pool.setEndpoints([spec('a', 1)]);
    pool.release(b);
    assert.notEqual(pool.setEndpoints([spec('a', 1), spec('b', 2)]).added[0], b, 'its last request ended while it was away');
  });
});

describe('Pool: recordScrape', () => {
  test('success sets metrics and time and clears the error; failure keeps values and their old time', () => {
    const pool = new Pool([spec('a', 1)]);
    const ep: Endpoint = pool.byName('a')!;
    const events = recordEvents(pool);

    pool.recordScrape(ep, { error: 'connect ECONNREFUSED' }, 900);
    assert.equal(ep.metrics, undefined);
    assert.equal(ep.metricsAt, 0);
    assert.equal(ep.metricsAge(900), Infinity);
    assert.equal(ep.scrapeErrors, 1);

    pool.recordScrape(ep, { metrics: metrics(3) }, 1000);
    assert.deepEqual(ep.metrics, metrics(3));
    assert.equal(ep.metricsAt, 1000);
    assert.equal(ep.lastError, undefined);

    pool.recordScrape(ep, { error: 'HTTP 500 from /metrics' }, 1500);
    pool.recordScrape(ep, { error: 'timed out after 100 ms' }, 2000);
    assert.deepEqual(ep.metrics, metrics(3));
    assert.equal(ep.metricsAt, 1000);
    assert.equal(ep.metricsAge(2000), 1000);
    assert.equal(ep.lastError, 'timed out after 100 ms');
    assert.equal(ep.scrapeErrors, 3);

    pool.recordScrape(ep, { metrics: metrics(4) }, 2100);
    assert.equal(ep.metricsAt, 2100);
    assert.equal(ep.lastError, undefined);
    assert.equal(ep.scrapeErrors, 3, 'the error total is cumulative');
    assert.deepEqual(
      events.map((e) => e[0]),
      ['metrics', 'metrics', 'metrics', 'metrics', 'metrics'],
    );
  });

  test('results for a removed endpoint are dropped silently', () => {
    const pool = new Pool([spec('a', 1)]);
    const ep = pool.byName('a')!;
    pool.setEndpoints([]);
    const events = recordEvents(pool);
    pool.recordScrape(ep, { metrics: metrics(1) }, 1000);
    assert.equal(ep.metrics, undefined);
    assert.deepEqual(events, []);
  });
});

test('a reload that changes only labels moves the endpoint to its new role and stage, and tells the listeners', () => {
  const pool = new Pool([spec('a', 1, { 'llm-d.ai/role': 'prefill' })]);
  const a = pool.byName('a')!;
  const detector = { type: 'd', name: 'd', filter: (_c: unknown, _r: unknown, e: readonly Endpoint[]) => [...e], saturation: () => ({ value: 0.5, stale: 0 }) };
  assert.deepEqual(stageSaturation(detector, 0, pool.endpoints), { global: 0.5, stale: 0, prefill: 0.5 });
  const before = pool.endpoints;
  const events: string[] = [];
  pool.onChange((reason) => events.push(reason));
  pool.setEndpoints([spec('a', 1, { 'llm-d.ai/role': 'decode', 'llm-d.ai/engine-type': 'sglang' })]);
  assert.notEqual(pool.endpoints, before, 'a new array: what is cached per list (the stage partition) is computed again');
  assert.deepEqual(pool.endpoints, [a]);
  assert.equal(a.role, 'decode');
  assert.equal(a.stage, 'decode');
  assert.equal(a.engineType, 'sglang');
  assert.deepEqual(stageSaturation(detector, 0, pool.endpoints), { global: 0.5, stale: 0, decode: 0.5 }, 'saturation reads it in its new stage');
  assert.ok(Object.isFrozen(a.labels));
  assert.deepEqual(events, ['endpoints']);
});

test("the engine type comes from llm-d.ai/engine-type, else from GIE's legacy label, else vllm", () => {
  const pool = new Pool([
    spec('legacy', 1, { 'inference.networking.k8s.io/engine-type': 'trtllm-serve' }),
    spec('both', 2, { 'inference.networking.k8s.io/engine-type': 'trtllm-serve', 'llm-d.ai/engine-type': 'sglang' }),
    spec('none', 3),
  ]);
  assert.deepEqual(pool.endpoints.map((e) => e.engineType), ['trtllm-serve', 'sglang', 'vllm']);
  // pool.metrics.defaultEngine names the unlabelled ones' engine; a reload changing only it re-reads them.
  const before = pool.byName('none')!;
  const { relabelled } = pool.setEndpoints([spec('legacy', 1, { 'inference.networking.k8s.io/engine-type': 'trtllm-serve' }), { ...spec('none', 3), defaultEngine: 'sglang' }]);
  assert.deepEqual(relabelled.map((e) => e.name), ['none']);
  assert.equal(pool.byName('none'), before, 'the same object: its in-flight requests release against it');
  assert.deepEqual(pool.endpoints.map((e) => e.engineType), ['trtllm-serve', 'sglang']);
  assert.equal(new Pool([{ ...spec('labelled', 1, { 'llm-d.ai/engine-type': 'vllm' }), defaultEngine: 'sglang' }]).endpoints[0]!.engineType, 'vllm');
});

describe('Pool: the servers of a request model (eligibleFor)', () => {
  const page = (model?: string): EndpointMetrics => ({ waiting: 0, running: 0, kvUsage: 0, ...(model !== undefined ? { model } : {}) });
  const names = (eps: readonly Endpoint[]) => eps.map((e) => e.name);

  test('one model named (or none): every eligible endpoint, the same array', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)]);
    assert.equal(pool.eligibleFor('x', 0), pool.eligible(0));
    pool.recordScrape(pool.byName('a')!, { metrics: page('A') }, 0);
    pool.recordScrape(pool.byName('b')!, { metrics: page('A') }, 0);
    assert.equal(pool.eligibleFor('A', 0), pool.eligible(0));
    assert.equal(pool.eligibleFor('some-lora', 0), pool.eligible(0));
  });

  test("several: a model's own servers and those whose pages name none; a model no server names goes anywhere", () => {
    const told: string[] = [];
    const pool = new Pool([spec('a', 1), spec('b', 2), spec('c', 3), spec('d', 4)], {
      onServedModels: (servedBy) => told.push(JSON.stringify(Object.fromEntries(servedBy))),
    });
    for (const [name, model] of [['a', 'A'], ['b', 'A'], ['c', 'B'], ['d', undefined]] as const) pool.recordScrape(pool.byName(name)!, { metrics: page(model) }, 0);
    assert.deepEqual(names(pool.eligibleFor('A', 0)), ['a', 'b', 'd']);
    assert.deepEqual(names(pool.eligibleFor('B', 0)), ['c', 'd']);
    assert.deepEqual(names(pool.eligibleFor('sql-lora', 0)), ['a', 'b', 'c', 'd']);
    assert.equal(pool.eligibleFor('A', 0), pool.eligibleFor('A', 0), 'cached while the eligible list stands');
    // Said when the set changes (A, then A and B), not on every page.
    pool.recordScrape(pool.byName('c')!, { metrics: page('B') }, 10);
    pool.recordScrape(pool.byName('d')!, { metrics: page() }, 10);
    assert.deepEqual(told, ['{"A":["a"]}', '{"A":["a","b"],"B":["c"]}']);
    // A server that now serves A: B is no longer named by any, so its requests go anywhere.
    pool.recordScrape(pool.byName('c')!, { metrics: page('A') }, 20);
    assert.deepEqual(names(pool.eligibleFor('B', 20)), ['a', 'b', 'c', 'd']);
    assert.deepEqual(names(pool.eligibleFor('A', 20)), ['a', 'b', 'c', 'd']);
    assert.deepEqual(told.at(-1), '{"A":["a","b","c"]}');
  });

  test("a LoRA adapter a page showed goes to the servers of that page's model; one never shown goes anywhere", () => {
    const pool = new Pool([spec('a', 1), spec('b', 2), spec('c', 3)]);
    const lora = (running: string[], waiting: string[] = []) => ({ running, waiting, maxLora: 4 });
    pool.recordScrape(pool.byName('a')!, { metrics: { ...page('A'), lora: lora(['sql-lora']) } }, 0);
    pool.recordScrape(pool.byName('b')!, { metrics: page('A') }, 0);
    pool.recordScrape(pool.byName('c')!, { metrics: { ...page('B'), lora: lora([], ['poem-lora']) } }, 0);
    assert.deepEqual(names(pool.eligibleFor('sql-lora', 0)), ['a', 'b'], 'every server of A, not only the one that ran it');
    assert.deepEqual(names(pool.eligibleFor('poem-lora', 0)), ['c']);
    assert.deepEqual(names(pool.eligibleFor('other-lora', 0)), ['a', 'b', 'c']);
    // Seen later on a server of B too: either model's servers may serve it.
    pool.recordScrape(pool.byName('c')!, { metrics: { ...page('B'), lora: lora(['sql-lora']) } }, 10);
    assert.deepEqual(names(pool.eligibleFor('sql-lora', 10)), ['a', 'b', 'c']);
  });

  test("a model whose every server is set aside keeps them (as a stage does); a reload recounts", () => {
    const pool = new Pool([spec('a', 1), spec('b', 2), spec('c', 3)]);
    for (const [name, model] of [['a', 'A'], ['b', 'A'], ['c', 'B']] as const) pool.recordScrape(pool.byName(name)!, { metrics: page(model) }, 0);
    const c = pool.byName('c')!;
    for (let i = 0; i < 5; i++) pool.upstreamFailed(c, 'boom', 100);
    assert.ok(c.isSetAside(100));
    assert.deepEqual(names(pool.eligible(100)), ['a', 'b']);
    assert.deepEqual(names(pool.eligibleFor('B', 100)), ['c']);
    assert.deepEqual(names(pool.eligibleFor('A', 100)), ['a', 'b']);
    pool.setEndpoints([spec('a', 1), spec('b', 2)]);
    assert.deepEqual(names(pool.eligibleFor('B', 100)), ['a', 'b'], 'no server names B any more');
  });
});

test('eligibleFor, P/D: a model that only prefill servers name (its decode servers gone) goes anywhere, not to an empty decode profile', () => {
  const pool = new Pool([spec('a-d', 1, { 'llm-d.ai/role': 'decode' }), spec('b-p', 2, { 'llm-d.ai/role': 'prefill' }), spec('a-p', 3, { 'llm-d.ai/role': 'prefill' })]);
  for (const [name, model] of [['a-d', 'A'], ['b-p', 'B'], ['a-p', 'A']] as const) {
    pool.recordScrape(pool.byName(name)!, { metrics: { waiting: 0, running: 0, kvUsage: 0, model } }, 0);
  }
  assert.deepEqual(pool.eligibleFor('B', 0).map((e) => e.name), ['a-d', 'b-p', 'a-p']);
  assert.deepEqual(pool.eligibleFor('A', 0).map((e) => e.name), ['a-d', 'a-p']);
});

test("eligibleFor, P/D with two models: a stage whose every server of the model is set aside keeps them (per stage, as eligible)", () => {
  const pool = new Pool([
    spec('a-p', 1, { 'llm-d.ai/role': 'prefill' }),
    spec('a-d', 2, { 'llm-d.ai/role': 'decode' }),
    spec('b-p', 3, { 'llm-d.ai/role': 'prefill' }),
    spec('b-d', 4, { 'llm-d.ai/role': 'decode' }),
  ]);
  for (const [name, model] of [['a-p', 'A'], ['a-d', 'A'], ['b-p', 'B'], ['b-d', 'B']] as const) {
    pool.recordScrape(pool.byName(name)!, { metrics: { waiting: 0, running: 0, kvUsage: 0, model } }, 0);
  }
  const ad = pool.byName('a-d')!;
  for (let i = 0; i < 5; i++) pool.upstreamFailed(ad, 'boom', 100);
  assert.ok(ad.isSetAside(100), 'one of the decode stage\'s two may be ejected');
  assert.deepEqual(pool.eligible(100).map((e) => e.name), ['a-p', 'b-p', 'b-d'], 'the decode stage is open through b-d');
  // A's requests need a decode server of A: without a-d the decode profile keeps none (429).
  assert.deepEqual(pool.eligibleFor('A', 100).map((e) => e.name), ['a-p', 'a-d']);
  assert.deepEqual(pool.eligibleFor('B', 100).map((e) => e.name), ['b-p', 'b-d']);
});

test('the first scrapes of a large pool cost O(n) in all, not a recount of the models each (O(n²))', () => {
  const n = 20_000;
  const pool = new Pool(Array.from({ length: n }, (_, i) => spec(`e${i}`, 1000 + i)));
  const t0 = performance.now();
  for (let i = 0; i < n; i++) pool.recordScrape(pool.endpoints[i]!, { metrics: { waiting: 0, running: 0, kvUsage: 0, model: i % 2 ? 'A' : 'B' } }, 1);
  const ms = performance.now() - t0;
  assert.ok(ms < 2000, `${Math.round(ms)} ms for ${n} first scrapes (a recount per scrape: ~10 s)`);
  assert.deepEqual(pool.eligibleFor('A', 1).length, n / 2);
});

describe('Pool: LoRA adapters of a request model (eligibleFor)', () => {
  const lpage = (model: string, running: string[] = []): EndpointMetrics => ({
    waiting: 0,
    running: 0,
    kvUsage: 0,
    model,
    ...(running.length ? { lora: { running, waiting: [], maxLora: 8 } } : {}),
  });
  const lnames = (eps: readonly { name: string }[]) => eps.map((e) => e.name);

  test('eligibleFor caches per model served, not per adapter name: one answer per model, kept across new adapters', () => {
    const n = 5000;
    const pool = new Pool(Array.from({ length: n }, (_, i) => spec(`e${i}`, 1000 + i)));
    for (let i = 0; i < n; i++) pool.recordScrape(pool.endpoints[i]!, { metrics: lpage(i % 2 ? 'A' : 'B', [`lora${i}`]) }, 1);
    const forA = pool.eligibleFor('A', 1);
    assert.equal(forA.length, n / 2);
    // Adapters of A get A's answer: the same array, not one copy per adapter name.
    let copies = 0;
    const t0 = performance.now();
    for (let i = 1; i < n; i += 2) if (pool.eligibleFor(`lora${i}`, 1) !== forA) copies++;
    const ms = performance.now() - t0;
    assert.equal(copies, 0, `${copies} adapters got a copy of A's ${n / 2} servers of their own (${Math.round(ms)} ms: a full pass each)`);
    // A new adapter seen somewhere changes no model's servers: the answers stay cached.
    pool.recordScrape(pool.endpoints[1]!, { metrics: lpage('A', ['brand-new']) }, 2);
    assert.equal(pool.eligibleFor('A', 2), forA, 'a new adapter dropped every cached answer');
  });

  test('past 10 000 adapters, the last 10 000 seen are remembered, not only those seen since a wipe', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2)]);
    pool.recordScrape(pool.byName('b')!, { metrics: lpage('B') }, 0);
    for (let i = 0; i <= 10_000; i++) pool.recordScrape(pool.byName('a')!, { metrics: lpage('A', [`lora${i}`]) }, 0);
    // lora1 .. lora10000 are the last 10 000 seen.
    assert.deepEqual(lnames(pool.eligibleFor('lora9999', 0)), ['a'], 'seen one adapter ago, forgotten: may go to a server of B (404)');
    assert.deepEqual(lnames(pool.eligibleFor('lora5000', 0)), ['a']);
  });

  test('an adapter that servers of two models both show goes anywhere, not to whichever page came last', () => {
    const pool = new Pool([spec('a', 1), spec('b', 2), spec('c', 3)]);
    pool.recordScrape(pool.byName('b')!, { metrics: lpage('A') }, 0);
    const seen: string[] = [];
    for (let t = 0; t < 4; t++) {
      pool.recordScrape(pool.byName(t % 2 ? 'c' : 'a')!, { metrics: lpage(t % 2 ? 'B' : 'A', ['shared-lora']) }, t);
      seen.push(lnames(pool.eligibleFor('shared-lora', t)).join(','));
    }
    // a (A) and c (B) both run it: either may serve it.
    assert.deepEqual(seen, ['a,b,c', 'a,b,c', 'a,b,c', 'a,b,c'], `routing flips: ${seen.join(' | ')}`);
  });
});
