/**
 * `sluice validate` output: the effective config as YAML (durations and sizes back in their
 * human units), preceded by a comment per auto-injection, so nothing the loader added is hidden.
 * The output loads back to an equal config.
 */
import { createHash } from 'node:crypto';
import { Document } from 'yaml';
import type { LoadedConfig, PriorityBandConfig, SluiceConfig } from './types.js';
import { featureEnabled, featureGateWritten } from './defaults.js';
import { formatDuration, formatQuantity } from './units.js';

/** A size in its shortest form; plain numbers stay YAML numbers rather than quoted strings. */
function quantityYaml(n: number): string | number {
  const text = formatQuantity(n);
  return /^\d+$/.test(text) ? n : text;
}

function bandYaml(band: Omit<PriorityBandConfig, 'priority'> & { priority?: number }): Record<string, unknown> {
  return {
    ...(band.priority !== undefined ? { priority: band.priority } : {}),
    maxBytes: quantityYaml(band.maxBytes),
    maxRequests: band.maxRequests,
    fairnessPolicyRef: band.fairnessPolicyRef,
    orderingPolicyRef: band.orderingPolicyRef,
  };
}

/** The effective config as a plain object keyed like the YAML file. */
export function effectiveConfigObject(config: SluiceConfig): Record<string, unknown> {
  const { server, pool, flowControl: fc } = config;
  return {
    apiVersion: config.apiVersion,
    kind: config.kind,
    server: {
      host: server.host,
      port: server.port,
      metricsPort: server.metricsPort,
      bodyLimit: quantityYaml(server.bodyLimit),
      shutdownGracePeriod: formatDuration(server.shutdownGracePeriod),
      requestHeadersTimeout: formatDuration(server.requestHeadersTimeout),
      requestTimeout: formatDuration(server.requestTimeout),
      maxPipelinedRequests: server.maxPipelinedRequests,
      profiling: server.profiling,
      storedResponses: server.storedResponses,
      upstream: {
        connectTimeout: formatDuration(server.upstream.connectTimeout),
        headersTimeout: formatDuration(server.upstream.headersTimeout),
        bodyTimeout: formatDuration(server.upstream.bodyTimeout),
        retries: server.upstream.retries,
        connections: server.upstream.connections,
        outlierDetection: {
          ...server.upstream.outlierDetection,
          baseEjectionTime: formatDuration(server.upstream.outlierDetection.baseEjectionTime),
          maxEjectionTime: formatDuration(server.upstream.outlierDetection.maxEjectionTime),
          stallTimeout: formatDuration(server.upstream.outlierDetection.stallTimeout),
        },
      },
    },
    pool: {
      name: pool.name,
      targetPort: pool.targetPort,
      metrics: {
        path: pool.metrics.path,
        interval: formatDuration(pool.metrics.interval),
        timeout: formatDuration(pool.metrics.timeout),
        maxBytes: quantityYaml(pool.metrics.maxBytes),
        defaultEngine: pool.metrics.defaultEngine,
      },
      endpoints: pool.endpoints.map((e) => ({
        name: e.name,
        address: e.address,
        port: e.port,
        ...(Object.keys(e.labels).length > 0 ? { labels: e.labels } : {}),
      })),
    },
    objectives: config.objectives.map((o) => ({ name: o.name, priority: o.priority })),
    featureGates: config.featureGates,
    plugins: config.plugins.map((p) => ({
      type: p.type,
      name: p.name,
      ...(Object.keys(p.parameters).length > 0 ? { parameters: p.parameters } : {}),
    })),
    schedulingProfiles: config.schedulingProfiles.map((profile) => ({
      name: profile.name,
      plugins: profile.plugins.map((ref) => (ref.weight === undefined ? { pluginRef: ref.pluginRef } : { ...ref })),
      ...(profile.saturationFilter !== undefined ? { saturationFilter: profile.saturationFilter } : {}),
    })),
    flowControl: {
      maxBytes: quantityYaml(fc.maxBytes),
      maxRequests: fc.maxRequests,
      defaultRequestTTL: formatDuration(fc.defaultRequestTTL),
      noEndpointRequestTTL: formatDuration(fc.noEndpointRequestTTL),
      defaultPriorityBand: bandYaml(fc.defaultPriorityBand),
      ...(fc.defaultNegativePriorityBand ? { defaultNegativePriorityBand: bandYaml(fc.defaultNegativePriorityBand) } : {}),
      priorityBands: fc.priorityBands.map(bandYaml),
      usageLimitPolicyPluginRef: fc.usageLimitPolicyPluginRef,
      saturationDetector: { pluginRef: fc.saturationDetector.pluginRef },
      affinityLookahead: fc.affinityLookahead,
    },
  };
}

export function effectiveConfigYaml(loaded: LoadedConfig): string {
  const doc = new Document(effectiveConfigObject(loaded.config));
  const header = [
    ` Effective configuration of ${loaded.file} (after defaults and auto-injection).`,
    ` digest: ${effectiveConfigDigest(loaded.config)} (sluice_config_info{digest} of a gateway running it)`,
  ];
  header.push(
    !featureEnabled(loaded.config, 'flowControl')
      ? ' flow control: off (featureGates): requests are scheduled at once, never queued'
      : featureGateWritten(loaded.config, 'flowControl')
        ? ' flow control: on (featureGates)'
        : ' flow control: on (Sluice\'s default; llm-d\'s is off: featureGates: [flowControl=false] turns it off)',
  );
  for (const injection of loaded.injections) header.push(` injected: ${injection.what}`);
  doc.commentBefore = header.join('\n');
  return doc.toString({ lineWidth: 0 });
}

/**
 * A short digest of the effective configuration (the YAML `validate` prints, comments left out, keys
 * sorted): the same for files that differ only in comments, key order, units or defaults written out,
 * so replicas running the same configuration show the same `sluice_config_info{digest}`. Sorted,
 * because a parameter written at its default keeps the place the user gave it in the printed form,
 * while a reload rightly finds the two configurations equal.
 */
export function effectiveConfigDigest(config: SluiceConfig): string {
  const body = new Document(withSortedKeys(effectiveConfigObject(config))).toString({ lineWidth: 0 });
  return createHash('sha256').update(body).digest('hex').slice(0, 12);
}

/** `value` with every mapping's keys in sorted order (lists keep theirs: their order means something). */
function withSortedKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withSortedKeys);
  if (value === null || typeof value !== 'object') return value;
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(value).sort()) out[key] = withSortedKeys((value as Record<string, unknown>)[key]);
  return out;
}
