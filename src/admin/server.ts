/**
 * The metrics port (SPEC §2): /metrics (Prometheus text), /health, /ready and /debug/pool — a JSON
 * view of every endpoint with labels, role, stage, last metrics, age, stale flag and in-flight count,
 * plus per-stage saturation — /debug/flowcontrol (bands, flows, queue lengths/bytes, ceilings),
 * /debug/requests (the requests in flight, oldest first) and /debug/profile/{cpu,heap}?seconds=N
 * (profiling.ts). Fastify: not on the per-request path, and its routing/404 handling is what we
 * want here.
 */
import Fastify, { type FastifyInstance, type FastifyReply } from 'fastify';
import type { Pool } from '../datalayer/pool.js';
import { answerClientError, errorBody } from '../proxy/errors.js';
import type { SaturationDetector } from '../saturation/detector.js';
import { stageSaturation } from '../saturation/stages.js';
import type { Clock } from '../util/clock.js';
import { MAX_PROFILE_SECONDS, ProfileBusyError, Profiler } from './profiling.js';

export interface AdminDeps {
  pool: Pool;
  clock: Clock;
  detector: () => SaturationDetector;
  /** Age past which an endpoint's metrics are stale (ms). */
  stalenessMs: () => number;
  metricsText: () => Promise<string>;
  /** JSON for /debug/flowcontrol. */
  flowControl: () => object;
  /** JSON for /debug/requests. */
  requests: () => object;
  metricsContentType: string;
  isReady: () => boolean;
  /** server.profiling of the configuration in force: off, the profile routes answer 404. */
  profiling: () => boolean;
}

export function buildAdminServer(deps: AdminDeps): FastifyInstance {
  const app = Fastify({
    logger: false,
    // At the end of a shutdown every connection goes, not only idle ones: a client that connected
    // and sent nothing (or half its headers) would otherwise hold the process past its grace period.
    forceCloseConnections: true,
    // Fastify's own answers to a bad URL or malformed HTTP are not §5-shaped: these are.
    frameworkErrors: (err, _req, reply) => {
      void sendJsonError(reply as FastifyReply, 400, err.message);
    },
    clientErrorHandler: answerClientError,
  });
  app.get('/metrics', async (_req, reply) => {
    reply.header('content-type', deps.metricsContentType);
    return deps.metricsText();
  });
  app.get('/health', async () => ({ status: 'ok' }));
  app.get('/ready', async (_req, reply) => {
    const ready = deps.isReady();
    reply.code(ready ? 200 : 503);
    return { status: ready ? 'ready' : 'not ready' };
  });
  app.get('/debug/pool', async () => debugPool(deps));
  app.get('/debug/flowcontrol', async () => deps.flowControl());
  app.get('/debug/requests', async () => deps.requests());
  const profiler = new Profiler();
  // A drain does not wait out a profile: it ends, and its answer has what was sampled.
  app.addHook('preClose', async () => profiler.stopAll());
  for (const kind of ['cpu', 'heap'] as const) {
    // No HEAD twin: it would take a whole profile to answer nothing.
    app.get(`/debug/profile/${kind}`, { exposeHeadRoute: false }, async (req, reply) => {
      if (!deps.profiling()) return sendJsonError(reply, 404, `profiling is off (server.profiling: false): no route for ${req.url}`);
      const raw = (req.query as Record<string, unknown>).seconds ?? '10';
      const seconds = typeof raw === 'string' && raw.trim() !== '' ? Number(raw) : NaN;
      if (!(seconds > 0 && seconds <= MAX_PROFILE_SECONDS)) {
        return sendJsonError(reply, 400, `seconds must be a number in (0, ${MAX_PROFILE_SECONDS}], got '${String(raw)}'`);
      }
      let profile: object;
      // A client that hangs up frees the profiler for the next one.
      const gone = new AbortController();
      reply.raw.once('close', () => gone.abort());
      try {
        profile = await profiler.take(kind, seconds, gone.signal);
      } catch (err) {
        if (!(err instanceof ProfileBusyError)) throw err;
        return sendJsonError(reply, 409, err.message);
      }
      const stamp = new Date().toISOString().replace(/[:.]/g, '-');
      reply.header('content-type', 'application/json');
      reply.header('content-disposition', `attachment; filename="sluice-${stamp}.${kind === 'cpu' ? 'cpuprofile' : 'heapprofile'}"`);
      return profile;
    });
  }
  app.setNotFoundHandler((req, reply) => {
    void sendJsonError(reply, 404, `no route for ${req.method} ${req.url}`);
  });
  app.setErrorHandler((err: Error & { statusCode?: number }, _req, reply) => {
    // A client's mistake Fastify caught (a body it cannot parse, one too large) keeps its 4xx.
    const status = err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 500;
    void sendJsonError(reply, status, err.message);
  });
  return app;
}

/** A §5 error answer on the metrics port. */
function sendJsonError(reply: FastifyReply, status: number, message: string): FastifyReply {
  return reply.code(status).header('content-type', 'application/json').send(errorBody(status, message));
}

export function debugPool(deps: Pick<AdminDeps, 'pool' | 'clock' | 'detector' | 'stalenessMs'>) {
  const now = deps.clock.now();
  const stalenessMs = deps.stalenessMs();
  const endpoints = deps.pool.endpoints.map((ep) => {
    const age = ep.metricsAge(now);
    return {
      name: ep.name,
      address: ep.address,
      port: ep.port,
      labels: ep.labels,
      role: ep.role || 'decode (unlabelled)',
      stage: ep.stage,
      // The model its pages name (model_name): with several in the pool, requests go to their model's servers.
      model: ep.servedModel ?? null,
      metrics: ep.metrics ?? null,
      metricsAgeSeconds: Number.isFinite(age) ? age / 1000 : null,
      stale: !(age <= stalenessMs) || ep.connectFailure !== undefined,
      lastScrapeError: ep.lastError ?? null,
      // A request could not connect since the last good scrape began: read as stale until the next.
      connectFailure: ep.connectFailure ?? null,
      scrapeErrors: ep.scrapeErrors,
      // Its scrapes have got no answer at all (time-outs, refused) for this long: past the silence
      // window it is silent, and what it holds is given up on (outlierDetection.rescueInFlight).
      unansweredSeconds: ep.unansweredSince === undefined ? null : (now - ep.unansweredSince) / 1000,
      // Set aside for failing (server.upstream.outlierDetection): no requests until it runs out.
      ejected: ep.ejectedUntil > now ? { secondsLeft: (ep.ejectedUntil - now) / 1000, reason: ep.ejectedFor ?? null } : null,
      // Failed requests, and ejections, since its last whole 2xx answer (after an ejection it takes one request at a time until then).
      failureStreak: ep.failureStreak,
      ejections: ep.ejections,
      // Back from an ejection and not yet answered 2xx: one request at a time (its probe).
      probation: deps.pool.onProbation(ep),
      // It owes work and its metrics page has not changed for stallTimeout: no requests until it changes.
      stalled: ep.stalledFor ?? null,
      inFlight: ep.inFlight,
      // Uncached prompt tokens sent to it whose answer has not begun (token-load-scorer, affinity filter).
      inFlightTokens: ep.inFlightTokens,
      // What the detector and queue-scorer read (configuration §5): null until known.
      slots: ep.shownSlots() || null,
      // Until then, the slow start's assumption (configuration §5, "starts slowly").
      slowStartSlots: ep.observedSlots > 0 ? null : ep.slowStartSlots(),
      reckonedWaiting: ep.metrics ? ep.estimatedWaiting() : null,
      queueAhead: ep.metrics ? ep.queueAhead() : null,
    };
  });
  // As flow control reads it: over the endpoints outlier detection has not set aside.
  const s = stageSaturation(deps.detector(), now, deps.pool.eligible(now));
  return {
    endpoints,
    saturation: { prefill: s.prefill ?? null, decode: s.decode ?? null, interleaved: s.interleaved ?? null, global: s.global },
    staleEndpoints: s.stale,
  };
}
