/**
 * A registry of small fake plugin definitions for config tests: real kinds and parameter schemas
 * (the loader only needs those), trivial `create`. Independent of the real plugin implementations.
 */
import { z } from 'zod';
import { flowControlPolicyDefinitions } from '../../src/flowcontrol/policies/index.js';
import { PluginRegistry, type PluginDefinition, type PluginKind } from '../../src/plugins/registry.js';

function fake<P>(type: string, kinds: PluginKind[], params: z.ZodType<P>): PluginDefinition<P> {
  return { type, kinds, params, create: (name) => ({ type, name }) };
}

const none = () => z.strictObject({});

export const fakeDefinitions: PluginDefinition[] = [
  fake('queue-scorer', ['scorer'], none()),
  fake('kv-cache-utilization-scorer', ['scorer'], none()),
  fake(
    'prefix-cache-scorer',
    ['scorer'],
    z.strictObject({
      blockSizeTokens: z.number().int().positive().default(16),
      maxPrefixBlocksToMatch: z.number().int().positive().default(256),
      lruCapacityPerServer: z.number().int().positive().default(31250),
    }),
  ),
  fake('active-request-scorer', ['scorer'], none()),
  fake('max-score-picker', ['picker'], z.strictObject({ maxNumOfEndpoints: z.number().int().positive().default(1) })),
  fake('random-picker', ['picker'], z.strictObject({ maxNumOfEndpoints: z.number().int().positive().default(1) })),
  fake('single-profile-handler', ['profileHandler'], none()),
  fake(
    'disagg-profile-handler',
    ['profileHandler'],
    z.strictObject({
      profiles: z.strictObject({ decode: z.string().default('decode'), prefill: z.string().default('prefill') }).prefault({}),
      deciders: z.strictObject({ prefill: z.string().optional() }).prefault({}),
      connector: z.enum(['sidecar', 'nixlv2', 'shared-storage']).default('sidecar'),
    }),
  ),
  fake('prefix-based-pd-decider', ['decider'], z.strictObject({ nonCachedTokens: z.number().int().min(0).default(0) })),
  fake('always-disagg-pd-decider', ['decider'], none()),
  fake('decode-filter', ['filter'], none()),
  fake('prefill-filter', ['filter'], none()),
  fake(
    'utilization-detector',
    ['filter', 'saturationDetector'],
    z.strictObject({
      queueDepthThreshold: z.number().int().positive().default(5),
      kvCacheUtilThreshold: z.number().gt(0).lte(1).default(0.8),
      metricsStalenessThreshold: z.string().default('200ms'),
      headroom: z.number().min(0).default(0),
    }),
  ),
  fake(
    'concurrency-detector',
    ['filter', 'saturationDetector'],
    z.strictObject({ maxConcurrency: z.number().int().positive().default(100), headroom: z.number().min(0).default(0) }),
  ),
];

export function fakeRegistry(): PluginRegistry {
  const registry = new PluginRegistry();
  for (const def of fakeDefinitions) registry.register(def);
  for (const def of flowControlPolicyDefinitions) registry.register(def);
  return registry;
}
