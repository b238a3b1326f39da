/**
 * Composition root: an effective configuration in, a running gateway out (API port + metrics port,
 * scraper, scheduler, metrics), with a graceful stop.
 */
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import { buildAdminServer } from './admin/server.js';
import type { LoadedConfig, SluiceConfig } from './config/types.js';
import { formatProblem, type ConfigProblem } from './config/load.js';
import { Pool } from './datalayer/pool.js';
import { Scraper } from './datalayer/scraper.js';
import { GatewayMetrics } from './metrics/metrics.js';
import { builtinRegistry } from './plugins/builtin.js';
import type { PluginRegistry } from './plugins/registry.js';
import { GatewayError } from './proxy/errors.js';
import { ModelsCache } from './proxy/models.js';
import type { ProxyRuntime } from './proxy/runtime.js';
import { ApiServer } from './proxy/server.js';
import { Upstreams } from './proxy/upstreams.js';
import type { SaturationDetector } from './saturation/detector.js';
import { stageSaturation } from './saturation/stages.js';
import { featureEnabled } from './config/defaults.js';
import { FlowController } from './flowcontrol/controller.js';
import type { FairnessPolicy, OrderingPolicy, UsageLimitPolicy } from './flowcontrol/policies/types.js';
import { buildScheduling } from './scheduling/build.js';
import { systemClock, type Clock, type RandomSource } from './util/clock.js';
import { silentLogger } from './util/logger.js';

export interface GatewayOptions {
  logger?: Logger;
  clock?: Clock;
  random?: RandomSource;
  registry?: PluginRegistry;
  /** Override the configured ports (0 = ephemeral, for tests). */
  port?: number;
  metricsPort?: number;
  host?: string;
}

export interface Gateway {
  readonly apiPort: number;
  readonly metricsPort: number;
  readonly apiUrl: string;
  readonly metricsUrl: string;
  readonly pool: Pool;
  readonly metrics: GatewayMetrics;
  /** Graceful stop: stop accepting, let in-flight requests finish (up to the grace period), close. */
  close(): Promise<void>;
}

/** Age past which an endpoint's metrics count as stale: the detector's own threshold when it has one. */
function stalenessMs(config: SluiceConfig): number {
  const ref = config.flowControl.saturationDetector.pluginRef;
  const spec = config.plugins.find((p) => p.name === ref);
  const v = spec?.parameters.metricsStalenessThreshold;
  if (typeof v === 'number') return v;
  return Math.max(1000, 4 * config.pool.metrics.interval) + config.pool.metrics.timeout;
}

function buildRuntime(
  config: SluiceConfig,
  registry: PluginRegistry,
  pool: Pool,
  clock: Clock,
  random: RandomSource,
  logger: Logger,
  metrics: GatewayMetrics,
): { runtime: ProxyRuntime; detector: SaturationDetector } {
  const built = buildScheduling(config, registry, { clock, random, pool, logger, plugins: new Map() });
  const detector = built.detector;
  const saturationNow = () => stageSaturation(detector, clock.now(), pool.endpoints).global;
  const plugin = <T>(name: string) => {
    const p = built.plugins.get(name);
    if (!p) throw new Error(`flow control references plugin '${name}', which is not instantiated`);
    return p as unknown as T;
  };
  const flowControl = featureEnabled(config, 'flowControl')
    ? new FlowController({
        config: config.flowControl,
        objectivePriorities: config.objectives.map((o) => o.priority),
        fairness: (name) => plugin<FairnessPolicy>(name),
        ordering: (name) => plugin<OrderingPolicy>(name),
        usageLimit: plugin<UsageLimitPolicy>(config.flowControl.usageLimitPolicyPluginRef),
        clock,
        saturation: saturationNow,
        poolEmpty: () => pool.endpoints.length === 0,
        nextSaturationChangeAt: () => detector.nextChangeAt?.(clock.now(), pool.endpoints),
        onDispatchCycle: (seconds) => metrics.dispatchCycle(seconds),
      })
    : undefined;
  const runtime: ProxyRuntime = {
    config,
    objectives: new Map(config.objectives.map((o) => [o.name, o.priority])),
    scheduler: built.scheduler,
    responseHooks: built.responseHooks,
    flowControl,
    admitWithoutQueue(priority) {
      // Flow control off (SPEC §6): sheddable traffic is refused while the fleet is saturated.
      if (priority < 0 && saturationNow() >= 1) {
        return new GatewayError(429, 'the pool is saturated and this request is sheddable', null, 'rejected-saturated');
      }
      return undefined;
    },
  };
  return { runtime, detector };
}

/** `loaded` as the config loader returns it; its warnings (deprecations, ignored blocks) are logged. */
export async function startGateway(loaded: LoadedConfig & { warnings?: ConfigProblem[] }, opts: GatewayOptions = {}): Promise<Gateway> {
  const config = loaded.config;
  const logger = opts.logger ?? silentLogger;
  const clock = opts.clock ?? systemClock;
  const random = opts.random ?? Math.random;
  const registry = opts.registry ?? builtinRegistry();

  for (const w of loaded.warnings ?? []) logger.warn({ config: formatProblem(w) }, 'config warning');
  const pool = new Pool(config.pool.endpoints, {
    onInvariantViolation: (message, ep) => logger.error({ endpoint: ep.name }, message),
  });
  const metrics = new GatewayMetrics({ poolName: config.pool.name, pool: () => pool, now: () => clock.now() });
  const { runtime, detector } = buildRuntime(config, registry, pool, clock, random, logger, metrics);
  const fc = runtime.flowControl;
  if (fc) {
    // Anything that could change the dispatch answer re-runs a (coalesced) dispatch cycle.
    pool.onChange(() => fc.kick());
    metrics.setFlowControlSource(() => fc.metricsSnapshot());
  }
  const stale = stalenessMs(config);
  metrics.setSaturationSource(() => {
    const s = stageSaturation(detector, clock.now(), pool.endpoints);
    const stages: Partial<Record<'prefill' | 'decode' | 'interleaved', number>> = {};
    if (s.prefill !== undefined) stages.prefill = s.prefill;
    if (s.decode !== undefined) stages.decode = s.decode;
    if (s.interleaved !== undefined) stages.interleaved = s.interleaved;
    return { stages, global: s.global, stale: s.stale, detector: detector.name };
  });

  const lastErrorLog = new Map<string, number>();
  const scraper = new Scraper(pool, {
    path: config.pool.metrics.path,
    intervalMs: config.pool.metrics.interval,
    timeoutMs: config.pool.metrics.timeout,
    clock,
    onError: (ep, err) => {
      metrics.scrapeError(ep.name);
      // One line per endpoint per 30 s at most: a dead endpoint must not flood the log.
      const now = clock.now();
      if ((lastErrorLog.get(ep.name) ?? -Infinity) + 30_000 <= now) {
        lastErrorLog.set(ep.name, now);
        logger.warn({ endpoint: ep.name, err }, 'metrics scrape failed');
      }
    },
  });

  const isReady = () => {
    const now = clock.now();
    return pool.endpoints.some((ep) => ep.metricsAge(now) <= stale);
  };
  const upstreams = new Upstreams(config.server.upstream);
  const models = new ModelsCache(() => pool.endpoints, upstreams, clock);
  const api = new ApiServer({
    runtime: () => runtime,
    pool,
    upstreams,
    metrics,
    models,
    logger,
    clock,
    isReady,
  });
  const admin = buildAdminServer({
    pool,
    clock,
    detector: () => detector,
    stalenessMs: () => stale,
    flowControl: () => (fc ? { enabled: true, ...fc.snapshot() } : { enabled: false }),
    metricsText: () => metrics.text(),
    metricsContentType: metrics.contentType,
    isReady: () => !api.draining && isReady(),
  });

  const host = opts.host ?? config.server.host;
  scraper.start();
  try {
    await new Promise<void>((resolve, reject) => {
      api.server.once('error', reject);
      api.server.listen(opts.port ?? config.server.port, host, () => {
        api.server.off('error', reject);
        resolve();
      });
    });
    await admin.listen({ port: opts.metricsPort ?? config.server.metricsPort, host });
  } catch (err) {
    await scraper.stop();
    api.server.close();
    await admin.close().catch(() => undefined);
    await upstreams.destroy();
    throw err;
  }
  const apiPort = (api.server.address() as AddressInfo).port;
  const metricsPort = (admin.server.address() as AddressInfo).port;
  const displayHost = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host.includes(':') ? `[${host}]` : host;
  logger.info({ apiPort, metricsPort, endpoints: pool.endpoints.length }, 'sluice gateway listening');

  let closing: Promise<void> | undefined;
  return {
    apiPort,
    metricsPort,
    apiUrl: `http://${displayHost}:${apiPort}`,
    metricsUrl: `http://${displayHost}:${metricsPort}`,
    pool,
    metrics,
    close() {
      closing ??= (async () => {
        api.draining = true;
        fc?.shutdown(); // everything still queued is answered 503 rejected-shutting-down
        api.server.close();
        api.server.closeIdleConnections();
        const grace = config.server.shutdownGracePeriod;
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([api.whenIdle(), new Promise<void>((r) => (timer = setTimeout(r, grace)))]);
        clearTimeout(timer);
        api.server.closeAllConnections();
        await scraper.stop();
        await upstreams.destroy();
        await admin.close();
        logger.info('sluice gateway stopped');
      })();
      return closing;
    },
  };
}
