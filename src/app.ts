/**
 * Composition root: an effective configuration in, a running gateway out (API port + metrics port,
 * scraper, scheduler, metrics), with a graceful stop.
 */
import net, { type AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import { buildAdminServer } from './admin/server.js';
import type { LoadedConfig, SluiceConfig } from './config/types.js';
import { formatProblem, type ConfigProblem } from './config/load.js';
import { effectiveConfigDigest } from './config/print.js';
import { Pool } from './datalayer/pool.js';
import type { EndpointSpec } from './datalayer/endpoint.js';
import { Scraper, silenceWindowMs } from './datalayer/scraper.js';
import { GatewayMetrics, type PrefixIndexerSnapshot, type SaturationSnapshot } from './metrics/metrics.js';
import { builtinRegistry } from './plugins/builtin.js';
import type { PluginRegistry } from './plugins/registry.js';
import { GatewayError } from './proxy/errors.js';
import { ModelsCache } from './proxy/models.js';
import type { ProxyRuntime } from './proxy/runtime.js';
import { ApiServer } from './proxy/server.js';
import { Upstreams } from './proxy/upstreams.js';
import type { SaturationDetector } from './saturation/detector.js';
import { globalSaturation, stageSaturation } from './saturation/stages.js';
import { featureEnabled } from './config/defaults.js';
import { FlowController } from './flowcontrol/controller.js';
import type { FairnessPolicy, OrderingPolicy, UsageLimitPolicy } from './flowcontrol/policies/types.js';
import type { Plugin } from './scheduling/framework.js';
import { buildScheduling } from './scheduling/build.js';
import { isPrefixIndexer } from './scheduling/prompt-load.js';
import { systemClock, type Clock, type RandomSource } from './util/clock.js';
import { silentLogger } from './util/logger.js';
import { StoredResponses } from './proxy/stored-responses.js';

/** How long the 503s written at the end of the grace period may take to leave before every connection is cut. */
const FINAL_ANSWERS_LINGER_MS = 1000;
/** Once the last answer of the drain ended, how long no new request must arrive before every connection is cut. */
const DRAIN_QUIET_MS = 300;

/**
 * Resolves once no request has begun for `quietMs` and none is being handled, or at `deadline`.
 * An answer whose headers left before the drain said keep-alive: its client may send its next
 * request on that connection the moment the answer ends. Cut then, it would get a reset that cannot
 * tell it whether the request ran; received, it gets 503 rejected-shutting-down and `Connection: close`.
 */
async function quietPeriod(api: ApiServer, quietMs: number, deadline: number): Promise<void> {
  for (let left = deadline - Date.now(); left > 0; left = deadline - Date.now()) {
    const seen = api.begun;
    await new Promise((r) => setTimeout(r, Math.min(quietMs, left)));
    if (api.begun === seen && api.active === 0) return;
    await settledWithin(api.whenIdle(), Math.max(0, deadline - Date.now()));
  }
}

/** Waits for `p`, but `ms` at most. */
async function settledWithin(p: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p, new Promise<void>((r) => (timer = setTimeout(r, ms)))]);
  clearTimeout(timer);
}

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
  /** The configuration in force. */
  readonly config: SluiceConfig;
  /**
   * Applies a new, already validated configuration (SPEC §3.7): endpoints added/removed (in-flight
   * requests to a removed endpoint finish), objectives, plugins and profiles replaced, queued
   * requests kept. Ports need a restart (logged).
   */
  reload(next: LoadedConfig & { warnings?: ConfigProblem[] }): Promise<void>;
  /** Graceful stop: stop accepting, let in-flight requests finish (up to the grace period), close. */
  close(): Promise<void>;
}

/**
 * Age of the freshest endpoint metrics past which `/ready` answers 503: a window of its own, not the
 * detector's threshold (200 ms by default). A model server busy enough to take 250 ms over `/metrics`
 * is stale to the detector for part of every scrape; a readiness probe reading that would take every
 * gateway replica out of its Service at once, and clients would get connection errors instead of a
 * queued request or a 429/503 with a reason. Not ready means no model server answered a scrape
 * for several seconds.
 */
function readinessWindowMs(config: SluiceConfig, staleMs: number): number {
  return Math.max(silenceWindowMs(config.pool.metrics), staleMs);
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
  previous?: { plugins: ReadonlyMap<string, Plugin>; queue: FlowController | undefined; replacedEndpoints: ReadonlySet<string> },
): { runtime: ProxyRuntime; detector: SaturationDetector; plugins: ReadonlyMap<string, Plugin> } {
  const decisionCounter = metrics.decisionCounter.bind(metrics);
  const prefixIndexerMatch = metrics.prefixIndexerMatch.bind(metrics);
  const built = buildScheduling(
    config,
    registry,
    { clock, random, pool, logger, plugins: new Map(), decisionCounter, prefixIndexerMatch },
    previous?.plugins,
    previous?.replacedEndpoints,
  );
  const previousQueue = previous?.queue;
  const detector = built.detector;
  // Read over the endpoints requests may go to: one outlier detection set aside neither holds the
  // gate closed (a P/D pool whose prefill tier is ejected serves decode-only) nor counts as room.
  const saturationNow = () => {
    const now = clock.now();
    return globalSaturation(detector, now, pool.eligible(now));
  };
  const plugin = <T>(name: string) => {
    const p = built.plugins.get(name);
    if (!p) throw new Error(`flow control references plugin '${name}', which is not instantiated`);
    return p as unknown as T;
  };
  const flowControl = featureEnabled(config, 'flowControl')
    ? new FlowController({
        config: config.flowControl,
        objectivePriorities: config.objectives.map((o) => o.priority),
        // With a reload, the priorities still queued keep a band too (the handover moves them).
        carriedPriorities: previousQueue?.queuedPriorities() ?? [],
        fairness: (name) => plugin<FairnessPolicy>(name),
        ordering: (name) => plugin<OrderingPolicy>(name),
        usageLimit: plugin<UsageLimitPolicy>(config.flowControl.usageLimitPolicyPluginRef),
        clock,
        saturation: saturationNow,
        poolEmpty: () => pool.endpoints.length === 0,
        nextSaturationChangeAt: () => {
          const now = clock.now();
          const metricsTurn = detector.nextChangeAt?.(now, pool.eligible(now));
          const ejectionEnds = pool.nextReturnTime(now);
          return metricsTurn === undefined || (ejectionEnds !== undefined && ejectionEnds < metricsTurn) ? ejectionEnds : metricsTurn;
        },
        onDispatchCycle: (seconds) => metrics.dispatchCycle(seconds),
        onAffinityOvertake: () => metrics.affinityOvertake(),
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
  return { runtime, detector, plugins: built.plugins };
}

/** What a reload replaces as a whole; the request path reads it once per request. */
interface Live {
  config: SluiceConfig;
  runtime: ProxyRuntime;
  detector: SaturationDetector;
  /** Its plugins by name: a reload's new plugins take over what these learned. */
  plugins: ReadonlyMap<string, Plugin>;
  staleMs: number;
  /** `/ready` needs an endpoint whose metrics are at most this old (readinessWindowMs). */
  readyMs: number;
}

/** The prefix indexes of the plugins in force, for `llm_d_epp_prefix_indexer_size`. */
function prefixIndexers(plugins: ReadonlyMap<string, Plugin>): PrefixIndexerSnapshot[] {
  const out: PrefixIndexerSnapshot[] = [];
  for (const p of plugins.values()) if (isPrefixIndexer(p)) out.push({ name: p.name, type: p.type, size: p.prefixIndexerSize() });
  return out;
}

/** Names of endpoints a new configuration puts at another address or port (what was learned of them is not the new server's). */
function movedEndpoints(before: SluiceConfig, after: SluiceConfig): Set<string> {
  const was = new Map(before.pool.endpoints.map((e) => [e.name, e]));
  const moved = new Set<string>();
  for (const e of after.pool.endpoints) {
    const old = was.get(e.name);
    if (old !== undefined && (old.address !== e.address || old.port !== e.port)) moved.add(e.name);
  }
  return moved;
}

/** Settings a running gateway cannot change: a reload that touches them is applied otherwise and logged. */
function restartOnlyChanges(a: SluiceConfig, b: SluiceConfig, opts: GatewayOptions): string[] {
  const changed: string[] = [];
  if (a.server.host !== b.server.host) changed.push('server.host');
  // A port set on the command line stays so on a restart: the file's value does not apply either way.
  if (a.server.port !== b.server.port && opts.port === undefined) changed.push('server.port');
  if (a.server.metricsPort !== b.server.metricsPort && opts.metricsPort === undefined) changed.push('server.metricsPort');
  if (a.server.requestHeadersTimeout !== b.server.requestHeadersTimeout) changed.push('server.requestHeadersTimeout');
  if (a.server.requestTimeout !== b.server.requestTimeout) changed.push('server.requestTimeout');
  return changed;
}

/** `loaded` as the config loader returns it; its warnings (deprecations, ignored blocks) are logged. */
export async function startGateway(loaded: LoadedConfig & { warnings?: ConfigProblem[] }, opts: GatewayOptions = {}): Promise<Gateway> {
  const logger = opts.logger ?? silentLogger;
  const clock = opts.clock ?? systemClock;
  const random = opts.random ?? Math.random;
  const registry = opts.registry ?? builtinRegistry();

  for (const w of loaded.warnings ?? []) logger.warn({ config: formatProblem(w) }, 'config warning');
  // The metrics read the pool only when scraped.
  const metrics = new GatewayMetrics({ poolName: loaded.config.pool.name, pool: () => pool, now: () => clock.now() });
  /** The sets of models already logged: a page that flips between models would log one at every flip. */
  const mixesLogged = new Set<string>();
  const pool = new Pool(endpointSpecs(loaded.config), {
    onInvariantViolation: (message, ep) => logger.error({ endpoint: ep.name }, message),
    outlierPolicy: loaded.config.server.upstream.outlierDetection,
    silenceMs: silenceWindowMs(loaded.config.pool.metrics),
    onServedModels: (servedBy) => {
      if (servedBy.size < 2) return;
      const mix = JSON.stringify([...servedBy.keys()].sort());
      if (mixesLogged.has(mix)) return;
      if (mixesLogged.size >= 64) mixesLogged.clear();
      mixesLogged.add(mix);
      logger.warn(
        { models: Object.fromEntries(servedBy) },
        "the pool's servers serve several models (the endpoints listed: those scraped so far, /debug/pool has all): each request goes only to the servers of its model, but flow control reads each stage's saturation over all of them, so the models blur each other's reading (give each model a pool of its own)",
      );
    },
    onOutlier: (ep, event) => {
      switch (event.kind) {
        case 'ejected':
          metrics.endpointEjection(ep.name);
          logger.warn({ endpoint: ep.name, ejectedForMs: event.ms, reason: event.reason }, 'endpoint ejected: it failed request after request, so it gets none for a while (server.upstream.outlierDetection)');
          break;
        case 'returned':
          logger.info({ endpoint: ep.name }, 'endpoint back from ejection: it takes requests again (one more failure ejects it again, for longer)');
          break;
        case 'stalled':
          logger.warn({ endpoint: ep.name, reason: event.reason }, 'endpoint stalled: it owes work and its metrics page has not changed, so it gets no requests until the page changes or it owes none (server.upstream.outlierDetection.stallTimeout)');
          break;
        case 'progressing':
          logger.info({ endpoint: ep.name }, 'endpoint no longer stalled: it takes requests again');
          break;
      }
    },
  });
  const startDigest = effectiveConfigDigest(loaded.config);
  metrics.configInForce(startDigest);
  const build = (config: SluiceConfig, previous?: Live): Live => {
    const before = previous && { plugins: previous.plugins, queue: previous.runtime.flowControl, replacedEndpoints: movedEndpoints(previous.config, config) };
    const { runtime, detector, plugins } = buildRuntime(config, registry, pool, clock, random, logger, metrics, before);
    const staleMs = stalenessMs(config);
    return { config, runtime, detector, plugins, staleMs, readyMs: readinessWindowMs(config, staleMs) };
  };
  let live = build(loaded.config);
  /** The labelled counters the configuration in force can move, started at 0. */
  const countFromZero = (l: Live): void => {
    metrics.flowControlPriorities(l.runtime.flowControl === undefined ? [] : [0, ...l.config.objectives.map((o) => o.priority)]);
    const connector = l.runtime.scheduler.handler.disaggregatesWith;
    metrics.pdConnectors(connector === undefined ? [] : [connector]);
  };
  countFromZero(live);

  // Anything that could change the dispatch answer re-runs a (coalesced) dispatch cycle.
  pool.onChange(() => live.runtime.flowControl?.kick());
  metrics.setFlowControlSource(() => live.runtime.flowControl?.metricsSnapshot());
  metrics.setPrefixIndexerSource(() => prefixIndexers(live.plugins));
  metrics.setFreshWindow(() => live.readyMs);
  let lastSourceErrorLog = -Infinity;
  const saturationNow = (): SaturationSnapshot | undefined => {
    let s: ReturnType<typeof stageSaturation>;
    try {
      const now = clock.now();
      s = stageSaturation(live.detector, now, pool.eligible(now));
    } catch (err) {
      // A detector that throws must not take /metrics down with it: its gauges are left out.
      if (clock.now() - lastSourceErrorLog >= 30_000) {
        lastSourceErrorLog = clock.now();
        logger.error({ err, detector: live.detector.name }, 'the saturation detector failed; its gauges are left out of /metrics');
      }
      return undefined;
    }
    const stages: Partial<Record<'prefill' | 'decode' | 'interleaved', number>> = {};
    if (s.prefill !== undefined) stages.prefill = s.prefill;
    if (s.decode !== undefined) stages.decode = s.decode;
    if (s.interleaved !== undefined) stages.interleaved = s.interleaved;
    return { stages, global: s.global, stale: s.stale, detector: live.detector.name };
  };
  metrics.setSaturationSource(saturationNow);

  const lastErrorLog = new Map<string, number>();
  /** When each endpoint's current run of failed scrapes began (for the recovery line). */
  const failingSince = new Map<string, number>();
  const newScraper = (config: SluiceConfig) =>
    new Scraper(pool, {
      path: config.pool.metrics.path,
      intervalMs: config.pool.metrics.interval,
      timeoutMs: config.pool.metrics.timeout,
      maxBytes: config.pool.metrics.maxBytes,
      clock,
      onError: (ep, err) => {
        metrics.scrapeError(ep.name);
        // One line per endpoint per 30 s at most, recoveries included: neither a dead endpoint nor
        // one whose /metrics flaps between good and bad may flood the log.
        const now = clock.now();
        if (!failingSince.has(ep.name)) failingSince.set(ep.name, now);
        if ((lastErrorLog.get(ep.name) ?? -Infinity) + 30_000 <= now) {
          lastErrorLog.set(ep.name, now);
          logger.warn({ endpoint: ep.name, err }, 'metrics scrape failed');
        }
      },
      onRecovered: (ep) => {
        const since = failingSince.get(ep.name);
        failingSince.delete(ep.name);
        // Only the recovery of a run whose failure was logged is news.
        if (since === undefined || (lastErrorLog.get(ep.name) ?? -Infinity) < since) return;
        logger.info({ endpoint: ep.name, failingMs: clock.now() - since }, 'metrics scrape recovered');
      },
    });
  let scraper = newScraper(live.config);

  const isReady = () => {
    const now = clock.now();
    return pool.endpoints.some((ep) => ep.metricsAge(now) <= live.readyMs);
  };
  const upstreams = new Upstreams(live.config.server.upstream);
  const models = new ModelsCache(() => pool.endpoints, upstreams, clock);
  const storedResponses = new StoredResponses(live.config.server.storedResponses);
  metrics.setStoredResponsesSource(() => storedResponses.size);
  const api = new ApiServer({
    runtime: () => live.runtime,
    pool,
    upstreams,
    metrics,
    models,
    logger,
    clock,
    isReady,
    saturation: saturationNow,
    storedResponses,
  });
  metrics.setReceivingSource(() => ({ bodies: api.receivingBodies, bytes: api.uploads.bytes }));
  const admin = buildAdminServer({
    pool,
    clock,
    detector: () => live.detector,
    stalenessMs: () => live.staleMs,
    flowControl: () => {
      const fc = live.runtime.flowControl;
      return fc ? { enabled: true, ...fc.snapshot() } : { enabled: false };
    },
    requests: () => api.inFlightRequests(),
    metricsText: () => metrics.text(),
    metricsContentType: metrics.contentType,
    isReady: () => !api.draining && isReady(),
    profiling: () => live.config.server.profiling,
  });

  const host = opts.host ?? live.config.server.host;
  scraper.start();
  try {
    await new Promise<void>((resolve, reject) => {
      api.server.once('error', reject);
      api.server.listen(opts.port ?? live.config.server.port, host, () => {
        api.server.off('error', reject);
        resolve();
      });
    });
    await admin.listen({ port: opts.metricsPort ?? live.config.server.metricsPort, host });
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
  // Said at start: llm-d and GIE leave flow control off, so a team moving over should see it is on.
  const flowControl = featureEnabled(live.config, 'flowControl') ? 'on' : 'off';
  logger.info({ apiPort, metricsPort, endpoints: pool.endpoints.length, flowControl, digest: startDigest }, 'sluice gateway listening');

  let closing: Promise<void> | undefined;
  return {
    apiPort,
    metricsPort,
    apiUrl: `http://${displayHost}:${apiPort}`,
    metricsUrl: `http://${displayHost}:${metricsPort}`,
    pool,
    metrics,
    get config() {
      return live.config;
    },
    async reload(next) {
      if (closing) throw new Error('the gateway is shutting down');
      const previous = live;
      const config = next.config;
      // Against what the gateway started with: a later reload still says what awaits a restart.
      const restartOnly = restartOnlyChanges(loaded.config, config, opts);
      if (restartOnly.length > 0) logger.warn({ keys: restartOnly }, 'config reload: these settings need a restart; the rest is applied');
      // Build first: if the new runtime cannot be built, nothing has changed yet.
      const nextLive = build(config, previous);
      const { removed } = pool.setEndpoints(endpointSpecs(config));
      // A removed (or moved) endpoint's scrape failures are history: a later one is news again.
      for (const ep of removed) {
        failingSince.delete(ep.name);
        lastErrorLog.delete(ep.name);
      }
      // Before the queue is handed over: what it dispatches then goes out with the new upstream
      // settings, and to a new endpoint through its own pooled connections.
      upstreams.configure(config.server.upstream);
      pool.setOutlierPolicy(config.server.upstream.outlierDetection, clock.now());
      pool.setSilenceWindow(silenceWindowMs(config.pool.metrics));
      upstreams.retain(pool.endpoints); // pools of removed endpoints close once their requests finish
      storedResponses.resize(config.server.storedResponses);
      live = nextLive;
      metrics.configRestartNeeded(restartOnly.length > 0);
      const digest = effectiveConfigDigest(config);
      metrics.configInForce(digest);
      const [oldQueue, newQueue] = [previous.runtime.flowControl, live.runtime.flowControl];
      if (oldQueue && newQueue) oldQueue.handOver(newQueue);
      else oldQueue?.dispatchAll(); // flow control turned off: nothing may stay queued
      models.invalidate();
      metrics.setPoolName(config.pool.name);
      countFromZero(live);
      const m = (c: SluiceConfig) => c.pool.metrics;
      const [before, after] = [m(previous.config), m(config)];
      if (before.interval !== after.interval || before.timeout !== after.timeout || before.path !== after.path || before.maxBytes !== after.maxBytes) {
        await scraper.stop();
        if (closing) return; // shut down meanwhile: no new scraper
        scraper = newScraper(config);
        scraper.start();
      }
      for (const w of next.warnings ?? []) logger.warn({ config: formatProblem(w) }, 'config warning');
      logger.info({ endpoints: pool.endpoints.length, file: next.file, digest }, 'config reloaded');
    },
    close() {
      closing ??= (async () => {
        // Readiness turns 503 first; queued requests are answered 503 rejected-shutting-down; new
        // connections are refused; in-flight requests may finish within the grace period.
        api.startDrain();
        live.runtime.flowControl?.shutdown();
        // Only the listener stops: http.Server.close() would also close every idle keep-alive
        // connection, and a client sending its next request on one as it closed would get a reset
        // that cannot tell it whether the request ran. Kept open, such a request gets 503
        // rejected-shutting-down with `Connection: close`.
        net.Server.prototype.close.call(api.server);
        const grace = live.config.server.shutdownGracePeriod;
        const deadline = Date.now() + grace;
        const answering = api.active > 0;
        await settledWithin(api.whenIdle(), grace);
        const ended = api.endInFlight('the gateway is shutting down and its shutdown grace period is over');
        if (ended > 0) {
          logger.warn({ requests: ended, shutdownGracePeriodMs: grace }, 'shutdown grace period over: requests still in flight were ended with 503');
          // A moment for those reasons to reach clients that read, before every connection is cut.
          await settledWithin(api.whenIdle(), FINAL_ANSWERS_LINGER_MS);
        } else if (answering) await quietPeriod(api, DRAIN_QUIET_MS, deadline);
        api.server.closeAllConnections();
        api.server.close(); // http.Server's own clean-up (its connection-checking timer)
        api.refusals.close();
        api.upstreamFailures.close();
        await scraper.stop();
        await upstreams.destroy();
        await admin.close();
        logger.info('sluice gateway stopped');
      })();
      return closing;
    },
  };
}

/** The pool's endpoints as the Pool takes them: each with the engine type of the unlabelled. */
function endpointSpecs(config: SluiceConfig): EndpointSpec[] {
  const { defaultEngine } = config.pool.metrics;
  return config.pool.endpoints.map((e) => ({ ...e, defaultEngine }));
}
