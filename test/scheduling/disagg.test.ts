/** P/D scheduling: disagg-profile-handler rounds, the deciders, parameters and wiring through build. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { ConfigError, loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import type {
  CycleContext,
  Decider,
  Plugin,
  ProfileRunResult,
  SchedulingProfile,
  SchedulingRequest,
} from '../../src/scheduling/framework.js';
import { isDecider } from '../../src/scheduling/framework.js';
import {
  DisaggProfileHandler,
  disaggProfileHandlerDefinition,
  disaggProfileHandlerParams,
} from '../../src/scheduling/plugins/disagg-profile-handler.js';
import {
  PrefixBasedPdDecider,
  prefixBasedPdDeciderDefinition,
  prefixBasedPdDeciderParams,
  shouldDisaggregate,
} from '../../src/scheduling/plugins/prefix-based-pd-decider.js';
import { alwaysDisaggPdDeciderDefinition } from '../../src/scheduling/plugins/always-disagg-pd-decider.js';
import { PrefixCacheScorer, prefixCacheScorerParams } from '../../src/scheduling/plugins/prefix-cache-scorer.js';
import type { PoolView } from '../../src/plugins/registry.js';
import type { PrefixMatch } from '../../src/scheduling/prompt-load.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest, recordingLogger } from './helpers.js';

const profile = (name: string): SchedulingProfile => ({
  name,
  filters: [],
  scorers: [],
  picker: { type: 'fake', name: 'fake', pick: () => [] },
});

const PROFILES = new Map([
  ['decode', profile('decode')],
  ['prefill', profile('prefill')],
]);

/** A decider that records its calls and answers `answer`. */
function recordingDecider(answer: boolean): Decider & { calls: { req: SchedulingRequest; decode: Endpoint }[] } {
  const calls: { req: SchedulingRequest; decode: Endpoint }[] = [];
  return {
    type: 'test-decider',
    name: 'test-decider',
    calls,
    disaggregate: (_ctx: CycleContext, req: SchedulingRequest, decode: Endpoint) => {
      calls.push({ req, decode });
      return answer;
    },
  };
}

function handler(decider: Decider | undefined, params: Record<string, unknown> = {}): DisaggProfileHandler {
  return new DisaggProfileHandler('h', disaggProfileHandlerParams.parse(params), decider);
}

/** Drives the handler like the scheduler does; `run` gives each profile's result. */
function drive(
  h: DisaggProfileHandler,
  req: SchedulingRequest,
  run: (profile: string) => ProfileRunResult,
  profiles: ReadonlyMap<string, SchedulingProfile> = PROFILES,
) {
  const ctx = makeContext();
  const results = new Map<string, ProfileRunResult>();
  const rounds: string[][] = [];
  for (;;) {
    const next = h.pickProfiles(ctx, req, profiles, results);
    if (next.length === 0) break;
    rounds.push(next.map((p) => p.name));
    for (const p of next) results.set(p.name, run(p.name));
    assert.ok(rounds.length < 10, 'handler keeps picking');
  }
  return { rounds, result: h.processResults(req, results) };
}

const d0 = makeEndpoint('decode-0', { role: 'decode' });
const p0 = makeEndpoint('prefill-0', { role: 'prefill' });
const both = makeEndpoint('both-0', { role: 'prefill-decode' });
const ok = (ep: Endpoint): ProfileRunResult => ({ targets: [ep] });
const none: ProfileRunResult = { targets: [], failure: 'nothing' };

describe('disagg-profile-handler', () => {
  test('decode first, then the decider with the chosen decode endpoint, then prefill → prefill-decode', () => {
    const decider = recordingDecider(true);
    const req = makeRequest('a long prompt');
    const { rounds, result } = drive(handler(decider, { deciders: { prefill: 'x' } }), req, (p) => ok(p === 'decode' ? d0 : p0));
    assert.deepEqual(rounds, [['decode'], ['prefill']]);
    assert.equal(decider.calls.length, 1);
    assert.equal(decider.calls[0]!.req, req);
    assert.equal(decider.calls[0]!.decode, d0);
    assert.equal(result.primaryProfile, 'decode');
    assert.equal(result.profileResults.get('decode')!.targets[0], d0);
    assert.equal(result.profileResults.get('prefill')!.targets[0], p0);
    assert.deepEqual(result.disaggregation, { decision: 'prefill-decode', prefill: p0, connector: 'sidecar' });
  });

  test('decider says no → the prefill profile never runs, decode-only', () => {
    const { rounds, result } = drive(handler(recordingDecider(false)), makeRequest(), () => ok(d0));
    assert.deepEqual(rounds, [['decode']]);
    assert.equal(result.profileResults.has('prefill'), false);
    assert.deepEqual(result.disaggregation, { decision: 'decode-only', connector: 'sidecar' });
  });

  test('prefill finding nothing degrades to decode-only', () => {
    const { rounds, result } = drive(handler(recordingDecider(true)), makeRequest(), (p) => (p === 'decode' ? ok(d0) : none));
    assert.deepEqual(rounds, [['decode'], ['prefill']]);
    assert.equal(result.primaryProfile, 'decode');
    assert.equal(result.disaggregation?.decision, 'decode-only');
    assert.equal(result.disaggregation?.prefill, undefined);
  });

  test('prefill choosing the decode endpoint itself is decode-only', () => {
    const { result } = drive(handler(recordingDecider(true)), makeRequest(), () => ok(both));
    assert.equal(result.disaggregation?.decision, 'decode-only');
  });

  test('prefill choosing the decode endpoint: the next endpoint it scored as high prefills instead (wrapping); none as high → decode-only', () => {
    const [b0, b1, b2] = ['b0', 'b1', 'b2'].map((n) => makeEndpoint(n, { role: 'prefill-decode' })) as [Endpoint, Endpoint, Endpoint];
    const prefillRun = (scores: [Endpoint, number][]): ProfileRunResult => ({ targets: [b1], scored: scores.map(([endpoint, score]) => ({ endpoint, score })) });
    const decide = (run: ProfileRunResult) => drive(handler(recordingDecider(true)), makeRequest(), (p) => (p === 'decode' ? ok(b1) : run)).result.disaggregation;
    assert.deepEqual(decide(prefillRun([[b0, 2], [b1, 2], [b2, 2]])), { decision: 'prefill-decode', prefill: b2, connector: 'sidecar' });
    // The prefill run names it first too (session-affinity and no-hit-lru scorers read it there).
    const { result } = drive(handler(recordingDecider(true)), makeRequest(), (p) => (p === 'decode' ? ok(b1) : prefillRun([[b0, 2], [b1, 2], [b2, 2]])));
    assert.deepEqual(result.profileResults.get('prefill')!.targets, [b2]);
    assert.deepEqual(result.profileResults.get('decode')!.targets, [b1]);
    assert.deepEqual(decide(prefillRun([[b0, 2], [b1, 2], [b2, 1]])), { decision: 'prefill-decode', prefill: b0, connector: 'sidecar' });
    assert.deepEqual(decide(prefillRun([[b0, 1.9], [b1, 2], [b2, 1]])), { decision: 'decode-only', connector: 'sidecar' });
  });

  test('nixlv2: several sequences (n > 1) or a prompt batch are decode-only, without asking the decider; other connectors disaggregate them', () => {
    for (const body of [{ n: 2 }, { prompt: ['a', 'b'] }, { prompt: [[1, 2], [3, 4]] }]) {
      const decider = recordingDecider(true);
      const req = makeRequest('x', { body });
      const { rounds, result } = drive(handler(decider, { connector: 'nixlv2' }), req, (p) => ok(p === 'decode' ? d0 : p0));
      assert.deepEqual(rounds, [['decode']], JSON.stringify(body));
      assert.equal(decider.calls.length, 0);
      assert.deepEqual(result.disaggregation, { decision: 'decode-only', connector: 'nixlv2' });
      for (const connector of ['sidecar', 'shared-storage']) {
        const other = drive(handler(recordingDecider(true), { connector }), req, (p) => ok(p === 'decode' ? d0 : p0));
        assert.equal(other.result.disaggregation?.decision, 'prefill-decode', connector);
      }
    }
    // One prompt as token ids, or n = 1, is one sequence.
    for (const body of [{ prompt: [1, 2, 3] }, { n: 1 }]) {
      const { result } = drive(handler(recordingDecider(true), { connector: 'nixlv2' }), makeRequest('x', { body }), (p) => ok(p === 'decode' ? d0 : p0));
      assert.equal(result.disaggregation?.decision, 'prefill-decode', JSON.stringify(body));
    }
  });

  test('decode finding nothing stops at once: no decider call, no prefill, no decision', () => {
    const decider = recordingDecider(true);
    const { rounds, result } = drive(handler(decider), makeRequest(), () => none);
    assert.deepEqual(rounds, [['decode']]);
    assert.equal(decider.calls.length, 0);
    assert.equal(result.primaryProfile, 'decode');
    assert.equal(result.disaggregation, undefined);
  });

  test('no decider configured: P/D disabled, every request decode-only', () => {
    const { rounds, result } = drive(handler(undefined), makeRequest(), () => ok(d0));
    assert.deepEqual(rounds, [['decode']]);
    assert.equal(result.disaggregation?.decision, 'decode-only');
  });

  test('custom profile names and connector', () => {
    const profiles = new Map([
      ['d', profile('d')],
      ['p', profile('p')],
    ]);
    const h = handler(recordingDecider(true), { profiles: { decode: 'd', prefill: 'p' }, connector: 'nixlv2' });
    const { rounds, result } = drive(h, makeRequest(), (p) => ok(p === 'd' ? d0 : p0), profiles);
    assert.deepEqual(rounds, [['d'], ['p']]);
    assert.equal(result.primaryProfile, 'd');
    assert.deepEqual(result.disaggregation, { decision: 'prefill-decode', prefill: p0, connector: 'nixlv2' });
  });

  test('no prefill profile configured: decode-only; no decode profile: a clear error', () => {
    const onlyDecode = new Map([['decode', profile('decode')]]);
    const { result } = drive(handler(recordingDecider(true)), makeRequest(), () => ok(d0), onlyDecode);
    assert.equal(result.disaggregation?.decision, 'decode-only');
    const onlyPrefill = new Map([['prefill', profile('prefill')]]);
    assert.throws(() => drive(handler(recordingDecider(true)), makeRequest(), () => ok(d0), onlyPrefill), /no scheduling profile named 'decode'/);
  });

  test('APIs: embeddings and responses are never disaggregated (the routing sidecar passes /v1/responses to its decoder)', () => {
    const req = (api: SchedulingRequest['api']) => ({ ...makeRequest(), api });
    const decide = (api: SchedulingRequest['api'], connector: string) =>
      drive(handler(recordingDecider(true), { connector }), req(api), (p) => ok(p === 'decode' ? d0 : p0)).result.disaggregation?.decision;
    assert.equal(decide('embeddings', 'sidecar'), 'decode-only');
    assert.equal(decide('responses', 'sidecar'), 'decode-only');
    assert.equal(decide('responses', 'nixlv2'), 'decode-only');
    assert.equal(decide('responses', 'shared-storage'), 'decode-only');
    for (const connector of ['sidecar', 'nixlv2', 'shared-storage']) {
      assert.equal(decide('chat', connector), 'prefill-decode', connector);
      assert.equal(decide('completions', connector), 'prefill-decode', connector);
    }
  });

  test('parameters: llm-d defaults, strict, own output accepted, profiles must differ', () => {
    const parsed = disaggProfileHandlerParams.parse({});
    assert.deepEqual(parsed, { profiles: { decode: 'decode', prefill: 'prefill' }, deciders: {}, connector: 'sidecar' });
    assert.deepEqual(disaggProfileHandlerParams.parse(parsed), parsed);
    const full = disaggProfileHandlerParams.parse({ profiles: { decode: 'd' }, deciders: { prefill: 'x' }, connector: 'shared-storage' });
    assert.deepEqual(full, { profiles: { decode: 'd', prefill: 'prefill' }, deciders: { prefill: 'x' }, connector: 'shared-storage' });
    assert.deepEqual(disaggProfileHandlerParams.parse(full), full);
    assert.equal(disaggProfileHandlerParams.safeParse({ connector: 'nixl' }).success, false);
    assert.equal(disaggProfileHandlerParams.safeParse({ threshold: 3 }).success, false);
    assert.equal(disaggProfileHandlerParams.safeParse({ profiles: { encode: 'e' } }).success, false);
    // llm-d's stageOrder: its default is Sluice's only order; the other is refused, saying why.
    assert.equal(disaggProfileHandlerParams.parse({ stageOrder: 'decode-first' }).stageOrder, 'decode-first');
    const prefillFirst = disaggProfileHandlerParams.safeParse({ stageOrder: 'prefill-first' });
    assert.equal(prefillFirst.success, false);
    assert.match(prefillFirst.error!.issues[0]!.message, /only "decode-first" is supported.*"prefill-first" is not implemented/);
    // Spelt as llm-d reads it (case, "-" and "_" aside; "decode" alone).
    for (const spelt of ['DecodeFirst', 'decode_first', 'decode', 'Decode-First']) assert.equal(disaggProfileHandlerParams.parse({ stageOrder: spelt }).stageOrder, 'decode-first', spelt);
    assert.match(disaggProfileHandlerParams.safeParse({ stageOrder: 'PrefillFirst' }).error!.issues[0]!.message, /"prefill-first" is not implemented/);
    assert.match(disaggProfileHandlerParams.safeParse({ stageOrder: 'sideways' }).error!.issues[0]!.message, /unknown stage order "sideways"/);
    assert.equal(disaggProfileHandlerParams.safeParse({ profiles: { decode: 'x', prefill: 'x' } }).success, false);
  });

  test('create resolves the decider by name; a missing or wrong plugin is an error naming it', () => {
    const deps = makeDeps();
    const plugins = deps.plugins as Map<string, Plugin>;
    const always = alwaysDisaggPdDeciderDefinition.create('always', {}, deps);
    plugins.set('always', always);
    plugins.set('scorer', { type: 'queue-scorer', name: 'scorer' });
    const params = (prefill: string) => disaggProfileHandlerParams.parse({ deciders: { prefill } });
    const h = disaggProfileHandlerDefinition.create('h', params('always'), deps) as DisaggProfileHandler;
    assert.equal(h.decider, always);
    assert.throws(() => disaggProfileHandlerDefinition.create('h', params('nope'), deps), /deciders\.prefill: no plugin named 'nope'/);
    assert.throws(() => disaggProfileHandlerDefinition.create('h', params('scorer'), deps), /'scorer' \(queue-scorer\) is not a decider/);
  });
});

describe('prefix-based-pd-decider', () => {
  const blockChars = 64; // blockSizeTokens 16 × 4 chars

  function setup(nonCachedTokens: number, withScorer = true) {
    const deps = makeDeps({ logger: recordingLogger() });
    const plugins = deps.plugins as Map<string, Plugin>;
    // Declared before the scorer on purpose: the scorer is looked up at the first decision.
    const decider = prefixBasedPdDeciderDefinition.create('pd', prefixBasedPdDeciderParams.parse({ nonCachedTokens }), deps) as PrefixBasedPdDecider;
    plugins.set('pd', decider);
    const pool: PoolView = { endpoints: [] };
    const scorer = new PrefixCacheScorer('prefix', prefixCacheScorerParams.parse({ autoTune: false }), deps.clock, pool);
    if (withScorer) plugins.set('prefix', scorer);
    return { decider, scorer, logger: deps.logger as ReturnType<typeof recordingLogger> };
  }

  /** Teaches the scorer that `ep` holds the first `blocks` blocks of `text`. */
  function teach(scorer: PrefixCacheScorer, text: string, blocks: number, ep: Endpoint) {
    const req = makeRequest(text.slice(0, blocks * blockChars));
    scorer.preRequest(req, { primaryProfile: 'decode', profileResults: new Map([['decode', { targets: [ep] }]]) });
  }

  test('the rule: disaggregate iff nonCached > 0, input ≥ nonCached and input − cached ≥ nonCached', () => {
    const m = (matchedBlocks: number) => ({ matchedBlocks, totalBlocks: 10, blockSizeTokens: 16 });
    assert.equal(shouldDisaggregate(4000, m(0), 0), false, '0 = never (llm-d: "Prefix-based PD disabled")');
    assert.equal(shouldDisaggregate(4000, undefined, 0), false, '0 = never, without prefix information too');
    assert.equal(shouldDisaggregate(4 * 99, m(0), 100), false, 'short prompt');
    assert.equal(shouldDisaggregate(4 * 100, m(0), 100), true, 'exactly at the threshold');
    assert.equal(shouldDisaggregate(4 * 100 + 3, m(0), 100), true, 'chars/4 rounded down');
    assert.equal(shouldDisaggregate(4 * 200, m(6), 100), true, '200 − 96 = 104 ≥ 100');
    assert.equal(shouldDisaggregate(4 * 200, m(7), 100), false, '200 − 112 = 88 < 100');
    assert.equal(shouldDisaggregate(4 * 200, undefined, 100), false, 'no prefix information');
    assert.equal(shouldDisaggregate(4 * 200, m(0), 100, 201), false, 'shorter than promptTokens');
    assert.equal(shouldDisaggregate(4 * 200, m(0), 100, 200), true, 'at promptTokens');
  });

  test('uses the chosen decode endpoint\'s prefix match from the prefix-cache-scorer', () => {
    const { decider, scorer } = setup(64);
    const warm = makeEndpoint('warm');
    const cold = makeEndpoint('cold');
    const text = 'p'.repeat(blockChars * 8); // 128 tokens
    teach(scorer, text, 6, warm); // 96 tokens cached on `warm`
    const ctx = makeContext();
    assert.equal(decider.disaggregate(ctx, makeRequest(text), cold), true, '128 uncached on cold');
    assert.equal(decider.disaggregate(ctx, makeRequest(text), warm), false, '32 uncached on warm');
    assert.equal(decider.disaggregate(ctx, makeRequest('short'), cold), false, 'short prompt');
  });

  test("nonCachedTokens 0 (the default) turns P/D off, as llm-d's decider does; promptTokens sets a minimum", () => {
    assert.equal(prefixBasedPdDeciderParams.parse({}).nonCachedTokens, 0);
    const warn = (p: object) => prefixBasedPdDeciderDefinition.configWarnings!(prefixBasedPdDeciderParams.parse(p), { metricsIntervalMs: 50 });
    assert.match(warn({})[0]!.message, /nonCachedTokens 0 \(the default\) turns P\/D off, as in llm-d/, 'said at load');
    assert.deepEqual(warn({ nonCachedTokens: 256 }), []);
    const { decider } = setup(0);
    assert.equal(decider.disaggregate(makeContext(), makeRequest('x'.repeat(10_000)), makeEndpoint('cold')), false, 'not even a long uncached prompt');
    const uncached: PrefixMatch = { matchedBlocks: 0, totalBlocks: 7, blockSizeTokens: 16 };
    assert.equal(shouldDisaggregate(399, uncached, 1, 100), false, '99 tokens: under promptTokens');
    assert.equal(shouldDisaggregate(400, uncached, 1, 100), true, '100 tokens, all uncached');
    assert.equal(shouldDisaggregate(400, uncached, 0, 100), false, 'off, whatever the prompt');
  });

  test('without a prefix-cache-scorer: decode-only and one warning', () => {
    const { decider, logger } = setup(1, false);
    const ctx = makeContext();
    assert.equal(decider.disaggregate(ctx, makeRequest('x'.repeat(1000)), makeEndpoint('e')), false);
    assert.equal(decider.disaggregate(ctx, makeRequest('y'.repeat(1000)), makeEndpoint('e')), false);
    assert.equal(logger.warnings.length, 1);
    assert.match(String(logger.warnings[0]!.msg), /no prefix-cache-scorer/);
  });

  test('parameters are strict, ints ≥ 0, own output accepted; deciders are deciders', () => {
    assert.deepEqual(prefixBasedPdDeciderParams.parse({ nonCachedTokens: 8 }), { nonCachedTokens: 8, promptTokens: 0 });
    assert.equal(prefixBasedPdDeciderParams.safeParse({ nonCachedTokens: -1 }).success, false);
    assert.equal(prefixBasedPdDeciderParams.safeParse({ nonCachedTokens: 1.5 }).success, false);
    assert.equal(prefixBasedPdDeciderParams.safeParse({ threshold: 1 }).success, false);
    const deps = makeDeps();
    assert.ok(isDecider(prefixBasedPdDeciderDefinition.create('a', { nonCachedTokens: 1, promptTokens: 0 }, deps)));
    const always = alwaysDisaggPdDeciderDefinition.create('b', {}, deps);
    assert.ok(isDecider(always));
    assert.equal((always as Decider).disaggregate(makeContext(), makeRequest(), makeEndpoint('e')), true);
    assert.equal(alwaysDisaggPdDeciderDefinition.params.safeParse({ x: 1 }).success, false);
  });
});

describe('P/D through the config loader and the scheduler', () => {
  const config = (decider: string, extra = '', prefillProfile = 'prefill') => `
pool:
  endpoints:
  - { name: prefill-0, address: 10.0.0.1, labels: { llm-d.ai/role: prefill } }
  - { name: decode-0, address: 10.0.0.2, labels: { llm-d.ai/role: decode } }
plugins:
- type: prefill-filter
- type: decode-filter
- type: prefix-cache-scorer
  parameters: { autoTune: false }
- type: ${decider}
${extra}- type: disagg-profile-handler
  parameters:
    profiles: { decode: decode, prefill: ${prefillProfile} }
    deciders: { prefill: ${decider} }
    connector: nixlv2
schedulingProfiles:
- name: ${prefillProfile}
  plugins: [ { pluginRef: prefill-filter }, { pluginRef: prefix-cache-scorer } ]
- name: decode
  plugins: [ { pluginRef: decode-filter }, { pluginRef: prefix-cache-scorer } ]
`;

  function built(text: string) {
    const registry = builtinRegistry();
    const loaded = loadConfigText(text, 'pd.yaml', registry);
    const endpoints = loaded.config.pool.endpoints.map((e) => makeEndpoint(e.name, { labels: e.labels }));
    const deps = makeDeps({ endpoints });
    return { ...buildScheduling(loaded.config, registry, deps), endpoints };
  }

  for (const name of ['prefill', 'pf']) {
    test(`the prefix index learns the prefill pick whatever the prefill profile is called ("${name}")`, () => {
      const { scheduler, endpoints } = built(config('always-disagg-pd-decider', '', name));
      const text = 'q'.repeat(256); // 4 blocks
      const r = scheduler.schedule(makeRequest(text), endpoints);
      assert.ok(r.ok && r.result.disaggregation?.decision === 'prefill-decode');
      const prefix = scheduler.preRequest.find((p) => p.type === 'prefix-cache-scorer') as PrefixCacheScorer;
      assert.deepEqual(endpoints.map((e) => prefix.prefixMatch(makeRequest(text), e).matchedBlocks), [4, 4], 'both legs learned the prompt');
    });
  }

  test('a long new prompt goes prefill-decode; the prefix index then learns both endpoints, so it repeats decode-only', () => {
    const { scheduler, endpoints } = built(config('prefix-based-pd-decider', '  parameters: { nonCachedTokens: 32 }\n'));
    const [prefill, decode] = endpoints as [Endpoint, Endpoint];
    const text = 'q'.repeat(64 * 4); // 64 tokens
    const first = scheduler.schedule(makeRequest(text), endpoints);
    assert.ok(first.ok);
    assert.equal(first.target, decode);
    assert.deepEqual(first.result.disaggregation, { decision: 'prefill-decode', prefill, connector: 'nixlv2' });
    const prefix = scheduler.preRequest.find((p) => p.type === 'prefix-cache-scorer') as PrefixCacheScorer;
    assert.equal(prefix.prefixMatch(makeRequest(text), prefill).matchedBlocks, 4, 'the prefill endpoint learned the prompt');
    assert.equal(prefix.prefixMatch(makeRequest(text), decode).matchedBlocks, 4, 'the decode endpoint learned the prompt');
    const again = scheduler.schedule(makeRequest(text), endpoints);
    assert.ok(again.ok);
    assert.equal(again.result.disaggregation?.decision, 'decode-only');
    const short = scheduler.schedule(makeRequest('short prompt'), endpoints);
    assert.ok(short.ok);
    assert.equal(short.result.disaggregation?.decision, 'decode-only');
    assert.equal(short.result.profileResults.has('prefill'), false);
  });

  test('always-disagg-pd-decider; a decider declared after the handler still resolves', () => {
    // Move the decider's declaration below the handler's.
    const handlerFirst = config('always-disagg-pd-decider')
      .replace('- type: always-disagg-pd-decider\n', '')
      .replace('schedulingProfiles:', '- type: always-disagg-pd-decider\nschedulingProfiles:');
    assert.ok(handlerFirst.indexOf('disagg-profile-handler') < handlerFirst.indexOf('type: always-disagg-pd-decider'));
    const { scheduler, endpoints } = built(handlerFirst);
    const r = scheduler.schedule(makeRequest('x'), endpoints);
    assert.ok(r.ok);
    assert.equal(r.result.disaggregation?.decision, 'prefill-decode');
    assert.equal(r.result.disaggregation?.prefill?.name, 'prefill-0');
  });

  test('endpoints that can do both, idle (all tied): each request is prefilled on another endpoint than its decoder, in turn', () => {
    const text = config('always-disagg-pd-decider').replace(/llm-d\.ai\/role: (prefill|decode)/g, 'llm-d.ai/role: both').replace(
      '  - { name: decode-0',
      '  - { name: both-2, address: 10.0.0.3, labels: { llm-d.ai/role: both } }\n  - { name: decode-0',
    );
    const { scheduler, endpoints } = built(text);
    const pairs: string[] = [];
    for (let i = 0; i < 6; i++) {
      const r = scheduler.schedule(makeRequest(`distinct prompt ${i} `.repeat(20)), endpoints);
      assert.ok(r.ok);
      assert.equal(r.result.disaggregation?.decision, 'prefill-decode');
      pairs.push(`${r.result.disaggregation?.prefill?.name}>${r.target.name}`);
    }
    for (const pair of pairs) assert.notEqual(pair.split('>')[0], pair.split('>')[1], pairs.join(' '));
    const prefills = new Set(pairs.map((p) => p.split('>')[0]));
    assert.equal(prefills.size, 3, pairs.join(' '));
  });

  test('no prefill endpoint left (e.g. all removed): decode-only, still served', () => {
    const { scheduler, endpoints } = built(config('always-disagg-pd-decider'));
    const r = scheduler.schedule(makeRequest('x'), endpoints.filter((e) => e.name !== 'prefill-0'));
    assert.ok(r.ok);
    assert.equal(r.target.name, 'decode-0');
    assert.equal(r.result.disaggregation?.decision, 'decode-only');
  });

  test('a handler referring to a decider that does not exist is a config error naming it', () => {
    const text = config('always-disagg-pd-decider').replace('deciders: { prefill: always-disagg-pd-decider }', 'deciders: { prefill: nope }');
    assert.throws(() => built(text), /parameters\.deciders\.prefill: no plugin named "nope" is declared/);
  });
});

describe('disagg-profile-handler references are checked by the loader', () => {
  test('a misspelt profile or decider is a config error with position and suggestion', () => {
    const text = [
      'pool:',
      '  endpoints: []',
      'plugins:',
      '- type: disagg-profile-handler',
      '  parameters:',
      '    profiles: { decode: decode, prefill: prefil }',
      '    deciders: { prefill: pd-decidr }',
      '- type: prefix-based-pd-decider',
      '  name: pd-decider',
      '- type: decode-filter',
      '- type: prefill-filter',
      'schedulingProfiles:',
      '- name: decode',
      '  plugins: [ { pluginRef: decode-filter } ]',
      '- name: prefill',
      '  plugins: [ { pluginRef: prefill-filter } ]',
      '',
    ].join('\n');
    try {
      loadConfigText(text, 'pd.yaml', builtinRegistry());
      assert.fail('expected a ConfigError');
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      assert.deepEqual(err.format().split('\n'), [
        'pd.yaml:6:42: plugins[0].parameters.profiles.prefill: no scheduling profile named "prefil" (did you mean "prefill"?)',
        'pd.yaml:7:26: plugins[0].parameters.deciders.prefill: no plugin named "pd-decidr" is declared (did you mean "pd-decider"?)',
      ]);
    }
    const fixed = text.replace('prefil }', 'prefill }').replace('pd-decidr', 'pd-decider');
    assert.equal(loadConfigText(fixed, 'pd.yaml', builtinRegistry()).config.schedulingProfiles.length, 2);
  });
});
