import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint, LoraInfo } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { LoraAffinityScorer, loraAffinityScorerDefinition } from '../../src/scheduling/plugins/lora-affinity-scorer.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest } from './helpers.js';

const scorer = new LoraAffinityScorer('lora-affinity-scorer');

function withLora(name: string, lora: LoraInfo | undefined): Endpoint {
  const endpoint = makeEndpoint(name);
  if (lora !== undefined) endpoint.metrics!.lora = lora;
  return endpoint;
}

function scores(model: string, endpoints: Endpoint[]): number[] {
  const out = new Float64Array(endpoints.length);
  scorer.score(makeContext(), makeRequest('prompt', { model }), endpoints, out);
  return [...out];
}

describe('lora-affinity-scorer', () => {
  test('1.0 running, 0.8 free slot, 0.6 waiting, 0 otherwise', () => {
    const endpoints = [
      withLora('running', { running: ['other', 'sql-lora'], waiting: [], maxLora: 2 }),
      withLora('free-slot', { running: ['other'], waiting: [], maxLora: 2 }),
      withLora('waiting', { running: ['a', 'b'], waiting: ['sql-lora'], maxLora: 2 }),
      withLora('full', { running: ['a', 'b'], waiting: ['c'], maxLora: 2 }),
    ];
    assert.deepEqual(scores('sql-lora', endpoints), [1, 0.8, 0.6, 0]);
  });

  test('checked in order: running beats everything, a free slot beats waiting', () => {
    // Running and waiting both list it, and slots are free: running wins.
    assert.deepEqual(scores('x', [withLora('e', { running: ['x'], waiting: ['x'], maxLora: 4 })]), [1]);
    // Waiting for it, but a slot is free: the free slot (0.8) is checked before waiting (0.6).
    assert.deepEqual(scores('x', [withLora('e', { running: [], waiting: ['x'], maxLora: 4 })]), [0.8]);
  });

  test('loaded adapters are counted once: running ∪ waiting against max_lora', () => {
    // 'a' is both running and waiting: 2 distinct adapters < 3 → a free slot.
    assert.deepEqual(scores('new', [withLora('e', { running: ['a', 'b'], waiting: ['a'], maxLora: 3 })]), [0.8]);
    // 3 distinct adapters = max_lora → no free slot.
    assert.deepEqual(scores('new', [withLora('e', { running: ['a', 'b'], waiting: ['c'], maxLora: 3 })]), [0]);
  });

  test('no LoRA information, max_lora 0 or no metrics → 0', () => {
    const noMetrics = makeEndpoint('none', { noMetrics: true });
    assert.deepEqual(
      scores('m', [withLora('no-info', undefined), withLora('zero', { running: [], waiting: [], maxLora: 0 }), noMetrics]),
      [0, 0, 0],
    );
  });

  test('the base model gets the free-slot score where slots are free', () => {
    assert.deepEqual(
      scores('base', [withLora('a', { running: [], waiting: [], maxLora: 1 }), withLora('b', { running: ['z'], waiting: [], maxLora: 1 })]),
      [0.8, 0],
    );
  });

  test('definition: no parameters (strict), accepts its own output, registered as a scorer', () => {
    const def = loraAffinityScorerDefinition;
    assert.deepEqual(def.params.parse({}), {});
    assert.deepEqual(def.params.parse(def.params.parse({})), {});
    assert.equal(def.params.safeParse({ baseModel: 'm' }).success, false);
    assert.equal(builtinRegistry().get('lora-affinity-scorer'), def);
    assert.ok(builtinRegistry().is('lora-affinity-scorer', 'scorer'));
    assert.equal(def.create('lora', {}, makeDeps()).name, 'lora');
  });
});
