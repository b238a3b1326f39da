import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { readFileSync } from 'node:fs';
import { loadConfigFile, loadConfigText } from '../../src/config/load.js';
import { effectiveConfigDigest, effectiveConfigObject, effectiveConfigYaml } from '../../src/config/print.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { load, registry, warningsBesidesNoEndpoints, yaml } from './helpers.js';

const configs: Record<string, string> = {
  empty: '',
  'spec example': yaml(
    'apiVersion: llm-d.ai/v1alpha1',
    'server: { port: 8080, metricsPort: 9090, bodyLimit: 16Mi, shutdownGracePeriod: 30s, maxPipelinedRequests: 4, upstream: { connectTimeout: 5s, retries: 2 } }',
    'pool:',
    '  name: my-pool',
    '  metrics: { path: /metrics, interval: 50ms, timeout: 1s, defaultEngine: sglang }',
    '  endpoints:',
    '  - { name: prefill-0, address: 10.0.0.11, port: 8000, labels: { llm-d.ai/role: prefill } }',
    '  - { name: decode-0, address: 10.0.0.21, labels: { llm-d.ai/role: decode } }',
    '  - { name: v6, address: "fd00::1", labels: { version: "1" } }',
    'objectives: [ { name: interactive, priority: 10 }, { name: batch, priority: -1 } ]',
    'plugins:',
    '- type: queue-scorer',
    '- type: kv-cache-utilization-scorer',
    '- type: prefix-cache-scorer',
    '  parameters: { blockSizeTokens: 64 }',
    '- type: utilization-detector',
    '  parameters: { queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 200ms, headroom: 0.25 }',
    'schedulingProfiles:',
    '- name: default',
    '  plugins:',
    '  - { pluginRef: queue-scorer, weight: 2 }',
    '  - { pluginRef: kv-cache-utilization-scorer, weight: 2.5 }',
    '  - { pluginRef: prefix-cache-scorer, weight: 3 }',
    'flowControl:',
    '  saturationDetector: { pluginRef: utilization-detector }',
    '  maxBytes: 1536Mi',
    '  defaultRequestTTL: 1500ms',
    '  noEndpointRequestTTL: 1h30m',
    '  defaultNegativePriorityBand: { maxRequests: 50 }',
    '  priorityBands: [ { priority: 10, maxRequests: 500, maxBytes: 123456789 } ]',
  ),
  'two profiles with an opt-out': yaml(
    'featureGates: ["flowControl=false"]',
    'plugins:',
    '- type: disagg-profile-handler',
    '- type: decode-filter',
    '- type: prefill-filter',
    '- type: queue-scorer',
    'schedulingProfiles:',
    '- { name: decode, plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer } ] }',
    '- { name: prefill, plugins: [ { pluginRef: prefill-filter } ], saturationFilter: false }',
  ),
};

describe('effectiveConfigYaml', () => {
  for (const [name, text] of Object.entries(configs)) {
    test(`round trip: ${name}`, () => {
      const loaded = load(text);
      const printed = effectiveConfigYaml(loaded);
      const reloaded = load(printed, 'printed.yaml');
      assert.deepEqual(reloaded.config, loaded.config);
      // Everything the loader added is now written out, so nothing is injected a second time.
      assert.deepEqual(reloaded.injections, []);
      // With flow control off the printed flowControl block is (rightly) reported as ignored.
      const gateOff = loaded.config.featureGates.includes('flowControl=false');
      assert.deepEqual(
        warningsBesidesNoEndpoints(reloaded).map((w) => w.path),
        gateOff ? ['flowControl'] : [],
      );
    });
  }

  test('lists every injection in a leading comment and uses human units', () => {
    const printed = effectiveConfigYaml(load(configs['spec example']!, 'spec.yaml'));
    const lines = printed.split('\n');
    assert.equal(lines[0], '# Effective configuration of spec.yaml (after defaults and auto-injection).');
    assert.ok(lines.includes('# injected: utilization-detector as last filter of profile default'), printed);
    assert.ok(lines.includes('# injected: single-profile-handler (one profile and no profile handler)'), printed);
    assert.ok(lines.includes('# injected: max-score-picker as picker of profile default'), printed);
    assert.ok(lines.includes('  bodyLimit: 16Mi'), printed);
    assert.ok(lines.includes('  shutdownGracePeriod: 30s'), printed);
    assert.ok(lines.includes('  maxBytes: 1536Mi'), printed);
    assert.ok(lines.includes('  defaultRequestTTL: 1.5s'), printed);
    assert.ok(lines.includes('  noEndpointRequestTTL: 90m'), printed);
    assert.ok(lines.includes('    interval: 50ms'), printed);
    assert.ok(lines.includes('    maxBytes: 1G'), printed);
  });

  test('a digest line: the same for files differing in comments, key order and units; another for another config', () => {
    const a = 'server:\n  port: 8080\n  metricsPort: 9090\npool:\n  endpoints: []\nflowControl:\n  defaultRequestTTL: 60s\n';
    const b = '# a comment\npool: { endpoints: [] }\nflowControl: { defaultRequestTTL: 1m }\nserver: { metricsPort: 9090, port: 8080 }\n';
    const c = a.replace('60s', '30s');
    const digestLine = (text: string) => effectiveConfigYaml(load(text, 'x.yaml')).split('\n')[1];
    assert.match(digestLine(a)!, /^# digest: [0-9a-f]{12} \(sluice_config_info\{digest\} of a gateway running it\)$/);
    assert.equal(digestLine(b), digestLine(a));
    assert.notEqual(digestLine(c), digestLine(a));
    assert.equal(digestLine(a), `# digest: ${effectiveConfigDigest(load(a, 'x.yaml').config)} (sluice_config_info{digest} of a gateway running it)`);
    // A plugin parameter written at its default keeps its place in the printed form: the digest is the same,
    // as a reload finds the two equal; so is the printed form's own, loaded back.
    const plain = 'pool: { endpoints: [] }\nplugins:\n- type: prefix-cache-scorer\n';
    const spelled = 'pool: { endpoints: [] }\nplugins:\n- type: prefix-cache-scorer\n  parameters: { blockSizeTokens: 16, maxPrefixTokensToMatch: 131072 }\n';
    const builtinDigest = (text: string) => effectiveConfigYaml(load(text, 'x.yaml', builtinRegistry())).split('\n')[1];
    assert.equal(builtinDigest(spelled), builtinDigest(plain));
    assert.equal(builtinDigest(effectiveConfigYaml(load(plain, 'x.yaml', builtinRegistry()))), builtinDigest(plain), 'the printed form loads back with the same digest');
  });

  test('every setting of the loaded config is printed, at its default too (the digest hashes the printed form)', () => {
    const paths = (o: unknown, at = ''): string[] =>
      o !== null && typeof o === 'object' && !Array.isArray(o) ? Object.entries(o).flatMap(([k, v]) => paths(v, `${at}.${k}`)) : [at];
    const { config } = load('');
    assert.deepEqual(paths(effectiveConfigObject(config)).sort(), paths(config).sort());
  });

  test('round trip of the shipped configs', () => {
    for (const file of ['config/single-pool.yaml', 'config/demo.yaml']) {
      const loaded = loadConfigFile(file, registry);
      const reloaded = load(effectiveConfigYaml(loaded), file);
      assert.deepEqual(reloaded.config, loaded.config, file);
    }
  });
});

test("configuration.md's `sluice validate` sample is the real output, but for the part it marks as abridged", () => {
  const doc = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8');
  const intro = doc.indexOf('real output, abridged where marked:');
  assert.ok(intro > 0);
  const start = doc.indexOf('```yaml\n', intro) + '```yaml\n'.length;
  const sample = doc.slice(start, doc.indexOf('```\n', start)).split('\n');
  const cut = sample.findIndex((l) => l.startsWith('  # …'));
  assert.ok(cut > 0, 'the sample marks what it leaves out with "  # …"');
  let after = cut;
  while (sample[after]!.startsWith('  #')) after++;
  const loaded = loadConfigText('pool: {endpoints: [{name: vllm-0, address: 10.0.0.1}]}\n', '/tmp/sluice-docs/min.yaml', builtinRegistry());
  const real = effectiveConfigYaml(loaded).split('\n');
  assert.deepEqual(real.slice(0, cut), sample.slice(0, cut), 'before the abridged part');
  const tail = sample.slice(after);
  assert.deepEqual(real.slice(real.length - tail.length), tail, 'after the abridged part');
});
