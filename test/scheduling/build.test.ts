import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { PluginSpec, SchedulingProfileConfig, SluiceConfig } from '../../src/config/types.js';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { isSaturationDetector } from '../../src/saturation/detector.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import type { Filter, Scorer } from '../../src/scheduling/framework.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest } from './helpers.js';
import { DEFAULT_OUTLIER_POLICY } from '../../src/datalayer/outlier.js';

function config(plugins: Partial<PluginSpec>[], profiles: SchedulingProfileConfig[], detectorRef = 'utilization-detector'): SluiceConfig {
  return {
    apiVersion: 'llm-d.ai/v1alpha1',
    kind: 'EndpointPickerConfig',
    server: {
      host: '0.0.0.0',
      port: 8080,
      metricsPort: 9090,
      bodyLimit: 16 << 20,
      shutdownGracePeriod: 30_000,
      requestHeadersTimeout: 30_000,
      maxPipelinedRequests: 16,
      requestTimeout: 300_000,
      profiling: true,
      storedResponses: 100_000,
      upstream: { connectTimeout: 5000, headersTimeout: 300_000, bodyTimeout: 300_000, retries: 2, connections: 0, outlierDetection: DEFAULT_OUTLIER_POLICY },
    },
    pool: { name: 'pool', targetPort: 8000, metrics: { path: '/metrics', interval: 50, timeout: 1000, maxBytes: 4 * 1024 * 1024, defaultEngine: 'vllm' }, endpoints: [] },
    objectives: [],
    featureGates: [],
    plugins: plugins.map((p) => ({ type: p.type!, name: p.name ?? p.type!, parameters: p.parameters ?? {} })),
    schedulingProfiles: profiles,
    flowControl: {
      maxBytes: 0,
      maxRequests: 0,
      defaultRequestTTL: 60_000,
      noEndpointRequestTTL: 60_000,
      defaultPriorityBand: {
        maxBytes: 1e9,
        maxRequests: 5000,
        fairnessPolicyRef: 'global-strict-fairness-policy',
        orderingPolicyRef: 'fcfs-ordering-policy',
      },
      priorityBands: [],
      usageLimitPolicyPluginRef: 'static-usage-limit-policy',
      saturationDetector: { pluginRef: detectorRef },
      affinityLookahead: 0,
    },
  };
}

const DEFAULT_PLUGINS: Partial<PluginSpec>[] = [
  { type: 'queue-scorer' },
  { type: 'kv-cache-utilization-scorer' },
  { type: 'prefix-cache-scorer' },
  { type: 'single-profile-handler' },
  { type: 'max-score-picker' },
  { type: 'utilization-detector' },
];
const DEFAULT_PROFILE: SchedulingProfileConfig = {
  name: 'default',
  plugins: [
    { pluginRef: 'queue-scorer', weight: 2 },
    { pluginRef: 'kv-cache-utilization-scorer', weight: 2 },
    { pluginRef: 'prefix-cache-scorer', weight: 3 },
    { pluginRef: 'max-score-picker' },
    { pluginRef: 'utilization-detector' },
  ],
};

describe('buildScheduling', () => {
  test('builds the default configuration', () => {
    const built = buildScheduling(config(DEFAULT_PLUGINS, [DEFAULT_PROFILE]), builtinRegistry(), makeDeps());
    assert.deepEqual([...built.plugins.keys()], DEFAULT_PLUGINS.map((p) => p.type));
    assert.equal(built.detector.name, 'utilization-detector');
    assert.ok(isSaturationDetector(built.detector));
    assert.equal(built.detector, built.plugins.get('utilization-detector'));
    const profile = built.scheduler.profiles.get('default')!;
    assert.deepEqual(
      profile.scorers.map((s) => [s.scorer.name, s.weight]),
      [
        ['queue-scorer', 2],
        ['kv-cache-utilization-scorer', 2],
        ['prefix-cache-scorer', 3],
      ],
    );
    assert.deepEqual(profile.filters.map((f) => f.name), ['utilization-detector']);
    assert.equal(profile.picker.name, 'max-score-picker');
    assert.equal(built.scheduler.handler.name, 'single-profile-handler');
    assert.deepEqual(built.scheduler.preRequest.map((p) => p.name), ['prefix-cache-scorer']);
    assert.deepEqual(built.responseHooks, []);
  });

  test('schedules end to end', () => {
    const built = buildScheduling(config(DEFAULT_PLUGINS, [DEFAULT_PROFILE]), builtinRegistry(), makeDeps());
    const outcome = built.scheduler.schedule(makeRequest('x'), [
      makeEndpoint('busy', { waiting: 4, kv: 0.5 }),
      makeEndpoint('idle', { waiting: 0, kv: 0.1 }),
    ]);
    assert.ok(outcome.ok);
    assert.equal(outcome.target.name, 'idle');
  });

  test('one instance per name, shared between profiles; weight defaults to 1; filters keep listed order', () => {
    const built = buildScheduling(
      config(
        [
          { type: 'decode-filter' },
          { type: 'prefill-filter' },
          { type: 'queue-scorer', name: 'q' },
          { type: 'max-score-picker' },
          { type: 'single-profile-handler' },
          { type: 'utilization-detector', name: 'ud', parameters: { headroom: 0.5 } },
        ],
        [
          { name: 'a', plugins: [{ pluginRef: 'decode-filter' }, { pluginRef: 'ud' }, { pluginRef: 'q' }, { pluginRef: 'max-score-picker' }] },
          { name: 'b', plugins: [{ pluginRef: 'ud' }, { pluginRef: 'prefill-filter' }, { pluginRef: 'q', weight: 4 }, { pluginRef: 'max-score-picker' }] },
        ],
        'ud',
      ),
      builtinRegistry(),
      makeDeps(),
    );
    const a = built.scheduler.profiles.get('a')!;
    const b = built.scheduler.profiles.get('b')!;
    assert.deepEqual(a.filters.map((f) => f.name), ['decode-filter', 'ud']);
    assert.deepEqual(b.filters.map((f) => f.name), ['ud', 'prefill-filter']);
    assert.equal(a.scorers[0]!.weight, 1);
    assert.equal(b.scorers[0]!.weight, 4);
    assert.equal(a.scorers[0]!.scorer, b.scorers[0]!.scorer);
    assert.equal(a.picker, b.picker);
    assert.equal(built.detector, a.filters[1]);
  });

  test('inconsistent configurations throw', () => {
    const registry = builtinRegistry();
    const deps = makeDeps();
    const cases: [SluiceConfig, RegExp][] = [
      [config([...DEFAULT_PLUGINS, { type: 'nope' }], [DEFAULT_PROFILE]), /unknown type 'nope'/],
      [config([...DEFAULT_PLUGINS, { type: 'queue-scorer' }], [DEFAULT_PROFILE]), /declared twice/],
      [config(DEFAULT_PLUGINS, [{ name: 'default', plugins: [{ pluginRef: 'ghost' }] }]), /no plugin named 'ghost'/],
      [
        config([...DEFAULT_PLUGINS, { type: 'random-picker' }], [
          { name: 'default', plugins: [{ pluginRef: 'max-score-picker' }, { pluginRef: 'random-picker' }] },
        ]),
        /more than one picker/,
      ],
      [config(DEFAULT_PLUGINS, [{ name: 'default', plugins: [{ pluginRef: 'queue-scorer' }] }]), /no picker/],
      [
        config(DEFAULT_PLUGINS, [{ name: 'default', plugins: [{ pluginRef: 'single-profile-handler' }, { pluginRef: 'max-score-picker' }] }]),
        /not a filter, scorer or picker/,
      ],
      [config(DEFAULT_PLUGINS.filter((p) => p.type !== 'single-profile-handler'), [DEFAULT_PROFILE]), /no profile handler/],
      [
        config([...DEFAULT_PLUGINS, { type: 'single-profile-handler', name: 'second' }], [DEFAULT_PROFILE]),
        /multiple profile handlers/,
      ],
      [config(DEFAULT_PLUGINS, [DEFAULT_PROFILE], 'queue-scorer'), /not a saturation detector/],
      [config(DEFAULT_PLUGINS, [DEFAULT_PROFILE], 'missing'), /no plugin named 'missing'/],
      [config([...DEFAULT_PLUGINS.slice(0, 5), { type: 'utilization-detector', parameters: { headroom: -1 } }], [DEFAULT_PROFILE]), /invalid parameters/],
      [config(DEFAULT_PLUGINS, []), /no scheduling profiles/],
    ];
    for (const [cfg, error] of cases) assert.throws(() => buildScheduling(cfg, registry, deps), error);
  });

  test('works on what the config loader produces (defaults with no plugins)', () => {
    const registry = builtinRegistry();
    const loaded = loadConfigText('pool:\n  endpoints:\n  - {name: a, address: 127.0.0.1}\n', 'test.yaml', registry);
    const built = buildScheduling(loaded.config, registry, makeDeps());
    const profile = built.scheduler.profiles.get('default')!;
    assert.deepEqual(profile.scorers.map((s) => s.weight), [2, 2, 3]);
    assert.equal(built.detector.type, 'utilization-detector');
    assert.deepEqual(profile.filters.map((f) => f.type), ['utilization-detector']);
  });
});

describe('Scheduler.favouriteIsSaturated (the affinity look-ahead probe)', () => {
  const prompt = (seed: string): string => `${seed} `.repeat(200);
  /** Default profile; `cached` has learned `P` (it won the first decision), `other` has not. */
  function setup(profile: SchedulingProfileConfig = DEFAULT_PROFILE) {
    const built = buildScheduling(config(DEFAULT_PLUGINS, [profile]), builtinRegistry(), makeDeps());
    const cached = makeEndpoint('cached', { kv: 0 });
    const other = makeEndpoint('other', { kv: 0.1 });
    const first = built.scheduler.schedule(makeRequest(prompt('P')), [cached, other]);
    assert.ok(first.ok && first.target === cached);
    const setWaiting = (ep: typeof cached, waiting: number): void => {
      ep.metrics = { ...ep.metrics!, waiting };
    };
    return { built, cached, other, setWaiting };
  }

  test('true when the saturation filter drops the endpoint the request would pick', () => {
    const { built, cached, other, setWaiting } = setup();
    setWaiting(cached, 5); // queueDepthThreshold 5: saturated on its own
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), [cached, other]), true);
    const outcome = built.scheduler.schedule(makeRequest(prompt('P')), [cached, other]);
    assert.ok(outcome.ok && outcome.target === other, 'what dispatching now would do');
  });

  test('false when the favourite has room, when everything is saturated, or when nothing is cached anywhere', () => {
    const { built, cached, other, setWaiting } = setup();
    setWaiting(cached, 2);
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), [cached, other]), false, 'room');
    setWaiting(cached, 5);
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('Q')), [cached, other]), false, 'no affinity: its favourite is other');
    setWaiting(other, 6);
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), [cached, other]), false, 'all saturated: the filter fails open');
  });

  test('false when the filter only moves it to another endpoint that caches its prompt as well', () => {
    const built = buildScheduling(config(DEFAULT_PLUGINS, [DEFAULT_PROFILE]), builtinRegistry(), makeDeps());
    // Same scraped queue everywhere (the queue scorer ties); `one` is saturated by what Sluice sent since.
    const one = makeEndpoint('one', { waiting: 3, kv: 0 });
    const two = makeEndpoint('two', { waiting: 3, kv: 0.05 });
    const cold = makeEndpoint('cold', { waiting: 3, kv: 0 });
    for (const ep of [one, two]) assert.ok(built.scheduler.schedule(makeRequest(prompt('P')), [ep]).ok); // both learn P
    one.inFlight += 2; // reckoned queue 5: saturated
    const all = [one, two, cold];
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), all), false, 'two caches P too: a few per cent worse');
    two.inFlight += 2;
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), all), true, 'only cold is left: a miss');
  });

  test('false for a profile without the saturation filter', () => {
    const { built, cached, other, setWaiting } = setup({
      name: 'default',
      plugins: DEFAULT_PROFILE.plugins.filter((p) => p.pluginRef !== 'utilization-detector'),
    });
    setWaiting(cached, 5);
    assert.equal(built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), [cached, other]), false);
  });

  test('a probe teaches the prefix index nothing', () => {
    const { built, cached, other, setWaiting } = setup();
    setWaiting(cached, 5);
    for (let i = 0; i < 3; i++) built.scheduler.favouriteIsSaturated(makeRequest(prompt('R')), [cached, other]);
    const scorer = built.plugins.get('prefix-cache-scorer') as unknown as Scorer;
    const out = new Float64Array(2);
    scorer.score(makeContext(), makeRequest(prompt('R')), [cached, other], out);
    assert.deepEqual([...out], [0, 0]);
  });

  test('its filters run with a probe context, so a filter that counts its decisions does not count these', () => {
    const { built, cached, other, setWaiting } = setup();
    const seen: (boolean | undefined)[] = [];
    const profile = built.scheduler.profiles.get('default')!;
    (profile.filters as Filter[]).unshift({ type: 'spy', name: 'spy', filter: (ctx, _req, eps) => (seen.push(ctx.probe), [...eps]) });
    setWaiting(cached, 5);
    built.scheduler.favouriteIsSaturated(makeRequest(prompt('P')), [cached, other]);
    assert.ok(seen.length > 0 && seen.every((p) => p === true), `probe flags: ${seen.join(',')}`);
    seen.length = 0;
    built.scheduler.schedule(makeRequest(prompt('P')), [cached, other]);
    assert.deepEqual(seen, [undefined]);
  });
});

describe('Tuning for TTFT (configuration §3.6): queue-scorer as heavy as the prefix scorer', () => {
  const system = 'You are the assistant of the lock keeper. '.repeat(12); // ≈ 500 characters: several prefix blocks
  /** Which endpoint a new question on the cached system prompt goes to, when `cached` is full and `cold` has room. */
  function pick(queueWeight: number, slotAware = true): string {
    const plugins = DEFAULT_PLUGINS.map((p) => (p.type === 'queue-scorer' ? { ...p, parameters: { slotAware } } : p));
    const profile = { ...DEFAULT_PROFILE, plugins: DEFAULT_PROFILE.plugins.map((p) => (p.pluginRef === 'queue-scorer' ? { ...p, weight: queueWeight } : p)) };
    const built = buildScheduling(config(plugins, [profile]), builtinRegistry(), makeDeps());
    const cached = makeEndpoint('cached', { running: 2 });
    const cold = makeEndpoint('cold', { running: 2 });
    assert.ok(built.scheduler.schedule(makeRequest(`${system}first question`), [cached]).ok); // cached learns the prompt
    cached.metrics = { ...cached.metrics!, running: 8 };
    cached.observedSlots = cold.observedSlots = 8;
    const outcome = built.scheduler.schedule(makeRequest(`${system}second question`), [cached, cold]);
    assert.ok(outcome.ok);
    return outcome.target.name;
  }

  test('default weights (queue ×2): the request waits in the full server that caches its prompt', () => {
    assert.equal(pick(2), 'cached');
  });

  test('queue ×3: it goes to the server with a free slot, and the prompt spreads', () => {
    assert.equal(pick(3), 'cold');
  });

  test('queue ×3 without slotAware: the scraped queues are equal, so it stays on the full server', () => {
    assert.equal(pick(3, false), 'cached');
  });
});

describe('builtinRegistry', () => {
  test('registers every scheduling plugin and detector with its kinds', () => {
    const registry = builtinRegistry();
    for (const [type, kind] of [
      ['single-profile-handler', 'profileHandler'],
      ['decode-filter', 'filter'],
      ['prefill-filter', 'filter'],
      ['label-selector-filter', 'filter'],
      ['queue-scorer', 'scorer'],
      ['kv-cache-utilization-scorer', 'scorer'],
      ['active-request-scorer', 'scorer'],
      ['prefix-cache-scorer', 'scorer'],
      ['max-score-picker', 'picker'],
      ['random-picker', 'picker'],
      ['weighted-random-picker', 'picker'],
      ['utilization-detector', 'saturationDetector'],
      ['utilization-detector', 'filter'],
    ] as const) {
      assert.ok(registry.is(type, kind), `${type} is a ${kind}`);
    }
    assert.ok(registry.has('fcfs-ordering-policy'));
  });

  test('a rebuild after a reload: plugins of the same name and type take over what their predecessors learned', () => {
    const registry = builtinRegistry();
    const plugins = [...DEFAULT_PLUGINS, { type: 'no-hit-lru-scorer' }];
    const profile = { ...DEFAULT_PROFILE, plugins: [...DEFAULT_PROFILE.plugins, { pluginRef: 'no-hit-lru-scorer', weight: 1 }] };
    const first = buildScheduling(config(plugins, [profile]), registry, makeDeps());
    type Learner = { index: object };
    const prefix = (b: typeof first) => b.plugins.get('prefix-cache-scorer') as unknown as Learner;
    const lru = (b: typeof first) => b.plugins.get('no-hit-lru-scorer') as unknown as { lruOrder(): string[] };
    // Teach the first build: a cold request on e1, then one on e0.
    for (const target of [makeEndpoint('e1'), makeEndpoint('e0')]) {
      assert.ok(first.scheduler.schedule(makeRequest(`cold prompt for ${target.name} `.repeat(20)), [target]).ok);
    }
    assert.deepEqual(lru(first).lruOrder(), ['e1', 'e0']);

    const second = buildScheduling(config(plugins, [profile]), registry, makeDeps(), first.plugins);
    assert.notEqual(prefix(second), prefix(first), 'new instances');
    assert.equal(prefix(second).index, prefix(first).index, 'the prefix index is kept');
    assert.deepEqual(lru(second).lruOrder(), ['e1', 'e0'], 'the cold-request LRU is kept');
    const learned = (b: typeof first) => (b.plugins.get('prefix-cache-scorer') as unknown as { index: { endpointNames(): string[] } }).index.endpointNames().sort();
    assert.deepEqual(learned(second), ['e0', 'e1']);

    // A rebuild that fails (here: no profile handler) leaves the running index as it was, even
    // for an endpoint it would have moved.
    const noHandler = plugins.filter((p) => p.type !== 'single-profile-handler');
    assert.throws(() => buildScheduling(config(noHandler, [profile]), registry, makeDeps(), second.plugins, new Set(['e1'])), /no profile handler/);
    assert.deepEqual(learned(second), ['e0', 'e1']);

    // e1 now names another server: nothing learned of the old one is carried to it.
    const moved = buildScheduling(config(plugins, [profile]), registry, makeDeps(), second.plugins, new Set(['e1']));
    assert.deepEqual(learned(moved), ['e0']);
    assert.deepEqual(lru(moved).lruOrder(), ['e0']);

    // Blocks cut differently: the old hashes would never match, so the index starts empty.
    const resized = plugins.map((p) => (p.type === 'prefix-cache-scorer' ? { ...p, parameters: { blockSizeTokens: 32 } } : p));
    const third = buildScheduling(config(resized, [profile]), registry, makeDeps(), second.plugins);
    assert.notEqual(prefix(third).index, prefix(second).index);
  });
});
