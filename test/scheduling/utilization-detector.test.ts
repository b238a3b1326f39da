import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  UtilizationDetector,
  utilizationDetectorDefinition,
  utilizationDetectorParams,
} from '../../src/saturation/utilization-detector.js';
import { isSaturationDetector } from '../../src/saturation/detector.js';
import { ManualClock } from '../../src/util/clock.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest, names, recordingLogger, type EndpointOptions } from './helpers.js';

const NOW = 1_000_000;

/** A real Pool of one endpoint, and `page(waiting, running, at)`: a scrape of it sent and landed. */
async function poolOfOne() {
  const { Pool } = await import('../../src/datalayer/pool.js');
  const pool = new Pool([{ name: 'a', address: '127.0.0.1', port: 9, labels: {} }]);
  const ep = pool.byName('a')!;
  const page = (waiting: number, running: number, at: number): void => {
    pool.scrapeStarted(ep);
    pool.recordScrape(ep, { metrics: { waiting, running, kvUsage: 0.1 } }, at);
  };
  return { pool, ep, page };
}

function detector(params: Record<string, unknown>, logger = recordingLogger()): UtilizationDetector {
  return new UtilizationDetector('utilization-detector', utilizationDetectorParams.parse(params), logger);
}

const fleet = (...specs: EndpointOptions[]) => specs.map((s, i) => makeEndpoint(`e${i}`, s, NOW));

describe('utilization-detector saturation (reference §6.1: q=5, kv=0.9, staleness 100ms)', () => {
  const d = detector({ queueDepthThreshold: 5, kvCacheUtilThreshold: 0.9, metricsStalenessThreshold: '100ms' });
  const cases: [string, EndpointOptions[], number][] = [
    ['none', [], 1.0],
    ['(2, 0.5) fresh', [{ waiting: 2, kv: 0.5 }], 0.5 / 0.9],
    ['(1, 0.1) 200ms old', [{ waiting: 1, kv: 0.1, age: 200 }], 1.0],
    ['(10, 0.1)', [{ waiting: 10, kv: 0.1 }], 2.0],
    ['(1, 0.95)', [{ waiting: 1, kv: 0.95 }], 0.95 / 0.9],
    ['nil metrics', [{ noMetrics: true }], 1.0],
    ['(1, 0.1), (0, 0.2)', [{ waiting: 1, kv: 0.1 }, { waiting: 0, kv: 0.2 }], (0.2 + 0.2 / 0.9) / 2],
    ['(1, 0.1), (0, 0.2, 300ms old)', [{ waiting: 1, kv: 0.1 }, { waiting: 0, kv: 0.2, age: 300 }], 0.6],
    ['(1, 0.1), (15, 0.2)', [{ waiting: 1, kv: 0.1 }, { waiting: 15, kv: 0.2 }], 1.6],
    [
      '(1, 0.1, stale), (20, 0.2), (1, 0.99)',
      [{ waiting: 1, kv: 0.1, age: 500 }, { waiting: 20, kv: 0.2 }, { waiting: 1, kv: 0.99 }],
      (1 + 4 + 0.99 / 0.9) / 3,
    ],
    ['(5, 0.1)', [{ waiting: 5, kv: 0.1 }], 1.0],
    ['(1, 0.1) 101ms old', [{ waiting: 1, kv: 0.1, age: 101 }], 1.0],
    ['(1, 0.1) exactly 100ms old is still fresh (strict >)', [{ waiting: 1, kv: 0.1, age: 100 }], 0.2],
  ];
  for (const [name, specs, expected] of cases) {
    test(name, () => {
      const { value } = d.saturation(NOW, fleet(...specs));
      assert.ok(Math.abs(value - expected) < 1e-4, `${value} ≠ ${expected}`);
    });
  }

  test('(1, 0.1, stale), (20, 0.2), (1, 0.99) ≈ 2.0333 (not clamped)', () => {
    const { value } = d.saturation(NOW, fleet({ waiting: 1, kv: 0.1, age: 500 }, { waiting: 20, kv: 0.2 }, { waiting: 1, kv: 0.99 }));
    assert.ok(Math.abs(value - 2.0333) < 1e-3);
  });

  test('never-scraped endpoint (metricsAt 0) is stale even with metrics set', () => {
    const [e] = fleet({ waiting: 0, kv: 0 });
    e!.metricsAt = 0;
    assert.equal(d.saturation(NOW, [e!]).value, 1);
  });
});

describe('utilization-detector stale count and warning', () => {
  test('fresh + 2h-old + nil metrics → stale 2; empty → 0; fresh only → 0', () => {
    const d = detector({});
    const r = d.saturation(NOW, fleet({ waiting: 0 }, { waiting: 0, age: 2 * 3600_000 }, { noMetrics: true }));
    assert.equal(r.stale, 2);
    assert.equal(d.saturation(NOW, []).stale, 0);
    assert.equal(d.saturation(NOW, fleet({ waiting: 1 })).stale, 0);
  });

  /** The warning is logged once the calls of the turn are done (a microtask later). */
  const turnEnds = () => new Promise<void>((r) => queueMicrotask(r));

  test('one warning naming the stale endpoints and last error, at most every 30 s', async () => {
    const logger = recordingLogger();
    const d = detector({}, logger);
    const endpoints = fleet({ waiting: 0 }, { noMetrics: true });
    endpoints[1]!.lastError = 'connect ECONNREFUSED';
    d.saturation(NOW, endpoints);
    await turnEnds();
    assert.equal(logger.warnings.length, 1);
    const logged = JSON.stringify(logger.warnings[0]!.obj);
    assert.match(logged, /e1/);
    assert.match(logged, /ECONNREFUSED/);
    assert.doesNotMatch(logged, /"e0/);
    d.saturation(NOW + 10_000, endpoints);
    await turnEnds();
    assert.equal(logger.warnings.length, 1);
    d.saturation(NOW + 30_000, endpoints);
    await turnEnds();
    assert.equal(logger.warnings.length, 2);
    d.saturation(NOW + 90_000, fleet({ waiting: 0 }).map((e) => ((e.metricsAt = NOW + 90_000), e)));
    await turnEnds();
    assert.equal(logger.warnings.length, 2);
  });

  test('a reload\'s new detector keeps the 30 s limit of the one it replaces (reloads that add endpoints do not flood the log)', async () => {
    const logger = recordingLogger();
    const endpoints = fleet({ waiting: 0 }, { noMetrics: true });
    const first = detector({}, logger);
    first.saturation(NOW, endpoints);
    await turnEnds();
    assert.equal(logger.warnings.length, 1);
    const second = detector({}, logger);
    second.carryOver(first);
    second.saturation(NOW + 1_000, endpoints);
    await turnEnds();
    assert.equal(logger.warnings.length, 1, 'within 30 s of the last line');
    second.saturation(NOW + 30_000, endpoints);
    await turnEnds();
    assert.equal(logger.warnings.length, 2);
  });

  test('stale endpoints of every stage are named in one line: one call per stage at the same instant, each endpoint once', async () => {
    const logger = recordingLogger();
    const d = detector({}, logger);
    const prefill = fleet({ waiting: 0 }, { noMetrics: true }); // e1 stale
    const decode = [makeEndpoint('d0', { noMetrics: true }, NOW), makeEndpoint('d1', { waiting: 0 }, NOW)];
    d.saturation(NOW, prefill);
    d.saturation(NOW, decode);
    d.saturation(NOW, prefill); // e.g. a second dispatch cycle in the same millisecond
    await turnEnds();
    const named = logger.warnings.map((w) => (w.obj as { staleEndpoints: string[] }).staleEndpoints.map((n) => n.split(' ')[0]));
    assert.deepEqual(named, [['e1', 'd0']]);
    d.saturation(NOW + 1, decode);
    await turnEnds();
    assert.equal(logger.warnings.length, 1, 'then quiet for 30 s');
    assert.match(logger.warnings[0]!.msg ?? "", /read as saturated/);
    const ignoring = recordingLogger();
    detector({ stalenessPolicy: 'ignore' }, ignoring).saturation(NOW, prefill);
    await turnEnds();
    assert.match(ignoring.warnings[0]!.msg ?? "", /left out of the saturation reading/);
  });

  test('an endpoint that refused a request reads stale (named with the error) until a scrape begun after the refusal succeeds', async () => {
    const { Pool } = await import('../../src/datalayer/pool.js');
    const pool = new Pool([{ name: 'a', address: '127.0.0.1', port: 9, labels: {} }, { name: 'b', address: '127.0.0.1', port: 10, labels: {} }]);
    const [a, b] = [pool.byName('a')!, pool.byName('b')!];
    const page = { metrics: { waiting: 0, running: 0, kvUsage: 0 } };
    for (const ep of [a, b]) {
      pool.scrapeStarted(ep);
      pool.recordScrape(ep, page, NOW);
    }
    const logger = recordingLogger();
    const d = detector({ metricsStalenessThreshold: 60_000 }, logger);
    assert.deepEqual(d.saturation(NOW + 10, [a, b]), { value: 0, stale: 0 });
    pool.scrapeStarted(a); // a scrape on its way while a request is refused
    pool.connectFailed(a, 'a request could not connect: connect ECONNREFUSED 127.0.0.1:9');
    assert.deepEqual(d.saturation(NOW + 20, [a, b]), { value: 0.5, stale: 1 });
    assert.deepEqual(names(d.filter(makeContext(1, new ManualClock(NOW + 20)), makeRequest(), [a, b])), ['b']);
    await new Promise<void>((r) => queueMicrotask(r));
    assert.match(JSON.stringify(logger.warnings[0]!.obj), /a \(a request could not connect: connect ECONNREFUSED/);
    pool.recordScrape(a, page, NOW + 30);
    assert.equal(d.saturation(NOW + 30, [a, b]).stale, 1, 'the page was fetched before the refusal');
    pool.scrapeStarted(a);
    pool.recordScrape(a, page, NOW + 40);
    assert.deepEqual(d.saturation(NOW + 40, [a, b]), { value: 0, stale: 0 });
  });

  test('stalenessPolicy ignore: stale endpoints left out of the mean, still counted; all stale → 0.0 (llm-d #2492), empty → 1.0', () => {
    const d = detector({ stalenessPolicy: 'ignore' });
    const r = d.saturation(NOW, fleet({ waiting: 1, kv: 0 }, { noMetrics: true }, { waiting: 0, age: 10_000 }));
    assert.ok(Math.abs(r.value - 0.2) < 1e-9);
    assert.equal(r.stale, 2);
    // A fleet-wide scrape outage must not stop dispatch: that is what `ignore` is for. Still visible as stale.
    assert.deepEqual(d.saturation(NOW, fleet({ noMetrics: true }, { noMetrics: true })), { value: 0, stale: 2 });
    assert.deepEqual(d.saturation(NOW, []), { value: 1, stale: 0 });
  });
});

describe('utilization-detector filter (reference §6.2: q=5, kv=0.8, headroom 0.2 → 6.0 / 0.96)', () => {
  const d = detector({ queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, headroom: 0.2 });
  const ctx = makeContext(1, new ManualClock(NOW));
  const cases: [string, EndpointOptions[], string[]][] = [
    ['(1,0.1)+(4,0.7) → keep 2', [{ waiting: 1, kv: 0.1 }, { waiting: 4, kv: 0.7 }], ['e0', 'e1']],
    ['(5,0.8) → keep', [{ waiting: 5, kv: 0.8 }], ['e0']],
    // Next to another endpoint, so fail-open cannot keep it: the headroom really raises the queue limit.
    ['(5,0.1)+(1,0.1) → keep 2', [{ waiting: 5, kv: 0.1 }, { waiting: 1, kv: 0.1 }], ['e0', 'e1']],
    ['(1,0.9)+(1,0.1) → keep 2', [{ waiting: 1, kv: 0.9 }, { waiting: 1, kv: 0.1 }], ['e0', 'e1']],
    ['(5,0.9) → keep', [{ waiting: 5, kv: 0.9 }], ['e0']],
    ['(7,0.1)+(1,0.1) → keep 1', [{ waiting: 7, kv: 0.1 }, { waiting: 1, kv: 0.1 }], ['e1']],
    ['(1,0.97)+(1,0.5) → keep 1', [{ waiting: 1, kv: 0.97 }, { waiting: 1, kv: 0.5 }], ['e1']],
    ['two stale → keep 2 (fail open)', [{ waiting: 0, age: 1000 }, { noMetrics: true }], ['e0', 'e1']],
    ['(10,0.1)+(1,0.99) → keep 2 (fail open)', [{ waiting: 10, kv: 0.1 }, { waiting: 1, kv: 0.99 }], ['e0', 'e1']],
    ['stale dropped next to a healthy one', [{ waiting: 0, age: 1000 }, { waiting: 2, kv: 0.2 }], ['e1']],
  ];
  for (const [name, specs, expected] of cases) {
    test(name, () => {
      assert.deepEqual(names(d.filter(ctx, makeRequest(), fleet(...specs))), expected);
    });
  }

  test('headroom 0: exactly at the threshold is dropped (strict <)', () => {
    const strict = detector({ queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8 });
    const kept = strict.filter(ctx, makeRequest(), fleet({ waiting: 5, kv: 0.1 }, { waiting: 1, kv: 0.8 }, { waiting: 4, kv: 0.79 }));
    assert.deepEqual(names(kept), ['e2']);
  });
});

describe('utilization-detector reads the queue reckoned since the last scrape (countRecentDispatches)', () => {
  const ctx = makeContext(1, new ManualClock(NOW));

  test('filter: a burst to a server with a queue moves on once it has its queue-depth worth', () => {
    const d = detector({ queueDepthThreshold: 5 });
    const [hot, cold] = fleet({ waiting: 3, inFlight: 10 }, { waiting: 0, inFlight: 2 });
    assert.deepEqual(names(d.filter(ctx, makeRequest(), [hot!, cold!])), ['e0', 'e1']);
    hot!.inFlight += 1; // 3 + 1 < 5: still a candidate
    assert.deepEqual(names(d.filter(ctx, makeRequest(), [hot!, cold!])), ['e0', 'e1']);
    hot!.inFlight += 1; // 3 + 2 = 5: full until a scrape or a completion says otherwise
    assert.deepEqual(names(d.filter(ctx, makeRequest(), [hot!, cold!])), ['e1']);
    hot!.inFlight -= 2; // those finished
    assert.deepEqual(names(d.filter(ctx, makeRequest(), [hot!, cold!])), ['e0', 'e1']);
  });

  test('gate: the saturation reading rises with each request sent and falls with each one finished', () => {
    const d = detector({ queueDepthThreshold: 5 });
    const [a, b] = fleet({ waiting: 4, inFlight: 12 }, { waiting: 4, inFlight: 12 });
    assert.equal(d.saturation(NOW, [a!, b!]).value, 0.8);
    a!.inFlight += 2; // (6 + 4) / 2 / 5
    assert.equal(d.saturation(NOW, [a!, b!]).value, 1);
    a!.inFlight -= 2;
    b!.inFlight -= 4; // b's queue went into the slots its finished requests freed
    assert.equal(d.saturation(NOW, [a!, b!]).value, 0.4);
  });

  test('a server never seen with a queue: slow start, 8 slots or twice the most it ran, then the rest waits', () => {
    const d = detector({ queueDepthThreshold: 5 });
    const [idle, other] = fleet({ waiting: 0, running: 2, inFlight: 2 }, { waiting: 0 });
    idle!.inFlight += 6; // fills the 6 of 8 assumed slots still free
    assert.equal(idle!.estimatedWaiting(), 0);
    assert.equal(d.saturation(NOW, [idle!]).value, 0);
    idle!.inFlight += 5; // a whole backlog would otherwise land here before the next scrape
    assert.equal(idle!.estimatedWaiting(), 5);
    assert.deepEqual(names(d.filter(ctx, makeRequest(), [idle!, other!])), ['e1']);
    idle!.peakRunning = 30; // it has been seen running 30: 60 assumed
    assert.equal(idle!.estimatedWaiting(), 0);
    idle!.inFlight += 60 - 2 - 11 + 5;
    assert.equal(idle!.estimatedWaiting(), 5);
  });

  test('slow start grows by use: each answered request finished with every assumed slot outstanding adds one, at most doubling per page, until a queue is seen', async () => {
    const { pool, ep, page } = await poolOfOne();
    const round = (n: number, answered: boolean): void => {
      for (let i = 0; i < n; i++) pool.acquire(ep);
      for (let i = 0; i < n; i++) pool.release(ep, answered);
    };
    page(0, 1, NOW);
    // A server that answers at once: scraped running 1 while Sluice keeps 16 outstanding.
    for (let i = 0; i < 16; i++) pool.acquire(ep);
    assert.equal(ep.estimatedWaiting(), 9, 'read with 8 assumed slots, its own answers look like a queue');
    // Failures prove nothing: a server failing at once would otherwise draw ever more.
    for (let i = 0; i < 16; i++) pool.release(ep);
    assert.equal(ep.slowStartSlots(), 8);
    // Each answered release with every assumed slot outstanding proves one more: 16 ≥ 8, 15 ≥ 9, … 12 ≥ 12.
    round(16, true);
    assert.equal(ep.slowStartSlots(), 13);
    // Light use proves nothing: releases below the assumed slots leave them as they were.
    round(5, true);
    assert.equal(ep.slowStartSlots(), 13);
    // At most twice what was assumed when the last page landed (8), however many finish before the next.
    for (let r = 0; r < 5; r++) round(16, true);
    assert.equal(ep.slowStartSlots(), 16);
    page(0, 1, NOW + 50);
    for (let r = 0; r < 5; r++) round(16, true);
    assert.equal(ep.slowStartSlots(), 17, 'one more than the 16 it is given, then no more');
    for (let i = 0; i < 16; i++) pool.acquire(ep);
    assert.equal(ep.estimatedWaiting(), 0);
    // Once a page shows a queue, the slots it showed are the answer and use grows nothing.
    page(4, 12, NOW + 100);
    round(16, true);
    for (let i = 0; i < 16; i++) pool.release(ep, true);
    assert.deepEqual([ep.observedSlots, ep.grownSlots], [12, 17]);
    // Before any page, nothing grows (no base to double).
    const fresh = await poolOfOne();
    for (let i = 0; i < 16; i++) fresh.pool.acquire(fresh.ep);
    for (let i = 0; i < 16; i++) fresh.pool.release(fresh.ep, true);
    assert.equal(fresh.ep.slowStartSlots(), 8);
  });

  test('a page with a brief queue and few running does not set the slots below what the server has run', async () => {
    const { pool, ep, page } = await poolOfOne();
    page(0, 30, NOW);
    page(1, 2, NOW + 50); // a prompt held back by the token budget for a moment
    assert.deepEqual([ep.observedSlots, ep.shownSlots()], [2, 30]);
    page(0, 10, NOW + 100);
    for (let i = 0; i < 20; i++) pool.acquire(ep);
    assert.deepEqual([ep.estimatedWaiting(), ep.queueAhead()], [0, 1], '10 + 20 fill its 30 slots: nothing waits yet, the next one would');
    pool.acquire(ep);
    assert.equal(ep.estimatedWaiting(), 1);
  });

  test('once a queue was seen, the slots it showed count, not the slow start; more finished than waited is no queue', () => {
    const a = makeEndpoint('a', { running: 2 });
    a.observedSlots = 4;
    a.peakRunning = 4; // the slow start would assume 8
    a.inFlight += 5; // 5 sent since the scrape, 2 slots free
    assert.equal(a.estimatedWaiting(), 3);
    const b = makeEndpoint('b', { waiting: 1, inFlight: 3 });
    b.inFlight = 0;
    assert.equal(b.estimatedWaiting(), 0);
  });

  test('a server seen full: requests sent since the scrape fill its free slots, then wait', () => {
    const [e] = fleet({ waiting: 0, running: 6, inFlight: 6 });
    e!.observedSlots = 8;
    e!.inFlight += 2;
    assert.equal(e!.estimatedWaiting(), 0);
    e!.inFlight += 3;
    assert.equal(e!.estimatedWaiting(), 3);
    assert.ok(Number.isNaN(fleet({ noMetrics: true })[0]!.estimatedWaiting()));
  });

  test('a recorded scrape takes the in-flight count as its baseline and learns the slots from a queue', async () => {
    const { Pool } = await import('../../src/datalayer/pool.js');
    const pool = new Pool([{ name: 'a', address: '127.0.0.1', port: 9, labels: {} }]);
    const ep = pool.byName('a')!;
    pool.acquire(ep);
    pool.acquire(ep);
    pool.scrapeStarted(ep);
    pool.recordScrape(ep, { metrics: { waiting: 0, running: 2, kvUsage: 0.1 } }, NOW);
    assert.deepEqual([ep.inFlightAtScrape, ep.observedSlots, ep.peakRunning], [2, 0, 2]); // no queue: slots unknown
    pool.scrapeStarted(ep);
    pool.recordScrape(ep, { error: 'boom' }, NOW + 50);
    pool.acquire(ep);
    assert.equal(ep.inFlightAtScrape, 2); // a failed scrape proves nothing new
    pool.scrapeStarted(ep);
    pool.recordScrape(ep, { metrics: { waiting: 3, running: 8, kvUsage: 0.5 } }, NOW + 100);
    assert.deepEqual([ep.inFlightAtScrape, ep.observedSlots], [3, 8]);
    pool.recordScrape(ep, { metrics: { waiting: 1, running: 6, kvUsage: 0.9 } }, NOW + 150);
    assert.deepEqual([ep.observedSlots, ep.peakRunning], [8, 8]); // the most seen; fewer now is a KV limit or a moment
  });

  test('requests sent while a scrape is on its way are not in its page: they stay counted on top of it', async () => {
    const { Pool } = await import('../../src/datalayer/pool.js');
    const pool = new Pool([{ name: 'a', address: '127.0.0.1', port: 9, labels: {} }]);
    const ep = pool.byName('a')!;
    for (let i = 0; i < 14; i++) pool.acquire(ep);
    pool.scrapeStarted(ep);
    pool.recordScrape(ep, { metrics: { waiting: 6, running: 8, kvUsage: 0.5 } }, NOW);
    assert.equal(ep.estimatedWaiting(), 6);
    // A burst goes out while the next scrape is on its way; its page was rendered before the burst.
    pool.scrapeStarted(ep);
    for (let i = 0; i < 10; i++) pool.acquire(ep);
    pool.recordScrape(ep, { metrics: { waiting: 6, running: 8, kvUsage: 0.5 } }, NOW + 80);
    assert.equal(ep.estimatedWaiting(), 16, 'the burst is not forgotten when the page lands');
    // Requests sent and finished while a scrape was on its way count for nothing.
    for (let i = 0; i < 24; i++) pool.release(ep);
    pool.scrapeStarted(ep);
    for (let i = 0; i < 5; i++) pool.acquire(ep);
    for (let i = 0; i < 5; i++) pool.release(ep);
    pool.recordScrape(ep, { metrics: { waiting: 0, running: 0, kvUsage: 0 } }, NOW + 160);
    assert.deepEqual([ep.inFlightAtScrape, ep.estimatedWaiting()], [0, 0]);
  });

  test('countRecentDispatches: false reads the scraped queue only (llm-d), gate and filter', () => {
    const d = detector({ queueDepthThreshold: 5, countRecentDispatches: false });
    const [hot, cold] = fleet({ waiting: 3, inFlight: 10 }, { waiting: 0 });
    hot!.inFlight += 20;
    assert.deepEqual(names(d.filter(ctx, makeRequest(), [hot!, cold!])), ['e0', 'e1']);
    assert.equal(d.saturation(NOW, [hot!, cold!]).value, 0.3);
  });
});

describe('utilization-detector parameters', () => {
  const p = utilizationDetectorDefinition.params;

  test('defaults (staleness in ms)', () => {
    assert.deepEqual(p.parse({}), {
      queueDepthThreshold: 5,
      kvCacheUtilThreshold: 0.8,
      metricsStalenessThreshold: 200,
      headroom: 0,
      stalenessPolicy: 'saturated',
      countRecentDispatches: true,
    });
  });

  test('durations as strings or milliseconds; parse is idempotent', () => {
    assert.equal(p.parse({ metricsStalenessThreshold: '1s' }).metricsStalenessThreshold, 1000);
    assert.equal(p.parse({ metricsStalenessThreshold: '1m30s' }).metricsStalenessThreshold, 90_000);
    assert.equal(p.parse({ metricsStalenessThreshold: 250 }).metricsStalenessThreshold, 250);
    const once = p.parse({ metricsStalenessThreshold: '2s', headroom: 0.1 });
    assert.deepEqual(p.parse(once), once);
  });

  test('config errors (reference §6.2)', () => {
    for (const bad of [
      { queueDepthThreshold: 0 },
      { kvCacheUtilThreshold: 1.5 },
      { kvCacheUtilThreshold: 0.0 },
      { metricsStalenessThreshold: '0s' },
      { metricsStalenessThreshold: 'soon' },
      { metricsStalenessThreshold: -5 },
      { headroom: -0.5 },
      { queueDepthThreshold: '5' },
      { stalenessPolicy: 'open' },
      { unknownKey: 1 },
    ]) {
      assert.equal(p.safeParse(bad).success, false, JSON.stringify(bad));
    }
  });

  test('created through its definition: a detector and a filter; a config warning at headroom > 1', () => {
    const plugin = utilizationDetectorDefinition.create('ud', p.parse({ headroom: 20 }), makeDeps({ logger: recordingLogger() }));
    assert.ok(isSaturationDetector(plugin));
    assert.equal(plugin.name, 'ud');
    assert.equal(plugin.type, 'utilization-detector');
    const warn = (headroom: number) => utilizationDetectorDefinition.configWarnings!(p.parse({ headroom }), { metricsIntervalMs: 50 }).map((w) => w.parameter);
    assert.deepEqual(warn(20), ['headroom']);
    assert.deepEqual(warn(0.2), []);
  });
});

describe('utilization-detector nextChangeAt (flow-controller wake-up)', () => {
  const d = detector({ metricsStalenessThreshold: '200ms' });

  test('earliest metricsAt + threshold over fresh endpoints; stale and never-scraped ones ignored', () => {
    // ages 50 and 120 ms → they turn stale after NOW+150 and NOW+80; the 300 ms-old one already is
    const endpoints = fleet({ age: 50 }, { age: 120 }, { age: 300 }, { noMetrics: true });
    assert.equal(d.nextChangeAt(NOW, endpoints), NOW + 80);
    assert.equal(d.nextChangeAt(NOW, endpoints.slice(0, 1)), NOW + 150);
  });

  test('consistent with saturation(): fresh at the returned instant, stale just after', () => {
    const endpoints = fleet({ waiting: 0, kv: 0, age: 120 });
    const at = d.nextChangeAt(NOW, endpoints)!;
    assert.equal(d.saturation(at, endpoints).stale, 0);
    assert.equal(d.saturation(at + 1, endpoints).stale, 1);
    // once stale, nothing more is pending
    assert.equal(d.nextChangeAt(at + 1, endpoints), undefined);
  });

  test('undefined when nothing is fresh or the list is empty', () => {
    assert.equal(d.nextChangeAt(NOW, []), undefined);
    assert.equal(d.nextChangeAt(NOW, fleet({ noMetrics: true }, { age: 201 })), undefined);
  });

  test('declared on the SaturationDetector interface (optional)', () => {
    const plugin = utilizationDetectorDefinition.create('ud', utilizationDetectorParams.parse({}), makeDeps());
    assert.ok(isSaturationDetector(plugin));
    assert.equal(typeof plugin.nextChangeAt, 'function');
  });
});
