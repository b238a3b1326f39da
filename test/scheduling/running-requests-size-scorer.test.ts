import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import {
  RunningRequestsSizeScorer,
  runningRequestsSizeScorerDefinition,
} from '../../src/scheduling/plugins/running-requests-size-scorer.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest } from './helpers.js';

const scorer = new RunningRequestsSizeScorer('running-requests-size-scorer');

function scores(endpoints: Endpoint[]): number[] {
  const out = new Float64Array(endpoints.length);
  scorer.score(makeContext(), makeRequest(), endpoints, out);
  return [...out];
}

describe('running-requests-size-scorer', () => {
  test('(maxR − r)/(maxR − minR) over the candidates', () => {
    assert.deepEqual(scores([makeEndpoint('a', { running: 0 }), makeEndpoint('b', { running: 4 }), makeEndpoint('c', { running: 8 })]), [1, 0.5, 0]);
    assert.deepEqual(scores([makeEndpoint('a', { running: 10 }), makeEndpoint('b', { running: 2 })]), [0, 1]);
  });

  test('reads running, not waiting', () => {
    assert.deepEqual(scores([makeEndpoint('a', { running: 1, waiting: 50 }), makeEndpoint('b', { running: 3, waiting: 0 })]), [1, 0]);
  });

  test('all equal (or a single candidate) → 1', () => {
    assert.deepEqual(scores([makeEndpoint('a', { running: 5 }), makeEndpoint('b', { running: 5 })]), [1, 1]);
    assert.deepEqual(scores([makeEndpoint('a', { running: 9 })]), [1]);
  });

  test('missing metrics → 0, and left out of min/max', () => {
    assert.deepEqual(scores([makeEndpoint('a', { running: 2 }), makeEndpoint('b', { noMetrics: true }), makeEndpoint('c', { running: 6 })]), [1, 0, 0]);
    assert.deepEqual(scores([makeEndpoint('a', { noMetrics: true })]), [0]);
  });

  test('definition: no parameters (strict), accepts its own output, registered as a scorer', () => {
    const def = runningRequestsSizeScorerDefinition;
    assert.deepEqual(def.params.parse({}), {});
    assert.deepEqual(def.params.parse(def.params.parse({})), {});
    assert.equal(def.params.safeParse({ threshold: 1 }).success, false);
    const registry = builtinRegistry();
    assert.equal(registry.get('running-requests-size-scorer'), def);
    assert.ok(registry.is('running-requests-size-scorer', 'scorer'));
    const plugin = def.create('rr', {}, makeDeps());
    assert.equal(plugin.name, 'rr');
    assert.equal(plugin.type, 'running-requests-size-scorer');
  });
});
