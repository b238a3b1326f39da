/**
 * Plugins' own checks against the rest of the configuration (PluginDefinition.configWarnings), with
 * the real plugins: a utilization-detector whose metricsStalenessThreshold the scrape interval cannot
 * meet would read every endpoint saturated between scrapes and hold requests in the queue (measured:
 * p99 746 ms at 6 500 req/s with interval 1s). The config loads, with a warning at the user's key.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { yaml } from './helpers.js';

const registry = builtinRegistry();
const ENDPOINTS = ['  endpoints:', '  - { name: a, address: 127.0.0.1, port: 8001 }'];

function warnings(text: string): string[] {
  return loadConfigText(text, 'c.yaml', registry).warnings.map((w) => `${w.line}:${w.col}: ${w.path}: ${w.message}`);
}

describe('plugin warnings: scrape interval against the staleness threshold', () => {
  test('an interval as long as the default threshold is flagged at pool.metrics.interval', () => {
    const ws = warnings(yaml('pool:', '  metrics: { interval: 1s }', ...ENDPOINTS));
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /^2:24: pool\.metrics\.interval: pool\.metrics\.interval \(1s\) is not shorter than utilization-detector metricsStalenessThreshold \(200ms\)/);
    assert.match(ws[0]!, /reads saturated and requests wait in the flow-control queue/);
  });

  test('a threshold below the default interval is flagged at the parameter the user wrote', () => {
    const ws = warnings(
      yaml('pool:', ...ENDPOINTS, 'plugins:', '- type: utilization-detector', '  parameters:', '    metricsStalenessThreshold: 40ms'),
    );
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /^7:32: plugins\[0\]\.parameters\.metricsStalenessThreshold: pool\.metrics\.interval \(50ms\) is not shorter than .* \(40ms\)/);
  });

  test('the boundary: an interval just under the threshold passes, equal to it warns', () => {
    assert.deepEqual(warnings(yaml('pool:', '  metrics: { interval: 199ms }', ...ENDPOINTS)), []);
    assert.equal(warnings(yaml('pool:', '  metrics: { interval: 200ms }', ...ENDPOINTS)).length, 1);
  });

  test('stalenessPolicy: ignore leaves stale endpoints out rather than saturated: no warning', () => {
    const text = yaml(
      'pool:',
      '  metrics: { interval: 1s }',
      ...ENDPOINTS,
      'plugins:',
      '- type: utilization-detector',
      '  parameters: { stalenessPolicy: ignore }',
    );
    assert.deepEqual(warnings(text), []);
  });

  test('the defaults (50ms against 200ms) warn of nothing', () => {
    assert.deepEqual(warnings(yaml('pool:', ...ENDPOINTS)), []);
  });
});

describe('a profile whose label filters keep none of the configured endpoints', () => {
  const pd = (roles: [string, string], extraFilter = '') =>
    yaml(
      'pool:',
      '  endpoints:',
      `  - { name: p, address: 127.0.0.1, port: 8001, labels: { ${roles[0]} } }`,
      `  - { name: d, address: 127.0.0.1, port: 8002, labels: { ${roles[1]} } }`,
      'plugins:',
      '- type: prefill-filter',
      '- type: decode-filter',
      '- type: always-disagg-pd-decider',
      '- type: label-selector-filter',
      '  parameters: { matchLabels: { zone: a } }',
      '- type: disagg-profile-handler',
      '  parameters: { deciders: { prefill: always-disagg-pd-decider } }',
      'schedulingProfiles:',
      '- name: prefill',
      `  plugins: [ { pluginRef: prefill-filter }${extraFilter} ]`,
      '- name: decode',
      '  plugins: [ { pluginRef: decode-filter } ]',
    );

  test('a prefill role misspelt in its label key: the prefill profile is flagged at its name, saying what follows', () => {
    const ws = warnings(pd(['llmd.ai/role: prefill', 'llm-d.ai/role: decode']));
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /^14:9: schedulingProfiles\[0\]\.name: profile "prefill" can pick none of the 2 endpoints in pool\.endpoints: prefill-filter keeps none \(check the endpoints' labels\); the requests it should place are refused, or, if it is a P\/D handler's prefill profile, all served decode-only$/);
  });

  test('a prefill profile with no decider to run it (easily left so when moving from pd-profile-handler) is flagged at the handler', () => {
    const ws = warnings(pd(['llm-d.ai/role: prefill', 'llm-d.ai/role: decode']).replace('  parameters: { deciders: { prefill: always-disagg-pd-decider } }', '  parameters: { connector: nixlv2 }'));
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /^12:15: plugins\[4\]\.parameters: no deciders\.prefill: P\/D is off, profile "prefill" never runs and every request is served decode-only/);
  });

  test('the profile built from the declared plugins (no schedulingProfiles) is flagged at the filter that keeps none', () => {
    const built = yaml(
      'pool:',
      '  endpoints:',
      '  - { name: p, address: 127.0.0.1, port: 8001, labels: { llm-d.ai/role: prefill } }',
      'plugins:',
      '- type: queue-scorer',
      '- type: decode-filter',
    );
    const ws = warnings(built);
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /^6:9: plugins\[1\]\.type: profile "default" \(built from the plugins\) can pick none of the 1 endpoint in pool\.endpoints: decode-filter keeps none \(check/);
    assert.deepEqual(warnings(built.replace('role: prefill', 'role: decode')), []);
  });

  test('roles right: no warning; a label-selector-filter after the role filter that keeps none is named', () => {
    assert.deepEqual(warnings(pd(['llm-d.ai/role: prefill', 'llm-d.ai/role: decode'])), []);
    assert.deepEqual(warnings(pd(['llm-d.ai/role: both', 'llm-d.ai/role: decode'])), []);
    const ws = warnings(pd(['llm-d.ai/role: prefill, zone: b', 'llm-d.ai/role: decode'], ', { pluginRef: label-selector-filter }'));
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /label-selector-filter keeps none of what the label filters before it keep/);
    // A scorer before the one label filter: no "filters before it".
    const scorerFirst = pd(['llmd.ai/role: prefill', 'llm-d.ai/role: decode'])
      .replace('- type: disagg-profile-handler', '- type: queue-scorer\n- type: disagg-profile-handler')
      .replace('  plugins: [ { pluginRef: prefill-filter } ]', '  plugins: [ { pluginRef: queue-scorer }, { pluginRef: prefill-filter } ]');
    assert.match(warnings(scorerFirst).join('\n'), /prefill-filter keeps none \(check/);
    assert.deepEqual(warnings(pd(['llm-d.ai/role: prefill, zone: a', 'llm-d.ai/role: decode'], ', { pluginRef: label-selector-filter }')), []);
  });
});

describe('endpoints no profile can pick, and no endpoints at all', () => {
  const fleet = (roles: string[], profiles: string[]): string =>
    yaml(
      'pool:',
      '  endpoints:',
      ...roles.map((r, i) => `  - { name: s${i}, address: 127.0.0.1, port: ${8001 + i}${r === '' ? '' : `, labels: { llm-d.ai/role: ${r} }`} }`),
      'plugins: [ { type: decode-filter }, { type: queue-scorer } ]',
      'schedulingProfiles:',
      ...profiles,
    );
  const decodeOnly = ['- name: default', '  plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer } ]'];

  test('prefill servers without a P/D handler gate every request through their stage: said once, at the first one', () => {
    const ws = warnings(fleet(['decode', 'prefill', 'prefill', ''], decodeOnly));
    assert.equal(ws.length, 1, ws.join('\n'));
    assert.match(ws[0]!, /^4:74: pool\.endpoints\[1\]\.labels\["llm-d\.ai\/role"\]: no scheduling profile can pick s1, s2 \(every profile's label filters leave them out\), yet they count toward stage-aware saturation \(stage prefill\)/);
  });

  test('no warning when a profile picks every endpoint, or for an encode-only server (in no stage)', () => {
    assert.deepEqual(warnings(fleet(['decode', 'prefill'], ['- name: all', '  plugins: [ { pluginRef: queue-scorer } ]'])), []);
    assert.deepEqual(warnings(fleet(['decode', 'encode'], decodeOnly)), []);
  });

  test('an empty pool is said at pool.endpoints, or at the top of a file without one', () => {
    assert.deepEqual(warnings(yaml('server: { port: 8080 }', 'pool:', '  endpoints: []')), [
      '3:14: pool.endpoints: no endpoints: every API request is answered 503 rejected-no-endpoints (with flow control, after waiting flowControl.noEndpointRequestTTL for a reload that adds some)',
    ]);
    assert.match(warnings('')[0]!, /^1:1: pool\.endpoints: no endpoints: /);
  });
});
