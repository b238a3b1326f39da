/** The default flow-control policy plugins the loader injects (fcfs, global-strict, static). */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  fcfsOrderingPolicyDefinition,
  flowControlPolicyDefinitions,
  globalStrictFairnessPolicyDefinition,
  staticUsageLimitPolicyDefinition,
  type FairnessPolicy,
  type OrderingPolicy,
  type UsageLimitPolicy,
} from '../../src/flowcontrol/policies/index.js';
import type { PluginDeps } from '../../src/plugins/registry.js';
import { ManualClock, seededRandom } from '../../src/util/clock.js';

const deps: PluginDeps = {
  clock: new ManualClock(),
  random: seededRandom(1),
  pool: { endpoints: [] },
  logger: { warn() {}, info() {}, debug() {} },
  plugins: new Map(),
};

describe('flow-control policy definitions', () => {
  test('types and kinds', () => {
    assert.deepEqual(
      flowControlPolicyDefinitions.map((d) => [d.type, d.kinds]),
      [
        ['fcfs-ordering-policy', ['orderingPolicy']],
        ['global-strict-fairness-policy', ['fairnessPolicy']],
        ['static-usage-limit-policy', ['usageLimitPolicy']],
      ],
    );
  });

  test('fcfs orders by enqueue time', () => {
    const fcfs = fcfsOrderingPolicyDefinition.create('f', fcfsOrderingPolicyDefinition.params.parse({}), deps) as OrderingPolicy;
    assert.equal(fcfs.name, 'f');
    const items = [
      { enqueuedAt: 30, byteSize: 1 },
      { enqueuedAt: 10, byteSize: 1, deadline: 1000 },
      { enqueuedAt: 20, byteSize: 9 },
    ];
    assert.deepEqual(
      [...items].sort((a, b) => fcfs.compare(a, b)).map((i) => i.enqueuedAt),
      [10, 20, 30],
    );
    assert.throws(() => fcfsOrderingPolicyDefinition.params.parse({ x: 1 }));
  });

  test('global-strict picks the flow whose head waited longest, skipping empty flows', () => {
    const policy = globalStrictFairnessPolicyDefinition.create('g', {}, deps) as FairnessPolicy;
    assert.equal(policy.selectFlow([]), -1);
    assert.equal(policy.selectFlow([{ id: 'a', headEnqueuedAt: 5, length: 0 }]), -1);
    assert.equal(
      policy.selectFlow([
        { id: 'a', headEnqueuedAt: 1, length: 0 },
        { id: 'b', headEnqueuedAt: 30, length: 2 },
        { id: 'c', headEnqueuedAt: 20, length: 1 },
        { id: 'd', headEnqueuedAt: 20, length: 4 },
      ]),
      2, // ties go to the first flow listed
    );
  });

  test('static usage limit: threshold (default 1.0, > 0) for every band', () => {
    const params = staticUsageLimitPolicyDefinition.params.parse({});
    assert.deepEqual(params, { threshold: 1 });
    const policy = staticUsageLimitPolicyDefinition.create('s', { threshold: 0.8 }, deps) as UsageLimitPolicy;
    assert.equal(policy.ceiling(10, [10, 0, -1]), 0.8);
    assert.equal(policy.ceiling(-1, [10, 0, -1]), 0.8);
    assert.equal(staticUsageLimitPolicyDefinition.params.safeParse({ threshold: 0 }).success, false);
    assert.equal(staticUsageLimitPolicyDefinition.params.safeParse({ threshold: -1 }).success, false);
    assert.equal(staticUsageLimitPolicyDefinition.params.safeParse({ treshold: 1 }).success, false);
  });
});
