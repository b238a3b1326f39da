import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Filter } from '../../src/scheduling/framework.js';
import { decodeFilterDefinition } from '../../src/scheduling/plugins/decode-filter.js';
import { encodeFilterDefinition } from '../../src/scheduling/plugins/encode-filter.js';
import {
  LabelSelectorFilter,
  labelSelectorFilterDefinition,
} from '../../src/scheduling/plugins/label-selector-filter.js';
import { prefillFilterDefinition } from '../../src/scheduling/plugins/prefill-filter.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest, names } from './helpers.js';

const byRole = [
  makeEndpoint('unlabelled'),
  makeEndpoint('other-labels', { labels: { zone: 'a' } }),
  makeEndpoint('decode', { role: 'decode' }),
  makeEndpoint('prefill', { role: 'prefill' }),
  makeEndpoint('prefill-decode', { role: 'prefill-decode' }),
  makeEndpoint('both', { role: 'both' }),
  makeEndpoint('encode', { role: 'encode' }),
  makeEndpoint('encode-prefill', { role: 'encode-prefill' }),
  makeEndpoint('encode-prefill-decode', { role: 'encode-prefill-decode' }),
  makeEndpoint('encode-decode', { role: 'encode-decode' }),
  makeEndpoint('empty-role', { role: '' }),
];

function run(filter: Filter, endpoints = byRole): string[] {
  return names(filter.filter(makeContext(), makeRequest(), endpoints));
}

describe('role filters', () => {
  test('decode-filter keeps decode-capable and unlabelled endpoints', () => {
    const filter = decodeFilterDefinition.create('decode-filter', {}, makeDeps()) as Filter;
    assert.deepEqual(run(filter), [
      'unlabelled',
      'other-labels',
      'decode',
      'prefill-decode',
      'both',
      'encode-prefill-decode',
    ]);
  });

  test('prefill-filter keeps prefill-capable roles, never unlabelled', () => {
    const filter = prefillFilterDefinition.create('prefill-filter', {}, makeDeps()) as Filter;
    assert.deepEqual(run(filter), ['prefill', 'prefill-decode', 'both', 'encode-prefill', 'encode-prefill-decode']);
  });

  test('encode-filter keeps encode-capable roles (llm-d: encode, encode-prefill, encode-prefill-decode), never unlabelled', () => {
    const filter = encodeFilterDefinition.create('encode-filter', {}, makeDeps()) as Filter;
    assert.deepEqual(run(filter), ['encode', 'encode-prefill', 'encode-prefill-decode']);
    assert.equal(encodeFilterDefinition.params.safeParse({ x: 1 }).success, false);
  });

  test('may return an empty list (the profile then fails)', () => {
    const filter = prefillFilterDefinition.create('prefill-filter', {}, makeDeps()) as Filter;
    assert.deepEqual(run(filter, [makeEndpoint('x'), makeEndpoint('y', { role: 'decode' })]), []);
  });

  test('take no parameters', () => {
    assert.equal(decodeFilterDefinition.params.safeParse({ allowsNoLabel: false }).success, false);
    assert.equal(prefillFilterDefinition.params.safeParse({}).success, true);
  });
});

describe('label-selector-filter', () => {
  const fleet = [
    makeEndpoint('a', { labels: { zone: 'east', tier: 'gold' } }),
    makeEndpoint('b', { labels: { zone: 'west', tier: 'silver' } }),
    makeEndpoint('c', { labels: { zone: 'east' } }),
    makeEndpoint('d', { labels: {} }),
  ];
  const selector = (params: unknown) =>
    new LabelSelectorFilter('sel', labelSelectorFilterDefinition.params.parse(params));

  test('matchLabels: every pair must match exactly', () => {
    assert.deepEqual(run(selector({ matchLabels: { zone: 'east' } }), fleet), ['a', 'c']);
    assert.deepEqual(run(selector({ matchLabels: { zone: 'east', tier: 'gold' } }), fleet), ['a']);
    assert.deepEqual(run(selector({ matchLabels: { zone: 'north' } }), fleet), []);
  });

  test('In / NotIn / Exists / DoesNotExist', () => {
    const expr = (operator: string, values?: string[]) =>
      selector({ matchExpressions: [{ key: 'tier', operator, ...(values ? { values } : {}) }] });
    assert.deepEqual(run(expr('In', ['gold', 'bronze']), fleet), ['a']);
    // NotIn keeps endpoints without the label (Kubernetes semantics)
    assert.deepEqual(run(expr('NotIn', ['gold']), fleet), ['b', 'c', 'd']);
    assert.deepEqual(run(expr('Exists'), fleet), ['a', 'b']);
    assert.deepEqual(run(expr('DoesNotExist'), fleet), ['c', 'd']);
  });

  test('matchLabels and matchExpressions are ANDed', () => {
    const filter = selector({
      matchLabels: { zone: 'east' },
      matchExpressions: [{ key: 'tier', operator: 'DoesNotExist' }],
    });
    assert.deepEqual(run(filter, fleet), ['c']);
  });

  test("a key named like an Object method is a label like any other (not found on endpoints that lack it)", () => {
    const exists = selector({ matchExpressions: [{ key: 'constructor', operator: 'Exists' }] });
    assert.deepEqual(run(exists, fleet), []);
    assert.deepEqual(run(selector({ matchExpressions: [{ key: 'toString', operator: 'DoesNotExist' }] }), fleet), ['a', 'b', 'c', 'd']);
  });

  test('empty selector keeps everything', () => {
    assert.deepEqual(run(selector({}), fleet), ['a', 'b', 'c', 'd']);
  });

  test('works on role labels (P/D via selectors)', () => {
    const filter = selector({ matchLabels: { 'llm-d.ai/role': 'prefill' } });
    assert.deepEqual(run(filter), ['prefill']);
  });

  test('parameter validation', () => {
    const p = labelSelectorFilterDefinition.params;
    assert.deepEqual(p.parse({}), { matchLabels: {}, matchExpressions: [] });
    assert.equal(p.safeParse({ matchExpressions: [{ key: 'k', operator: 'In' }] }).success, false);
    assert.equal(p.safeParse({ matchExpressions: [{ key: 'k', operator: 'In', values: [] }] }).success, false);
    assert.equal(p.safeParse({ matchExpressions: [{ key: 'k', operator: 'Exists', values: ['x'] }] }).success, false);
    assert.equal(p.safeParse({ matchExpressions: [{ key: 'k', operator: 'in', values: ['x'] }] }).success, false);
    assert.equal(p.safeParse({ matchExpressions: [{ key: 'k', operator: 'In', values: ['x'], extra: 1 }] }).success, false);
    assert.equal(p.safeParse({ matchLabels: { k: 1 } }).success, false);
    assert.equal(p.safeParse({ selector: {} }).success, false);
  });
});
