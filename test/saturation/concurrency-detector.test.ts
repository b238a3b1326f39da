/** `concurrency-detector` (reference §3.3, test table §6.3). */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import {
  ConcurrencyDetector,
  concurrencyDetectorDefinition,
  concurrencyDetectorParams,
} from '../../src/saturation/concurrency-detector.js';
import { isSaturationDetector } from '../../src/saturation/detector.js';
import { ManualClock } from '../../src/util/clock.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest, names, recordingLogger } from '../scheduling/helpers.js';

const NOW = 1_000_000;

function detector(params: Record<string, unknown>): ConcurrencyDetector {
  return new ConcurrencyDetector('concurrency-detector', concurrencyDetectorParams.parse(params));
}

/** Endpoints e0, e1, … with the given in-flight requests and (optionally) a maintained token counter. */
function fleet(...loads: { req?: number; tok?: number }[]): Endpoint[] {
  return loads.map((load, i) => {
    const endpoint = makeEndpoint(`e${i}`, { inFlight: load.req ?? 0 }, NOW);
    endpoint.inFlightTokens = load.tok ?? 0;
    return endpoint;
  });
}

const req = (...counts: number[]) => fleet(...counts.map((n) => ({ req: n })));
const tok = (...counts: number[]) => fleet(...counts.map((n) => ({ tok: n })));

function assertSaturation(d: ConcurrencyDetector, endpoints: Endpoint[], expected: number): void {
  const reading = d.saturation(NOW, endpoints);
  assert.ok(Math.abs(reading.value - expected) < 1e-9, `${reading.value} ≠ ${expected}`);
  assert.equal(reading.stale, 0);
}

const ctx = makeContext(1, new ManualClock(NOW));
const kept = (d: ConcurrencyDetector, endpoints: Endpoint[]) => names(d.filter(ctx, makeRequest(), endpoints));

describe('concurrency-detector, requests mode (max 10)', () => {
  const d = detector({ maxConcurrency: 10 });
  const cases: [string, Endpoint[], number][] = [
    ['none → 1.0 (fail closed)', [], 1.0],
    ['{a:0} → 0', req(0), 0],
    ['{a:5} → 0.5', req(5), 0.5],
    ['{a:10} → 1.0', req(10), 1.0],
    ['{a:10, b:0} → 0.5', req(10, 0), 0.5],
    ['{a:15, b:5} → 1.0', req(15, 5), 1.0],
    ['{a:15, b:15} → 1.5 (not clamped)', req(15, 15), 1.5],
    ['endpoint with no load yet → 0', fleet({}), 0],
  ];
  for (const [name, endpoints, expected] of cases) test(name, () => assertSaturation(d, endpoints, expected));

  test('ignores scraped metrics and a token counter', () => {
    const endpoints = [makeEndpoint('busy', { waiting: 50, kv: 0.99, inFlight: 2 }, NOW)];
    endpoints[0]!.inFlightTokens = 10_000_000;
    assertSaturation(d, endpoints, 0.2);
  });

  test('never stale: missing or old metrics do not matter', () => {
    const endpoints = [makeEndpoint('a', { noMetrics: true, inFlight: 3 }, NOW), makeEndpoint('b', { age: 3_600_000, inFlight: 1 }, NOW)];
    assertSaturation(d, endpoints, 0.2);
  });
});

describe('concurrency-detector, requests mode (max 50, headroom 0.2)', () => {
  const d = detector({ maxConcurrency: 50, headroom: 0.2 });

  test('49 in flight → 0.98, 50 → 1.0 (headroom does not change saturation)', () => {
    assertSaturation(d, req(49), 0.98);
    assertSaturation(d, req(50), 1.0);
  });

  test('filter limit floor(50 × 1.2) = 60: keeps at 59, drops at 60 (next to a clean endpoint)', () => {
    assert.deepEqual(kept(d, req(59, 0)), ['e0', 'e1']);
    assert.deepEqual(kept(d, req(60, 0)), ['e1']);
    assert.deepEqual(kept(d, req(61, 0)), ['e1']);
  });

  test('all over the limit → all returned (fail open)', () => {
    const endpoints = req(60, 75);
    const result = d.filter(ctx, makeRequest(), endpoints);
    assert.deepEqual(names(result), ['e0', 'e1']);
    assert.notEqual(result, endpoints, 'a copy, not the input array');
  });

  test('empty candidate list stays empty', () => {
    assert.deepEqual(kept(d, []), []);
  });
});

describe('concurrency-detector, requests mode, headroom 0: at the limit is dropped (strict <)', () => {
  test('max 10: 9 kept, 10 dropped', () => {
    assert.deepEqual(kept(detector({ maxConcurrency: 10 }), req(9, 10, 3)), ['e0', 'e2']);
  });

  test('the limit rounds down: floor(7 × 1.1) = 7, so 7 in flight is dropped', () => {
    assert.deepEqual(kept(detector({ maxConcurrency: 7, headroom: 0.1 }), req(7, 6, 0)), ['e1', 'e2']);
  });
});

describe('concurrency-detector, tokens mode, each maximum in its own mode', () => {
  test('tokens divide by maxTokenConcurrency, not maxConcurrency; requests the other way round', () => {
    const params = { maxConcurrency: 10, maxTokenConcurrency: 1000 };
    assertSaturation(detector({ ...params, concurrencyMode: 'tokens' }), tok(500, 0), 0.25);
    assertSaturation(detector({ ...params, concurrencyMode: 'requests' }), req(5, 0), 0.25);
    // The default maxTokenConcurrency (1 000 000): 20 000 tokens in flight on one endpoint is 2 %.
    assertSaturation(detector({ concurrencyMode: 'tokens' }), tok(20_000), 0.02);
  });
});

describe('concurrency-detector, tokens mode (max 100)', () => {
  const d = detector({ concurrencyMode: 'tokens', maxTokenConcurrency: 100 });

  test('3 tokens → 0.03', () => assertSaturation(d, tok(3), 0.03));
  test('50 tokens on one of two endpoints → 0.25', () => assertSaturation(d, tok(50, 0), 0.25));
  test('none → 1.0', () => assertSaturation(d, [], 1.0));
  test('over capacity is not clamped', () => assertSaturation(d, tok(250, 150), 2.0));

  test('filter with headroom 0.2 (limit 120): keeps at 110, drops at 120', () => {
    const h = detector({ concurrencyMode: 'tokens', maxTokenConcurrency: 100, headroom: 0.2 });
    assert.deepEqual(kept(h, tok(110, 0)), ['e0', 'e1']);
    assert.deepEqual(kept(h, tok(120, 0)), ['e1']);
    assert.deepEqual(kept(h, tok(120, 130)), ['e0', 'e1'], 'fail open');
  });

  test('tokens are the counted prompt tokens in flight, whatever the request count', () => {
    const d = detector({ concurrencyMode: 'tokens', maxTokenConcurrency: 100 });
    assertSaturation(d, fleet({ req: 5, tok: 0 }), 0);
    assertSaturation(d, fleet({ req: 0, tok: 30 }, { req: 9, tok: 10 }), 0.2);
  });
});

describe('concurrency-detector, hybrid mode (10 requests, 100 tokens)', () => {
  const d = detector({ concurrencyMode: 'hybrid', maxConcurrency: 10, maxTokenConcurrency: 100 });
  const cases: [string, Endpoint[], number][] = [
    ['(0,0) → 0', fleet({ req: 0, tok: 0 }), 0],
    ['(2,80) → 0.8', fleet({ req: 2, tok: 80 }), 0.8],
    ['(9,10) → 0.9', fleet({ req: 9, tok: 10 }), 0.9],
    ['(10,5) → 1.0', fleet({ req: 10, tok: 5 }), 1.0],
    ['(1,100) → 1.0', fleet({ req: 1, tok: 100 }), 1.0],
    ['{(10,0),(0,100)} → 1.0 (per-endpoint max, then mean)', fleet({ req: 10, tok: 0 }, { req: 0, tok: 100 }), 1.0],
    ['{(10,0),(0,0)} → 0.5', fleet({ req: 10, tok: 0 }, { req: 0, tok: 0 }), 0.5],
    ['none → 1.0', [], 1.0],
  ];
  for (const [name, endpoints, expected] of cases) test(name, () => assertSaturation(d, endpoints, expected));

  test('filter (headroom 0): (5,50) keep; (10,50), (5,100), (20,200) drop', () => {
    const endpoints = fleet({ req: 5, tok: 50 }, { req: 10, tok: 50 }, { req: 5, tok: 100 }, { req: 20, tok: 200 });
    assert.deepEqual(kept(d, endpoints), ['e0']);
    assert.deepEqual(kept(d, endpoints.slice(1)), ['e1', 'e2', 'e3'], 'all saturated → fail open');
  });
});

describe('concurrency-detector parameters', () => {
  const p = concurrencyDetectorDefinition.params;

  test('defaults', () => {
    assert.deepEqual(p.parse({}), {
      concurrencyMode: 'requests',
      maxConcurrency: 100,
      maxTokenConcurrency: 1_000_000,
      headroom: 0,
    });
    assertSaturation(detector({}), req(50), 0.5);
  });

  test('tokensPerRequest is accepted and ignored, with a warning', () => {
    const warn = (raw: object) => concurrencyDetectorDefinition.configWarnings!(p.parse(raw), { metricsIntervalMs: 50 });
    assert.deepEqual(warn({}), []);
    assert.match(warn({ tokensPerRequest: 512 })[0]!.message, /tokensPerRequest is ignored: Sluice counts the prompt tokens in flight/);
    assertSaturation(detector({ concurrencyMode: 'tokens', maxTokenConcurrency: 100, tokensPerRequest: 10 }), fleet({ req: 5, tok: 20 }), 0.2);
  });

  test('parsed parameters parse again to the same value', () => {
    for (const raw of [
      {},
      { concurrencyMode: 'hybrid', maxConcurrency: 8, maxTokenConcurrency: 4096, headroom: 0.25, tokensPerRequest: 512 },
      { inFlightLoadProducerName: 'inflight-load-producer' },
    ]) {
      const once = p.parse(raw);
      assert.deepEqual(p.parse(once), once);
    }
  });

  test('config errors (reference §6.3)', () => {
    for (const bad of [
      { maxConcurrency: 0 },
      { maxConcurrency: -1 },
      { maxConcurrency: 2.5 },
      { maxConcurrency: '100' },
      { maxTokenConcurrency: 0 },
      { headroom: -0.5 },
      { concurrencyMode: 'bytes' },
      { concurrencyMode: 'Requests' },
      { tokensPerRequest: 0 },
      { inFlightLoadProducerName: 3 },
      { unknownKey: 1 },
    ]) {
      assert.equal(p.safeParse(bad).success, false, JSON.stringify(bad));
    }
  });

  test('created through its definition and the builtin registry: a detector and a filter; a config warning at headroom > 1', () => {
    const plugin = concurrencyDetectorDefinition.create('cd', p.parse({ headroom: 20 }), makeDeps({ logger: recordingLogger() }));
    assert.ok(isSaturationDetector(plugin));
    assert.equal(plugin.name, 'cd');
    assert.equal(plugin.type, 'concurrency-detector');
    // A config warning (so `sluice validate` shows it at the key), not a log line at start.
    const warn = (headroom: number) => concurrencyDetectorDefinition.configWarnings!(p.parse({ headroom }), { metricsIntervalMs: 50 });
    assert.deepEqual(warn(20), [{ parameter: 'headroom', message: 'headroom is a fraction (0.2 = 20%), not a percentage: 20 allows 2000% over the thresholds' }]);
    assert.deepEqual(warn(1), []);

    const registry = builtinRegistry();
    assert.ok(registry.is('concurrency-detector', 'saturationDetector'));
    assert.ok(registry.is('concurrency-detector', 'filter'));
  });

  test('no nextChangeAt: its reading only changes on dispatch/completion events', () => {
    assert.equal((detector({}) as { nextChangeAt?: unknown }).nextChangeAt, undefined);
  });
});
