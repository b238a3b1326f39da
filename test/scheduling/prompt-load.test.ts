/**
 * Prompt work per endpoint (prompt-load.ts) and the llm-d plugins that weigh it: token-load-scorer,
 * prefix-cache-affinity-filter; and the scheduler's count of it before the prefix index learns.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import type { Plugin, SchedulingProfile, SchedulingResult } from '../../src/scheduling/framework.js';
import {
  PrefixCacheAffinityFilter,
  prefixCacheAffinityFilterParams,
  type AffinityOutcome,
} from '../../src/scheduling/plugins/prefix-cache-affinity-filter.js';
import { PrefixCacheScorer, prefixCacheScorerParams } from '../../src/scheduling/plugins/prefix-cache-scorer.js';
import { MaxScorePicker } from '../../src/scheduling/plugins/max-score-picker.js';
import { SingleProfileHandler } from '../../src/scheduling/plugins/single-profile-handler.js';
import { TokenLoadScorer, tokenLoadScore, tokenLoadScorerDefinition, tokenLoadScorerParams } from '../../src/scheduling/plugins/token-load-scorer.js';
import { findPrefixMatcher, promptTokensOf, uncachedTokensOf } from '../../src/scheduling/prompt-load.js';
import { Scheduler } from '../../src/scheduling/scheduler.js';
import { ManualClock } from '../../src/util/clock.js';
import { makeContext, makeEndpoint, makeRequest, names, recordingLogger } from './helpers.js';

/** A prompt of `blocks` 16-token blocks (64 characters each), distinct per seed. */
function prompt(seed: number, blocks: number): string {
  let s = '';
  for (let i = 0; s.length < blocks * 64; i++) s += `s${seed}-w${i} `;
  return s.slice(0, blocks * 64);
}

function fleet() {
  const endpoints = ['a', 'b', 'c'].map((n) => makeEndpoint(n));
  const prefix = new PrefixCacheScorer('prefix-cache-scorer', prefixCacheScorerParams.parse({ autoTune: false }), new ManualClock(), { endpoints });
  const plugins = new Map<string, Plugin>([[prefix.name, prefix]]);
  /** `endpoint` now caches the first `blocks` blocks of `text`. */
  const learn = (text: string, endpoint: Endpoint) => {
    const result: SchedulingResult = { primaryProfile: 'default', profileResults: new Map([['default', { targets: [endpoint] }]]) };
    prefix.preRequest(makeRequest(text), result);
  };
  return { endpoints: endpoints as [Endpoint, Endpoint, Endpoint], prefix, plugins, learn };
}

describe('prompt load', () => {
  test('prompt tokens = floor(chars / 4); uncached = prompt − matched blocks × block size, never below 0', () => {
    assert.equal(promptTokensOf(0), 0);
    assert.equal(promptTokensOf(403), 100);
    assert.equal(uncachedTokensOf(400, undefined), 100, 'no matcher: all of it');
    assert.equal(uncachedTokensOf(400, { matchedBlocks: 4, totalBlocks: 6, blockSizeTokens: 16 }), 36);
    assert.equal(uncachedTokensOf(400, { matchedBlocks: 9, totalBlocks: 9, blockSizeTokens: 16 }), 0);
  });

  test('the first prefix matcher in configuration order is the one asked', () => {
    const { prefix } = fleet();
    const other = { type: 'queue-scorer', name: 'q' };
    assert.equal(findPrefixMatcher([other, prefix]), prefix);
    assert.equal(findPrefixMatcher([other]), undefined);
  });

  test('the scheduler counts the prompt tokens of the chosen endpoint before the prefix index learns the prompt', () => {
    const { endpoints, prefix } = fleet();
    const picker = new MaxScorePicker('max-score-picker', { maxNumOfEndpoints: 1 });
    const profile: SchedulingProfile = { name: 'default', filters: [], scorers: [{ scorer: prefix, weight: 1 }], picker };
    const scheduler = new Scheduler(new SingleProfileHandler('single'), new Map([['default', profile]]), [prefix], makeContext(), undefined, prefix);
    const text = prompt(1, 10);
    const first = scheduler.schedule(makeRequest(text), endpoints);
    assert.ok(first.ok);
    assert.equal(first.result.primaryPromptTokens, 160, 'nothing cached yet: the whole prompt');
    const again = scheduler.schedule(makeRequest(text), endpoints);
    assert.ok(again.ok);
    assert.equal(again.target, first.target);
    assert.equal(again.result.primaryPromptTokens, 0, 'the same prompt again: all cached there');
    const noMatcher = new Scheduler(new SingleProfileHandler('single'), new Map([['default', profile]]), [], makeContext());
    const r = noMatcher.schedule(makeRequest(text), endpoints);
    assert.ok(r.ok);
    assert.equal(r.result.primaryPromptTokens, 160, 'without a prefix matcher nothing counts as cached');
  });
});

describe('token-load-scorer', () => {
  test('score = 1 − min(load, threshold) / threshold; 1 at no load', () => {
    assert.equal(tokenLoadScore(0, 1000), 1);
    assert.equal(tokenLoadScore(250, 1000), 0.75);
    assert.equal(tokenLoadScore(5000, 1000), 0);
  });

  test('load = tokens in flight on the endpoint + the prompt tokens it does not cache', () => {
    const { endpoints, plugins, learn } = fleet();
    const [a, b, c] = endpoints;
    const scorer = new TokenLoadScorer('token-load-scorer', tokenLoadScorerParams.parse({ queueThresholdTokens: 1000 }), plugins);
    const text = prompt(2, 10); // 160 tokens
    learn(text, a);
    b.inFlightTokens = 40;
    c.inFlightTokens = 100;
    learn(text.slice(0, 64 * 5), c); // c caches half: 80 uncached
    const out = new Float64Array(3);
    scorer.score(makeContext(), makeRequest(text), endpoints, out);
    assert.deepEqual([...out], [1, 1 - 200 / 1000, 1 - 180 / 1000]);
  });

  test('parameters: llm-d defaults and keys, strict', () => {
    assert.equal(tokenLoadScorerParams.parse({}).queueThresholdTokens, 4_194_304);
    assert.ok(tokenLoadScorerParams.safeParse({ inFlightLoadProducerName: 'x', nonTextTokenWeight: 2 }).success);
    for (const bad of [{ queueThresholdTokens: 1.5 }, { other: 1 }]) {
      assert.equal(tokenLoadScorerParams.safeParse(bad).success, false, JSON.stringify(bad));
    }
    // ≤ 0 means the default, as in llm-d, and says so.
    const zero = tokenLoadScorerParams.parse({ queueThresholdTokens: 0 });
    assert.match(tokenLoadScorerDefinition.configWarnings!(zero, { metricsIntervalMs: 50 })[0]!.message, /means the default, 4194304/);
    const out = new Float64Array(1);
    const endpoint = makeEndpoint('x');
    endpoint.inFlightTokens = 4_194_304 / 2;
    new TokenLoadScorer('t', zero, new Map()).score(makeContext(), makeRequest(''), [endpoint], out);
    assert.equal(out[0], 0.5);
  });
});

describe('prefix-cache-affinity-filter', () => {
  function setup(params: Record<string, unknown> = {}) {
    const f = fleet();
    const outcomes: AffinityOutcome[] = [];
    const filter = new PrefixCacheAffinityFilter(
      'affinity',
      prefixCacheAffinityFilterParams.parse({ peakPrefillThroughput: 1000, maxTTFTPenaltyMs: 500, ...params }),
      f.plugins,
      (_name, outcome) => outcomes.push(outcome),
    );
    return { ...f, filter, outcomes };
  }

  test('keeps the endpoints that cache at least affinityThreshold of the prompt', () => {
    const { endpoints, filter, learn, outcomes } = setup();
    const [a, b] = endpoints;
    const text = prompt(3, 10);
    learn(text, a);
    learn(text.slice(0, 64 * 7), b); // 70 % < 80 %
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a']);
    learn(text.slice(0, 64 * 8), b); // 80 %
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a', 'b']);
    assert.deepEqual(outcomes, ['sticky', 'sticky']);
  });

  test('no endpoint caches it: all kept (no_match); one candidate or threshold 0: not_applicable', () => {
    const { endpoints, filter, outcomes } = setup();
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(prompt(4, 10)), endpoints)), ['a', 'b', 'c']);
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(prompt(4, 10)), endpoints.slice(0, 1))), ['a']);
    assert.deepEqual(outcomes, ['no_match', 'not_applicable']);
    const off = setup({ affinityThreshold: 0 });
    off.filter.filter(makeContext(), makeRequest(prompt(4, 10)), off.endpoints);
    assert.deepEqual(off.outcomes, ['not_applicable']);
  });

  test('sticky until saturated: the cache holders are left when their prompt work ahead is > maxTTFTPenaltyMs more (llm-d)', () => {
    const { endpoints, filter, learn, outcomes } = setup(); // 1000 tokens/s, 500 ms
    const [a, b, c] = endpoints;
    const text = prompt(5, 10);
    learn(text, a);
    b.inFlightTokens = 100;
    a.inFlightTokens = 500; // 500 ms ahead of it against 0 on c: not more than the penalty
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a']);
    a.inFlightTokens = 501;
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a', 'b', 'c']);
    c.inFlightTokens = 2; // the least loaded other endpoint now has 2 ms ahead: 501 − 2 = 499
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a']);
    assert.deepEqual(outcomes, ['sticky', 'load_override', 'sticky']);
    const always = setup({ maxTTFTPenaltyMs: 0 });
    always.learn(text, always.endpoints[0]);
    always.endpoints[0].inFlightTokens = 1e9;
    assert.deepEqual(names(always.filter.filter(makeContext(), makeRequest(text), always.endpoints)), ['a'], 'maxTTFTPenaltyMs 0 always sticks');
  });

  test('maxTokensInFlightPenalty: the same gate in tokens (0 = off)', () => {
    const { endpoints, filter, learn, outcomes } = setup({ maxTTFTPenaltyMs: 0, maxTokensInFlightPenalty: 100 });
    const [a, b] = endpoints;
    const text = prompt(9, 10);
    learn(text, a);
    b.inFlightTokens = 50;
    a.inFlightTokens = 100; // 100 more than the idle c: not more than the penalty
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a']);
    a.inFlightTokens = 101;
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a', 'b', 'c']);
    assert.deepEqual(outcomes, ['sticky', 'load_override']);
    assert.equal(prefixCacheAffinityFilterParams.safeParse({ maxTokensInFlightPenalty: 1.5 }).success, false);
  });

  test('maxInFlightRequestsDelta: adds the others within maxTTFTPenaltyMs when the cache holders hold many more requests (llm-d)', () => {
    const { endpoints, filter, learn, outcomes } = setup({ maxInFlightRequestsDelta: 2 }); // 1000 tokens/s, 500 ms
    const [a, b, c] = endpoints;
    const text = prompt(10, 10); // 160 tokens, all cached on a
    learn(text, a);
    b.inFlight = 1; // starting there: 160 ms of prompt, within 500 ms of a's 0
    c.inFlightTokens = 400; // 560 ms: over the penalty, never added (and not the least loaded other for the time gate)
    a.inFlight = 3; // 3 − 1 = 2: not more than the delta
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a']);
    a.inFlight = 4;
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a', 'b']);
    c.inFlightTokens = 340; // 500 ms: exactly the penalty, so within it
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a', 'b', 'c']);
    assert.deepEqual(outcomes, ['sticky', 'request_load_override', 'request_load_override']);
  });

  test("a flow-control probe (the affinity look-ahead's) filters alike but counts nothing and never explores", () => {
    const { endpoints, filter, learn, outcomes } = setup({ explorationProbability: 1 });
    const text = prompt(8, 10);
    learn(text, endpoints[0]);
    const probe = { ...makeContext(), probe: true };
    assert.deepEqual(names(filter.filter(probe, makeRequest(text), endpoints)), ['a']);
    assert.deepEqual(outcomes, []);
    assert.equal(filter.lastOutcome, undefined);
    assert.deepEqual(names(filter.filter(makeContext(), makeRequest(text), endpoints)), ['a', 'b', 'c']);
    assert.deepEqual(outcomes, ['exploration']);
  });

  test('explorationProbability skips the gate with that probability (seeded random)', () => {
    const { endpoints, filter, learn, outcomes } = setup({ explorationProbability: 0.5 });
    const text = prompt(6, 10);
    learn(text, endpoints[0]);
    const ctx = makeContext(7);
    for (let i = 0; i < 200; i++) filter.filter(ctx, makeRequest(text), endpoints);
    const explored = outcomes.filter((o) => o === 'exploration').length;
    assert.ok(explored > 60 && explored < 140, `${explored} of 200`);
    assert.equal(outcomes.length - explored, outcomes.filter((o) => o === 'sticky').length);
  });

  test('without a prefix-cache-scorer nothing is sticky, and it says so once', () => {
    const logger = recordingLogger();
    const endpoints = [makeEndpoint('a'), makeEndpoint('b')];
    const filter = new PrefixCacheAffinityFilter('affinity', prefixCacheAffinityFilterParams.parse({}), new Map(), undefined, logger);
    filter.filter(makeContext(), makeRequest(prompt(7, 10)), endpoints);
    filter.filter(makeContext(), makeRequest(prompt(7, 10)), endpoints);
    assert.equal(filter.lastOutcome, 'no_match');
    assert.equal(logger.warnings.length, 1);
    assert.match(logger.warnings[0]!.msg ?? '', /no prefix-cache-scorer is configured/);
  });

  test('parameters: llm-d defaults; the predictor and session-cost modes are refused with a reason', () => {
    const p = prefixCacheAffinityFilterParams;
    assert.deepEqual(p.parse({}), {
      affinityThreshold: 0.8,
      explorationProbability: 0,
      maxTTFTPenaltyMs: 18_000,
      maxTokensInFlightPenalty: 0,
      maxInFlightRequestsDelta: 0,
      peakPrefillThroughput: 15_928,
      ttftSource: 'prefillThroughput',
      penaltySource: 'constant',
    });
    assert.ok(p.safeParse({ peakPrefillThroughput: 0, maxTTFTPenaltyMs: 0 }).success);
    const message = (raw: object) => {
      const r = p.safeParse(raw);
      assert.equal(r.success, false, JSON.stringify(raw));
      return r.error!.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('\n');
    };
    assert.match(message({ ttftSource: 'latencyPredictor' }), /ttftSource: .*latency predictor, which Sluice does not have/);
    assert.match(message({ penaltySource: 'sessionCost' }), /penaltySource: .*"sessionCost" is not implemented/);
    assert.match(message({ peakPrefillThroughput: 0 }), /peakPrefillThroughput: peakPrefillThroughput must be > 0 when maxTTFTPenaltyMs is > 0/);
    for (const bad of [{ affinityThreshold: 1.1 }, { explorationProbability: -0.1 }, { maxTTFTPenaltyMs: -1 }, { other: 1 }]) {
      assert.equal(p.safeParse(bad).success, false, JSON.stringify(bad));
    }
    assert.ok(builtinRegistry().is('prefix-cache-affinity-filter', 'filter'));
    assert.ok(builtinRegistry().is('token-load-scorer', 'scorer'));
  });
});
