import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfigText } from '../../src/config/load.js';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import type { Plugin, SchedulingRequest, SchedulingResult } from '../../src/scheduling/framework.js';
import {
  NoHitLruScorer,
  noHitLruScorerDefinition,
  noHitLruScorerParams,
} from '../../src/scheduling/plugins/no-hit-lru-scorer.js';
import { PrefixCacheScorer, prefixCacheScorerParams } from '../../src/scheduling/plugins/prefix-cache-scorer.js';
import { ManualClock } from '../../src/util/clock.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest, recordingLogger, tally } from './helpers.js';

/** Distinct, deterministic text of `length` characters (long enough to hash into several blocks). */
function text(seed: number, length = 640): string {
  let out = '';
  for (let i = 0; out.length < length; i++) out += `w${(seed * 7919 + i * 104729) % 100003} `;
  return out.slice(0, length);
}

function setup(params: Record<string, unknown> = {}, prefixName = 'prefix-cache-scorer') {
  const prefix = new PrefixCacheScorer(prefixName, prefixCacheScorerParams.parse({}), new ManualClock(), { endpoints: [] });
  const plugins = new Map<string, Plugin>([[prefixName, prefix]]);
  const logger = recordingLogger();
  const scorer = new NoHitLruScorer('no-hit-lru-scorer', noHitLruScorerParams.parse(params), plugins, logger);
  const score = (req: SchedulingRequest, endpoints: readonly Endpoint[]) => {
    const out = new Float64Array(endpoints.length);
    scorer.score(makeContext(), req, endpoints, out);
    return [...out];
  };
  /** Runs preRequest as if `target` (and optionally a prefill endpoint) had been chosen. */
  const chose = (req: SchedulingRequest, target: Endpoint, prefill?: Endpoint, primaryProfile = 'default') => {
    const result: SchedulingResult = { primaryProfile, profileResults: new Map([[primaryProfile, { targets: [target] }]]) };
    if (prefill) result.profileResults.set('prefill', { targets: [prefill] });
    scorer.preRequest(req, result);
    prefix.preRequest(req, result);
  };
  return { prefix, plugins, scorer, score, chose, logger };
}

describe('no-hit-lru-scorer', () => {
  const [a, b, c] = ['a', 'b', 'c'].map((n) => makeEndpoint(n)) as [Endpoint, Endpoint, Endpoint];

  test('cold requests: never-used endpoints first (1 − i/(n−1)), then least recently used', () => {
    const { score, chose, scorer } = setup();
    const first = makeRequest(text(1));
    assert.deepEqual(score(first, [a, b, c]), [1, 0.5, 0]);
    chose(first, a);
    assert.deepEqual(scorer.lruOrder(), ['a']);
    const second = makeRequest(text(2));
    assert.deepEqual(score(second, [a, b, c]), [0, 1, 0.5]);
    chose(second, b);
    const third = makeRequest(text(3));
    assert.deepEqual(score(third, [a, b, c]), [0.5, 0, 1]);
    chose(third, c);
    // All used: least recently used first.
    assert.deepEqual(score(makeRequest(text(4)), [a, b, c]), [1, 0.5, 0]);
    assert.deepEqual(scorer.lruOrder(), ['a', 'b', 'c']);
  });

  test('warm requests (a prefix hit on some candidate) score 0.5 everywhere and leave the LRU alone', () => {
    const { score, chose, scorer } = setup();
    const prompt = text(1);
    const cold = makeRequest(prompt);
    score(cold, [a, b, c]);
    chose(cold, b); // b now caches the prompt's blocks
    assert.deepEqual(scorer.lruOrder(), ['b']);
    const warm = makeRequest(prompt);
    assert.deepEqual(score(warm, [a, b, c]), [0.5, 0.5, 0.5]);
    assert.equal(warm.state.get(scorer.stateKey), false);
    chose(warm, c);
    assert.deepEqual(scorer.lruOrder(), ['b'], 'a warm request does not count as use');
    // A shared first block is enough to make it warm.
    assert.deepEqual(score(makeRequest(prompt.slice(0, 64) + text(9)), [a, b, c]), [0.5, 0.5, 0.5]);
  });

  test('a hit only on an endpoint that is not a candidate is still cold', () => {
    const { score, chose } = setup();
    const prompt = text(1);
    const req = makeRequest(prompt);
    score(req, [a, b, c]);
    chose(req, c);
    assert.deepEqual(score(makeRequest(prompt), [a, b]), [1, 0]);
  });

  test('prompts too short to hash are cold; a single candidate scores 1', () => {
    const { score, scorer } = setup();
    const short = makeRequest('hi');
    assert.deepEqual(score(short, [a, b]), [1, 0]);
    assert.equal(short.state.get(scorer.stateKey), true);
    assert.deepEqual(score(makeRequest(text(1)), [c]), [1]);
  });

  test('ranks are among the candidates, not the whole LRU', () => {
    const { score, chose } = setup();
    const d = makeEndpoint('d');
    for (const [i, target] of [d, a, b, c].entries()) {
      const req = makeRequest(text(10 + i));
      score(req, [a, b, c, d]);
      chose(req, target);
    }
    // LRU: d, a, b, c (oldest first). Without d, a is the least recently used candidate.
    assert.deepEqual(score(makeRequest(text(20)), [c, b, a]), [0, 0.5, 1]);
  });

  test('preRequest records the primary target and the prefill profile target, for cold requests only', () => {
    const { score, chose, scorer } = setup({ prefillProfile: 'p' });
    const req = makeRequest(text(1));
    score(req, [a, b, c]);
    const result: SchedulingResult = {
      primaryProfile: 'decode',
      profileResults: new Map([
        ['decode', { targets: [a] }],
        ['p', { targets: [c] }],
      ]),
    };
    scorer.preRequest(req, result);
    assert.deepEqual(scorer.lruOrder(), ['a', 'c']);
    // A request this scorer never scored is not recorded.
    chose(makeRequest(text(2)), b);
    assert.deepEqual(scorer.lruOrder(), ['a', 'c']);
    // The default prefill profile name is `prefill`.
    const defaults = setup();
    const r2 = makeRequest(text(3));
    defaults.score(r2, [a, b, c]);
    defaults.chose(r2, b, a, 'decode');
    assert.deepEqual(defaults.scorer.lruOrder(), ['b', 'a']);
  });

  /** A scorer with `lruSize` that has seen cold requests go to a, b and c in turn. */
  const afterThree = (lruSize: number) => {
    const s = setup({ lruSize });
    for (const [i, target] of [a, b, c].entries()) {
      const req = makeRequest(text(i + 1));
      s.score(req, [a, b, c]);
      s.chose(req, target);
    }
    return s;
  };

  test('lruSize ≤ 0 remembers 1024 endpoints, as llm-d does', () => {
    assert.deepEqual(afterThree(0).scorer.lruOrder(), ['a', 'b', 'c']);
  });

  test('lruSize bounds the endpoints remembered (oldest forgotten, then treated as never used)', () => {
    const { score, scorer } = afterThree(2);
    assert.deepEqual(scorer.lruOrder(), ['b', 'c']);
    assert.deepEqual(score(makeRequest(text(9)), [a, b, c]), [1, 0.5, 0]);
  });

  test('finds the prefix scorer by name, else by type, resolved on first use; none → cold with one warning', () => {
    // By name: a renamed instance.
    const named = setup({ prefixPluginName: 'px' }, 'px');
    const prompt = text(1);
    const r = makeRequest(prompt);
    named.score(r, [a, b]);
    named.chose(r, a);
    assert.deepEqual(named.score(makeRequest(prompt), [a, b]), [0.5, 0.5]);
    // By type: the default name is absent, but a plugin of type prefix-cache-scorer exists.
    const typed = setup({}, 'my-prefix');
    const r2 = makeRequest(prompt);
    typed.score(r2, [a, b]);
    typed.chose(r2, b);
    assert.deepEqual(typed.score(makeRequest(prompt), [a, b]), [0.5, 0.5]);
    assert.equal(typed.logger.warnings.length, 0);
    // Declared later: resolved lazily from the live plugin map.
    const plugins = new Map<string, Plugin>();
    const logger = recordingLogger();
    const late = new NoHitLruScorer('nh', noHitLruScorerParams.parse({}), plugins, logger);
    const prefix = new PrefixCacheScorer('prefix-cache-scorer', prefixCacheScorerParams.parse({}), new ManualClock(), { endpoints: [] });
    plugins.set('prefix-cache-scorer', prefix);
    const r3 = makeRequest(prompt);
    prefix.preRequest(r3, { primaryProfile: 'x', profileResults: new Map([['x', { targets: [a] }]]) });
    const out = new Float64Array(2);
    late.score(makeContext(), makeRequest(prompt), [a, b], out);
    assert.deepEqual([...out], [0.5, 0.5]);
    // Nothing to find: every request is cold, and the operator is told once.
    const lonelyLogger = recordingLogger();
    const lonely = new NoHitLruScorer('nh', noHitLruScorerParams.parse({ prefixPluginName: 'ghost', prefixPluginType: 'ghost-type' }), new Map(), lonelyLogger);
    for (let i = 0; i < 3; i++) lonely.score(makeContext(), makeRequest(prompt), [a, b], out);
    assert.deepEqual([...out], [1, 0]);
    assert.equal(lonelyLogger.warnings.length, 1);
    assert.match(lonelyLogger.warnings[0]!.msg ?? '', /no prefix-cache scorer/);
  });

  test('with the real scheduler: cold prompts rotate over the endpoints, warm ones stick to their cache', () => {
    const registry = builtinRegistry();
    const yaml = `plugins:
- type: no-hit-lru-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: no-hit-lru-scorer, weight: 1 }
  - { pluginRef: prefix-cache-scorer, weight: 3 }
`;
    const fleet = ['e0', 'e1', 'e2', 'e3'].map((n) => makeEndpoint(n));
    const built = buildScheduling(loadConfigText(yaml, 't.yaml', registry).config, registry, makeDeps({ endpoints: fleet }));
    assert.deepEqual(built.scheduler.preRequest.map((p) => p.name).sort(), ['no-hit-lru-scorer', 'prefix-cache-scorer']);
    const placed: string[] = [];
    for (let i = 0; i < 8; i++) {
      const outcome = built.scheduler.schedule(makeRequest(text(100 + i)), fleet);
      assert.ok(outcome.ok);
      placed.push(outcome.target.name);
    }
    // Every cold prompt goes to the least recently used endpoint: a strict rotation.
    assert.deepEqual(placed, ['e0', 'e1', 'e2', 'e3', 'e0', 'e1', 'e2', 'e3']);
    // A repeat of prompt #5 (placed on e1) is warm: the prefix scorer sends it back there.
    const again = built.scheduler.schedule(makeRequest(text(105)), fleet);
    assert.ok(again.ok && again.target.name === 'e1');
    assert.equal(tally(placed).size, 4);
  });

  test('definition: defaults, strict, accepts its own output, registered as a scorer', () => {
    const def = noHitLruScorerDefinition;
    const defaults = { prefixPluginName: 'prefix-cache-scorer', prefixPluginType: 'prefix-cache-scorer', prefillProfile: 'prefill', lruSize: 1024 };
    assert.deepEqual(def.params.parse({}), defaults);
    assert.deepEqual(def.params.parse(def.params.parse({ lruSize: 8 })), { ...defaults, lruSize: 8 });
    // ≤ 0 is read as 1024 with a warning, as llm-d does.
    assert.deepEqual(def.configWarnings!(def.params.parse({ lruSize: 0 }), { metricsIntervalMs: 50 }).map((w) => w.message), ['lruSize 0 is not positive: read as 1024 (as llm-d does)']);
    assert.deepEqual(def.configWarnings!(def.params.parse({ lruSize: 8 }), { metricsIntervalMs: 50 }), []);
    for (const bad of [{ lruSize: 1.5 }, { prefixPluginName: '' }, { unknown: 1 }]) {
      assert.equal(def.params.safeParse(bad).success, false, JSON.stringify(bad));
    }
    assert.equal(builtinRegistry().get('no-hit-lru-scorer'), def);
    assert.ok(builtinRegistry().is('no-hit-lru-scorer', 'scorer'));
    const plugin = def.create('nh', def.params.parse({}), makeDeps());
    assert.equal(plugin.name, 'nh');
  });
});
