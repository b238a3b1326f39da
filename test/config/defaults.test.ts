import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { z } from 'zod';
import { ensure, featureEnabled } from '../../src/config/defaults.js';
import { loadConfigText } from '../../src/config/load.js';
import { effectiveConfigYaml } from '../../src/config/print.js';
import type { SchedulingProfileConfig } from '../../src/config/types.js';
import { fakeRegistry } from './fake-registry.js';
import { load, registry, warningsBesidesNoEndpoints, yaml } from './helpers.js';
import { DEFAULT_OUTLIER_POLICY } from '../../src/datalayer/outlier.js';

const refs = (profile: SchedulingProfileConfig | undefined) =>
  (profile?.plugins ?? []).map((r) => (r.weight === undefined ? r.pluginRef : `${r.pluginRef}*${r.weight}`));

describe('§3.5 defaults with no plugins', () => {
  test('an empty file gets the default profile and every default plugin', () => {
    const { config, injections } = load('');
    assert.deepEqual(
      config.plugins.map((p) => p.name),
      [
        'queue-scorer',
        'kv-cache-utilization-scorer',
        'prefix-cache-scorer',
        'single-profile-handler',
        'max-score-picker',
        'fcfs-ordering-policy',
        'global-strict-fairness-policy',
        'static-usage-limit-policy',
        'utilization-detector',
      ],
    );
    assert.equal(config.schedulingProfiles.length, 1);
    assert.equal(config.schedulingProfiles[0]!.name, 'default');
    assert.deepEqual(refs(config.schedulingProfiles[0]), [
      'queue-scorer*2',
      'kv-cache-utilization-scorer*2',
      'prefix-cache-scorer*3',
      'max-score-picker',
      'utilization-detector',
    ]);
    assert.equal(config.flowControl.saturationDetector.pluginRef, 'utilization-detector');
    assert.equal(config.flowControl.usageLimitPolicyPluginRef, 'static-usage-limit-policy');
    // Injected plugins carry their schema's default parameters.
    assert.deepEqual(config.plugins.find((p) => p.name === 'utilization-detector')!.parameters, {
      queueDepthThreshold: 5,
      kvCacheUtilThreshold: 0.8,
      metricsStalenessThreshold: '200ms',
      headroom: 0,
    });
    assert.deepEqual(config.plugins.find((p) => p.name === 'static-usage-limit-policy')!.parameters, { threshold: 1 });
    assert.ok(injections.some((i) => i.what === 'utilization-detector as last filter of profile default'));
    assert.ok(injections.some((i) => i.where === 'schedulingProfiles' && i.what.startsWith('profile default')));
  });

  test('static defaults of server, pool and flowControl', () => {
    const { config } = load('');
    assert.deepEqual(config.server, {
      host: '0.0.0.0',
      port: 8080,
      metricsPort: 9090,
      bodyLimit: 16 * 1024 * 1024,
      shutdownGracePeriod: 30_000,
      requestHeadersTimeout: 30_000,
      requestTimeout: 300_000,
      maxPipelinedRequests: 16,
      profiling: true,
      storedResponses: 100_000,
      upstream: {
        connectTimeout: 5000,
        headersTimeout: 600_000,
        bodyTimeout: 300_000,
        retries: 2,
        connections: 0,
        outlierDetection: { consecutiveFailures: 5, baseEjectionTime: 5000, maxEjectionTime: 300_000, maxEjectionPercent: 50, stallTimeout: 30_000, rescueInFlight: true },
      },
    });
    // A pool built without a config (tests, benchmarks) detects outliers as the config's defaults do.
    assert.deepEqual(DEFAULT_OUTLIER_POLICY, config.server.upstream.outlierDetection);
    assert.deepEqual(config.pool, {
      name: 'default-pool',
      targetPort: 8000,
      metrics: { path: '/metrics', interval: 50, timeout: 1000, maxBytes: 4 * 1024 * 1024, defaultEngine: 'vllm' },
      endpoints: [],
    });
    assert.deepEqual(config.objectives, []);
    assert.deepEqual(config.featureGates, []);
    const band = { maxBytes: 1e9, maxRequests: 5000, fairnessPolicyRef: 'global-strict-fairness-policy', orderingPolicyRef: 'fcfs-ordering-policy' };
    assert.deepEqual(config.flowControl, {
      maxBytes: 0,
      maxRequests: 0,
      defaultRequestTTL: 60_000,
      noEndpointRequestTTL: 60_000,
      defaultPriorityBand: band,
      priorityBands: [],
      usageLimitPolicyPluginRef: 'static-usage-limit-policy',
      saturationDetector: { pluginRef: 'utilization-detector' },
      affinityLookahead: 8, // Sluice
    });
    assert.equal(config.apiVersion, 'llm-d.ai/v1alpha1');
    assert.equal(config.kind, 'EndpointPickerConfig');
  });

  test("durations past Node's longest timer count as that (a longer one would fire at once); validate prints it", () => {
    const loaded = load(yaml('server:', '  shutdownGracePeriod: 1000h', '  upstream: { bodyTimeout: 2000h, headersTimeout: 596h }', 'flowControl:', '  defaultRequestTTL: 1000h'));
    const { config } = loaded;
    assert.equal(config.server.shutdownGracePeriod, 2_147_483_647);
    assert.equal(config.server.upstream.bodyTimeout, 2_147_483_647);
    assert.equal(config.server.upstream.headersTimeout, 596 * 3_600_000); // below the limit: as written
    assert.equal(config.flowControl.defaultRequestTTL, 2_147_483_647);
    assert.match(effectiveConfigYaml(loaded), /bodyTimeout: 2147483\.647s/);
  });

  test('tuning only the detector still gets the default scorers', () => {
    const { config } = load(yaml('plugins:', '- type: utilization-detector', '  parameters: { headroom: 0.2 }'));
    assert.deepEqual(refs(config.schedulingProfiles[0]), [
      'queue-scorer*2',
      'kv-cache-utilization-scorer*2',
      'prefix-cache-scorer*3',
      'max-score-picker',
      'utilization-detector',
    ]);
    assert.equal(config.plugins.filter((p) => p.type === 'utilization-detector').length, 1);
    assert.equal(config.plugins[0]!.parameters.headroom, 0.2);
  });
});

describe('auto-injection (§3.6)', () => {
  test('the SPEC example gets handler, picker, policies and the detector filter', () => {
    const { config, injections } = load(
      yaml(
        'plugins:',
        '- type: queue-scorer',
        '- type: kv-cache-utilization-scorer',
        '- type: prefix-cache-scorer',
        '- type: utilization-detector',
        'schedulingProfiles:',
        '- name: default',
        '  plugins:',
        '  - { pluginRef: queue-scorer, weight: 2 }',
        '  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }',
        '  - { pluginRef: prefix-cache-scorer }',
      ),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), [
      'queue-scorer*2',
      'kv-cache-utilization-scorer*2',
      'prefix-cache-scorer*1',
      'max-score-picker',
      'utilization-detector',
    ]);
    assert.deepEqual(injections, [
      { where: 'plugins', what: 'single-profile-handler (one profile and no profile handler)' },
      { where: 'plugins', what: 'max-score-picker (no picker configured)' },
      { where: 'schedulingProfiles[0].plugins', what: 'max-score-picker as picker of profile default' },
      { where: 'plugins', what: 'fcfs-ordering-policy (default flow-control policy)' },
      { where: 'plugins', what: 'global-strict-fairness-policy (default flow-control policy)' },
      { where: 'plugins', what: 'static-usage-limit-policy (default flow-control policy)' },
      { where: 'schedulingProfiles[0].plugins', what: 'utilization-detector as last filter of profile default' },
    ]);
  });

  test('no profiles: one default profile with filters, scorers and pickers in declaration order', () => {
    const { config } = load(
      yaml(
        'plugins:',
        '- type: queue-scorer',
        '- type: decode-filter',
        '- type: fcfs-ordering-policy',
        '- type: prefix-cache-scorer',
        '- type: prefill-filter',
        '- type: random-picker',
      ),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), [
      'queue-scorer*1',
      'decode-filter',
      'prefix-cache-scorer*1',
      'prefill-filter',
      'random-picker',
      'utilization-detector',
    ]);
    // A declared picker means no max-score-picker is injected.
    assert.ok(!config.plugins.some((p) => p.type === 'max-score-picker'));
  });

  test('profiles without a picker get the first declared picker', () => {
    const { config } = load(
      yaml(
        'plugins:',
        '- type: disagg-profile-handler',
        '- type: queue-scorer',
        '- type: random-picker',
        '- type: max-score-picker',
        'schedulingProfiles:',
        '- { name: decode, plugins: [ { pluginRef: queue-scorer } ] }',
        '- { name: prefill, plugins: [ { pluginRef: queue-scorer }, { pluginRef: max-score-picker } ] }',
      ),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['queue-scorer*1', 'random-picker', 'utilization-detector']);
    assert.deepEqual(refs(config.schedulingProfiles[1]), ['queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    assert.ok(!config.plugins.some((p) => p.type === 'single-profile-handler'));
  });

  test('saturationFilter: false opts a profile out of the detector filter', () => {
    const { config, injections } = load(
      yaml(
        'plugins:',
        '- type: disagg-profile-handler',
        '- type: queue-scorer',
        'schedulingProfiles:',
        '- { name: decode, plugins: [ { pluginRef: queue-scorer } ] }',
        '- { name: prefill, plugins: [ { pluginRef: queue-scorer } ], saturationFilter: false }',
      ),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    assert.deepEqual(refs(config.schedulingProfiles[1]), ['queue-scorer*1', 'max-score-picker']);
    assert.equal(config.schedulingProfiles[1]!.saturationFilter, false);
    assert.ok(!injections.some((i) => i.what.includes('profile prefill') && i.what.includes('filter')));
  });

  test('the detector is not duplicated when a profile already references it', () => {
    const { config, injections } = load(
      yaml(
        'plugins:',
        '- type: utilization-detector',
        '  name: sat',
        '- type: queue-scorer',
        'schedulingProfiles:',
        '- name: default',
        '  plugins:',
        '  - pluginRef: sat',
        '  - pluginRef: queue-scorer',
        'flowControl:',
        '  saturationDetector: { pluginRef: sat }',
      ),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['sat', 'queue-scorer*1', 'max-score-picker']);
    // A named detector is used as is: no default utilization-detector is declared next to it.
    assert.ok(!config.plugins.some((p) => p.name === 'utilization-detector'));
    assert.ok(!injections.some((i) => i.what.includes('last filter')));
  });

  test('a detector that is not also a filter is not appended to profiles', () => {
    const custom = fakeRegistry().register({
      type: 'plain-detector',
      kinds: ['saturationDetector'],
      params: z.strictObject({}),
      create: (name) => ({ type: 'plain-detector', name }),
    });
    const text = yaml('plugins:', '- { type: plain-detector, name: plain }', 'flowControl:', '  saturationDetector: { pluginRef: plain }');
    const { config } = loadConfigText(text, 'c.yaml', custom);
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['queue-scorer*2', 'kv-cache-utilization-scorer*2', 'prefix-cache-scorer*3', 'max-score-picker']);
  });

  test('deprecated top-level saturationDetector is copied into flowControl (with a warning)', () => {
    const text = yaml('plugins:', '- { type: concurrency-detector, name: conc }', 'saturationDetector:', '  pluginRef: conc');
    const loaded = load(text);
    assert.equal(loaded.config.flowControl.saturationDetector.pluginRef, 'conc');
    assert.ok(!loaded.config.plugins.some((p) => p.name === 'utilization-detector'));
    assert.deepEqual(
      warningsBesidesNoEndpoints(loaded).map((w) => `${w.line}:${w.col}: ${w.path}: ${w.message}`),
      ['3:1: saturationDetector: deprecated location; move it to flowControl.saturationDetector'],
    );
  });

  test('the nested detector wins over the deprecated one', () => {
    const text = yaml(
      'plugins:',
      '- { type: concurrency-detector, name: conc }',
      'saturationDetector: { pluginRef: conc }',
      'flowControl: { saturationDetector: { pluginRef: utilization-detector } }',
    );
    const loaded = load(text);
    assert.equal(loaded.config.flowControl.saturationDetector.pluginRef, 'utilization-detector');
    assert.match(warningsBesidesNoEndpoints(loaded)[0]!.message, /ignored because flowControl.saturationDetector is set/);
  });

  test('ensure is pure: the input is not modified and the result is deterministic', () => {
    const base = load('').config;
    const input = { ...base, plugins: [], schedulingProfiles: [] };
    const snapshot = structuredClone(input);
    const a = ensure(input, registry);
    const b = ensure(input, registry);
    assert.deepEqual(input, snapshot);
    assert.deepEqual(a, b);
  });

  test('ensure is idempotent on its own output', () => {
    const first = ensure({ ...load('').config, plugins: [], schedulingProfiles: [] }, registry);
    const second = ensure(first.config, registry);
    assert.deepEqual(second.config, first.config);
    assert.deepEqual(second.injections, []);
  });
});

describe('flowControl block (reference §6.9)', () => {
  test('band limits: "0" or omitted → defaults, explicit values kept, quantities parsed', () => {
    const { config } = load(
      yaml(
        'flowControl:',
        '  maxBytes: 4Gi',
        '  maxRequests: 1k',
        '  defaultPriorityBand: { maxBytes: "0", maxRequests: "250" }',
        '  defaultNegativePriorityBand: { maxRequests: 50, priority: -7 }',
        '  priorityBands:',
        '  - { priority: 100, maxBytes: 500Mi, maxRequests: "0" }',
      ),
    );
    const fc = config.flowControl;
    assert.equal(fc.maxBytes, 4 * 1024 ** 3);
    assert.equal(fc.maxRequests, 1000);
    assert.deepEqual(fc.defaultPriorityBand, {
      maxBytes: 1e9,
      maxRequests: 250,
      fairnessPolicyRef: 'global-strict-fairness-policy',
      orderingPolicyRef: 'fcfs-ordering-policy',
    });
    assert.deepEqual(fc.defaultNegativePriorityBand, {
      maxBytes: 1e9,
      maxRequests: 50,
      fairnessPolicyRef: 'global-strict-fairness-policy',
      orderingPolicyRef: 'fcfs-ordering-policy',
    });
    assert.deepEqual(fc.priorityBands, [
      { priority: 100, maxBytes: 524_288_000, maxRequests: 5000, fairnessPolicyRef: 'global-strict-fairness-policy', orderingPolicyRef: 'fcfs-ordering-policy' },
    ]);
  });

  test('TTLs: noEndpointRequestTTL follows defaultRequestTTL; "0s" disables both', () => {
    assert.deepEqual(pickTtls(load(yaml('flowControl: { defaultRequestTTL: 30s }')).config.flowControl), [30_000, 30_000]);
    assert.deepEqual(pickTtls(load(yaml('flowControl: { defaultRequestTTL: 0s }')).config.flowControl), [0, 0]);
    assert.deepEqual(pickTtls(load(yaml('flowControl: { noEndpointRequestTTL: 5m }')).config.flowControl), [60_000, 300_000]);
    assert.deepEqual(pickTtls(load(yaml('flowControl: { defaultRequestTTL: 1s, noEndpointRequestTTL: 0 }')).config.flowControl), [1000, 0]);
  });

  test('flowControl=false with flow-control settings loads with a warning', () => {
    const loaded = load(yaml('featureGates: ["flowControl=false"]', 'flowControl:', '  maxRequests: 10'));
    assert.equal(featureEnabled(loaded.config, 'flowControl'), false);
    assert.deepEqual(
      warningsBesidesNoEndpoints(loaded).map((w) => `${w.line}:${w.col}: ${w.message}`),
      ['2:1: flow control is disabled by featureGates, so maxRequests is ignored (only saturationDetector is used)'],
    );
  });
});

describe('byte limits under server.bodyLimit', () => {
  const warned = (...lines: string[]) => warningsBesidesNoEndpoints(load(yaml(...lines))).map((w) => `${w.line}:${w.col}: ${w.path}`);

  test('each limit written below bodyLimit is said at its key, saying what it does to a larger body', () => {
    const loaded = load(
      yaml(
        'server: { bodyLimit: 1Mi }',
        'flowControl:',
        '  maxBytes: 512Ki',
        '  defaultPriorityBand: { maxBytes: 2Mi }',
        '  defaultNegativePriorityBand: { maxBytes: 1Ki }',
        '  priorityBands:',
        '  - { priority: 10, maxBytes: 1Mi }',
        '  - { priority: 0, maxBytes: 1000 }',
      ),
    );
    const ws = warningsBesidesNoEndpoints(loaded).map((w) => `${w.line}:${w.col}: ${w.path}: ${w.message}`);
    assert.deepEqual(
      ws.map((w) => w.slice(0, w.indexOf(' is below'))),
      ['3:13: flowControl.maxBytes: 512Ki', '5:44: flowControl.defaultNegativePriorityBand.maxBytes: 1Ki', '8:30: flowControl.priorityBands[1].maxBytes: 1k'],
    );
    assert.match(ws[0]!, /is below server\.bodyLimit \(1Mi\): a request body larger than it is refused 429 at once, whatever the load/);
  });

  test('no warning for the defaults (bands of 1G against 16Mi), for limits not written, or without flow control', () => {
    assert.deepEqual(warned(''), []);
    assert.deepEqual(warned('server: { bodyLimit: 2G }'), [], 'the default band limit is not the user\'s to fix here');
    assert.deepEqual(warned('featureGates: ["flowControl=false"]', 'server: { bodyLimit: 1Mi }', 'flowControl: { maxBytes: 1Ki }'), ['3:1: flowControl']);
  });
});

function pickTtls(fc: { defaultRequestTTL: number; noEndpointRequestTTL: number }): [number, number] {
  return [fc.defaultRequestTTL, fc.noEndpointRequestTTL];
}

describe('feature gates', () => {
  test('flowControl is on unless flowControl=false', () => {
    assert.equal(featureEnabled({ featureGates: [] }, 'flowControl'), true);
    assert.equal(featureEnabled({ featureGates: ['flowControl'] }, 'flowControl'), true);
    assert.equal(featureEnabled({ featureGates: ['flowControl=false'] }, 'flowControl'), false);
    assert.equal(featureEnabled({ featureGates: ['flowControl=FALSE'] }, 'flowControl'), false);
    assert.equal(featureEnabled({ featureGates: ['flowControl=false', 'flowControl=True'] }, 'flowControl'), true);
    assert.equal(featureEnabled({ featureGates: [] }, 'noSuchGate'), false);
  });

  test('gates load case-insensitively in their value', () => {
    const loaded = load(yaml('featureGates: ["flowControl=False", "haPopulateNonLeaderDatastore"]'));
    assert.equal(featureEnabled(loaded.config, 'flowControl'), false);
  });
});

describe('llm-d compatibility', () => {
  test('deprecated apiVersion and ignored llm-d blocks load with warnings', () => {
    const loaded = load(
      yaml(
        'apiVersion: inference.networking.x-k8s.io/v1alpha1',
        'kind: EndpointPickerConfig',
        'dataLayer:',
        '  sources: []',
        'flowControl:',
        '  enableEviction: true',
      ),
    );
    assert.equal(loaded.config.apiVersion, 'inference.networking.x-k8s.io/v1alpha1');
    assert.deepEqual(
      warningsBesidesNoEndpoints(loaded).map((w) => `${w.line}:${w.col}: ${w.path}: ${w.message}`),
      [
        '1:13: apiVersion: apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated; use llm-d.ai/v1alpha1',
        "3:1: dataLayer: ignored: Sluice scrapes each endpoint's metrics as configured in pool.metrics (a metrics-data-source's path and interval go there)",
        '6:19: flowControl.enableEviction: in-flight eviction is not supported by Sluice; ignored',
      ],
    );
  });

  test('endpoint port defaults to pool.targetPort; IPv6 addresses are accepted', () => {
    const { config } = load(
      yaml('pool:', '  targetPort: 9000', '  endpoints:', '  - { name: a, address: "::1" }', '  - { name: b, address: "[fd00::2]", port: 9001 }', '  - { name: c, address: vllm-0.svc.local, labels: { llm-d.ai/role: decode } }'),
    );
    assert.deepEqual(config.pool.endpoints, [
      { name: 'a', address: '::1', port: 9000, labels: {} },
      { name: 'b', address: '[fd00::2]', port: 9001, labels: {} },
      { name: 'c', address: 'vllm-0.svc.local', port: 9000, labels: { 'llm-d.ai/role': 'decode' } },
    ]);
  });

  test('keys with no value count as unset', () => {
    const { config } = load(yaml('plugins:', 'schedulingProfiles:', 'server:', '  port:'));
    assert.equal(config.server.port, 8080);
    assert.equal(config.schedulingProfiles[0]!.name, 'default');
  });
});

test('with flow control off, saturationDetector is not listed among the ignored flowControl settings', () => {
  const r = load(yaml('featureGates: ["flowControl=false"]', 'flowControl:', '  saturationDetector: { pluginRef: utilization-detector }', '  maxRequests: 10'));
  assert.deepEqual(warningsBesidesNoEndpoints(r).map((w) => w.message), ['flow control is disabled by featureGates, so maxRequests is ignored (only saturationDetector is used)']);
});
