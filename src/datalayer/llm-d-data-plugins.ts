/**
 * llm-d's data-layer plugins, accepted so llm-d configurations that declare them load unchanged.
 * Sluice scrapes every endpoint itself as `pool.metrics` says (scraper.ts) and reads the built-in
 * metric names of its engine type (vllm-metrics.ts); these plugins stand for those settings.
 *
 * `metrics-data-source` — the scrape. Parameters (llm-d's, defaults):
 * - `path` "/metrics" — stands for `pool.metrics.path` (the loader applies it; written in both
 *   places, the two must agree)
 * - `interval` — stands for `pool.metrics.interval` (same rule)
 * - `scheme` "http" — only `http`: Sluice scrapes and proxies over plain HTTP (error otherwise)
 * - `insecureSkipVerify` (true), `caCertPath`, `clientCertPath`, `clientKeyPath` — TLS settings,
 *   meaningless over http (so in llm-d too): accepted
 * - `families` — the families worth parsing: accepted; Sluice's parser skips every other family
 *   after reading its name anyway
 *
 * `core-metrics-extractor` — the engine-specific metric names. Parameters (llm-d's):
 * - `engineLabelKey` "llm-d.ai/engine-type" — only that label (or GIE's legacy
 *   `inference.networking.k8s.io/engine-type`, which Sluice also reads)
 * - `defaultEngine` "vllm" — the engine type of an endpoint without that label: `vllm`, `sglang` or
 *   `trtllm-serve`; stands for `pool.metrics.defaultEngine`
 * - `engineConfigs` — custom metric names per engine: not supported (error); Sluice reads the
 *   built-in names of vllm, sglang and trtllm-serve (docs/configuration.md "Engine type")
 *
 * `endpoint-notification-source` — endpoints added to and removed from the pool, as events for
 * llm-d's data-layer extractors. No parameters. Sluice's pool tracks its endpoints itself (start and
 * reload), so it stands for nothing here.
 */
import { z } from 'zod';
import { durationField, engineTypeField } from '../config/schema.js';
import { formatDuration } from '../config/units.js';
import type { PluginDefinition } from '../plugins/registry.js';
import { ENGINE_LABEL, LEGACY_ENGINE_LABEL } from './endpoint.js';

const metricsDataSourceParams = z.strictObject({
  scheme: z
    .string()
    .refine((s) => s === 'http', { message: 'only "http" is supported: Sluice scrapes and proxies over plain HTTP' })
    .optional(),
  path: z
    .string()
    .refine((p) => p.startsWith('/'), { message: 'must start with "/"' })
    .optional(),
  interval: durationField({ positive: true }).optional(),
  insecureSkipVerify: z.boolean().optional(),
  caCertPath: z.string().optional(),
  clientCertPath: z.string().optional(),
  clientKeyPath: z.string().optional(),
  families: z.array(z.string()).optional(),
});

export const metricsDataSourceDefinition: PluginDefinition<z.infer<typeof metricsDataSourceParams>> = {
  type: 'metrics-data-source',
  kinds: [],
  params: metricsDataSourceParams,
  standsFor: (p) => [
    ...(p.path === undefined ? [] : [{ parameter: 'path', setting: ['pool', 'metrics', 'path'], value: p.path, written: p.path }]),
    ...(p.interval === undefined
      ? []
      : [{ parameter: 'interval', setting: ['pool', 'metrics', 'interval'], value: p.interval, written: formatDuration(p.interval) }]),
  ],
  create: (name) => ({ type: 'metrics-data-source', name }),
};

const coreMetricsExtractorParams = z.strictObject({
  engineLabelKey: z
    .string()
    .refine((k) => k === ENGINE_LABEL || k === LEGACY_ENGINE_LABEL, {
      message: `only "${ENGINE_LABEL}" (or "${LEGACY_ENGINE_LABEL}") is supported: Sluice reads the engine type from that label`,
    })
    .optional(),
  defaultEngine: engineTypeField.optional(),
  engineConfigs: z
    .unknown()
    .refine((v) => v === undefined, {
      message: 'custom metric names are not supported: Sluice reads the built-in names of vllm, sglang and trtllm-serve (label llm-d.ai/engine-type)',
    })
    .optional(),
});

export const coreMetricsExtractorDefinition: PluginDefinition<z.infer<typeof coreMetricsExtractorParams>> = {
  type: 'core-metrics-extractor',
  kinds: [],
  params: coreMetricsExtractorParams,
  standsFor: (p) =>
    p.defaultEngine === undefined ? [] : [{ parameter: 'defaultEngine', setting: ['pool', 'metrics', 'defaultEngine'], value: p.defaultEngine, written: p.defaultEngine }],
  create: (name) => ({ type: 'core-metrics-extractor', name }),
};

export const endpointNotificationSourceDefinition: PluginDefinition<Record<string, never>> = {
  type: 'endpoint-notification-source',
  kinds: [],
  params: z.strictObject({}),
  create: (name) => ({ type: 'endpoint-notification-source', name }),
};
