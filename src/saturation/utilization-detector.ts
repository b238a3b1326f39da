/**
 * `utilization-detector` — saturation detector and filter (kinds: filter, saturationDetector).
 *
 * Saturation, per endpoint: `max(waiting' / queueDepthThreshold, kvUsage / kvCacheUtilThreshold)`
 * (the "roofline"). An endpoint whose metrics are missing or older than `metricsStalenessThreshold`
 * (strict >), or that refused a request since its last good scrape began (Sluice: the server is
 * gone, whatever its last page said), scores 1.0 — fail closed — unless `stalenessPolicy: ignore`,
 * which leaves it out of the mean (all left out → 0.0, so dispatch goes on, as llm-d #2492). Pool
 * value = unweighted mean; empty list = 1.0; never clamped.
 * `stale` in the reading counts stale endpoints under either policy (visibility, SPEC §6). While any
 * endpoint is stale, one warning naming them and their last scrape error is logged at most every 30 s.
 *
 * Filter (SPEC §7.2): keep an endpoint iff its metrics are fresh and
 * `waiting' < queueDepthThreshold × (1 + headroom)` and `kvUsage < kvCacheUtilThreshold × (1 + headroom)`;
 * if that would drop every candidate, all are returned (fail open).
 *
 * `waiting'` (Sluice, `countRecentDispatches`): the queue reckoned from the last scrape and what Sluice
 * did since (`Endpoint.estimatedWaiting`: requests finished since shorten it, requests sent since
 * fill the free slots the server has shown, then lengthen it); `false` → the scraped `waiting`, as
 * llm-d. Why: metrics are up to one interval old, and when the gate opens the queue is dispatched in
 * one go — read as scraped, the whole burst sees the same numbers, piles onto the prefix-affine
 * endpoints and holds the pool mean above 1 while other endpoints sit idle.
 *
 * `nextChangeAt` (for the flow controller's timer) = the earliest `metricsAt + metricsStalenessThreshold`
 * over currently-fresh endpoints: the reading can flip once that instant has passed.
 *
 * Parameters (defaults):
 * - `queueDepthThreshold` 5 — integer > 0
 * - `kvCacheUtilThreshold` 0.8 — in (0, 1]
 * - `metricsStalenessThreshold` "200ms" — duration string ("200ms", "1s", "1m30s") or milliseconds, > 0;
 *   the parsed parameters hold milliseconds (like every duration in the effective config)
 * - `headroom` 0 — ≥ 0, a fraction (0.2 = 20 %)
 * - `stalenessPolicy` "saturated" — `saturated` | `ignore` (Sluice addition)
 * - `countRecentDispatches` true — Sluice addition: `waiting'` above; false reads the scraped queue
 *   only, as llm-d does
 * - `inFlightLoadProducerName` — llm-d's; accepted and ignored (Sluice keeps the in-flight counts itself)
 */
import { z } from 'zod';
import { durationField } from '../config/schema.js';
import { formatDuration } from '../config/units.js';
import type { Endpoint, EndpointMetrics } from '../datalayer/endpoint.js';
import type { PluginDefinition, PluginLogger } from '../plugins/registry.js';
import type { CycleContext, Plugin, SchedulingRequest } from '../scheduling/framework.js';
import { headroomWarnings, type SaturationDetector, type SaturationReading } from './detector.js';

export const UTILIZATION_DETECTOR_TYPE = 'utilization-detector';

/** Minimum gap between two stale-endpoint warnings. */
const STALE_WARNING_INTERVAL_MS = 30_000;

export const utilizationDetectorParams = z.strictObject({
  queueDepthThreshold: z.number().int().positive().default(5),
  kvCacheUtilThreshold: z.number().gt(0).lte(1).default(0.8),
  metricsStalenessThreshold: durationField({ positive: true, msNumbers: true }).default(200),
  headroom: z.number().min(0).default(0),
  stalenessPolicy: z.enum(['saturated', 'ignore']).default('saturated'),
  countRecentDispatches: z.boolean().default(true),
  inFlightLoadProducerName: z.string().optional(),
});

export type UtilizationDetectorParams = z.infer<typeof utilizationDetectorParams>;

export class UtilizationDetector implements SaturationDetector {
  readonly type = UTILIZATION_DETECTOR_TYPE;
  readonly queueDepthThreshold: number;
  readonly kvCacheUtilThreshold: number;
  readonly stalenessMs: number;
  readonly ignoreStale: boolean;
  readonly countRecent: boolean;
  private readonly queueLimit: number;
  private readonly kvLimit: number;
  private lastStaleWarningAt = -Infinity;
  /** Endpoints named by the warning(s) of instant `lastStaleWarningAt`. */
  private warnedAtLast = new Set<string>();

  constructor(
    readonly name: string,
    params: UtilizationDetectorParams,
    private readonly logger?: PluginLogger,
  ) {
    this.queueDepthThreshold = params.queueDepthThreshold;
    this.kvCacheUtilThreshold = params.kvCacheUtilThreshold;
    this.stalenessMs = params.metricsStalenessThreshold;
    this.ignoreStale = params.stalenessPolicy === 'ignore';
    this.countRecent = params.countRecentDispatches;
    this.queueLimit = params.queueDepthThreshold * (1 + params.headroom);
    this.kvLimit = params.kvCacheUtilThreshold * (1 + params.headroom);
  }

  /** A reload: the stale-endpoint warning keeps its 30 s limit across it (each reload builds a new detector). */
  carryOver(previous: Plugin): void {
    if (!(previous instanceof UtilizationDetector)) return;
    this.lastStaleWarningAt = previous.lastStaleWarningAt;
    this.warnedAtLast = new Set(previous.warnedAtLast);
  }

  /** The queue length the formulas read: reckoned since the scrape, or as scraped (llm-d). */
  private waiting(endpoint: Endpoint, m: EndpointMetrics): number {
    return this.countRecent ? endpoint.estimatedWaiting() : m.waiting;
  }

  private isStale(endpoint: Endpoint, now: number): boolean {
    return endpoint.metrics === undefined || endpoint.connectFailure !== undefined || endpoint.metricsAge(now) > this.stalenessMs;
  }

  saturation(now: number, endpoints: readonly Endpoint[]): SaturationReading {
    if (endpoints.length === 0) return { value: 1, stale: 0 };
    // Stage-aware saturation reads each stage's endpoints in its own call at the same instant: each
    // call may add to the warning then, so stale endpoints of every stage are named, each once.
    const sameInstant = now === this.lastStaleWarningAt;
    const warnDue = sameInstant || now - this.lastStaleWarningAt >= STALE_WARNING_INTERVAL_MS;
    let toName: Endpoint[] | undefined;
    let sum = 0;
    let counted = 0;
    let stale = 0;
    for (const endpoint of endpoints) {
      const m = endpoint.metrics;
      if (m === undefined || this.isStale(endpoint, now)) {
        stale++;
        if (warnDue && !(sameInstant && this.warnedAtLast.has(endpoint.name))) (toName ??= []).push(endpoint);
        if (!this.ignoreStale) {
          sum += 1;
          counted++;
        }
        continue;
      }
      sum += Math.max(this.waiting(endpoint, m) / this.queueDepthThreshold, m.kvUsage / this.kvCacheUtilThreshold);
      counted++;
    }
    if (toName !== undefined && this.logger !== undefined) {
      if (!sameInstant) this.warnedAtLast.clear();
      this.lastStaleWarningAt = now;
      for (const e of toName) this.warnedAtLast.add(e.name);
      // One line for the calls of this turn (one per stage): logged once they are all done.
      if (this.staleToLog.length === 0) queueMicrotask(this.logStale);
      for (const e of toName) this.staleToLog.push(`${e.name} (${e.lastError ?? e.connectFailure ?? 'no recent scrape'})`);
    }
    // Nothing to average: an empty list reads saturated; under `ignore`, a list of only stale
    // endpoints reads 0 and dispatch goes on, as llm-d's policy does (#2492).
    return { value: counted > 0 ? sum / counted : this.ignoreStale && endpoints.length > 0 ? 0 : 1, stale };
  }

  private staleToLog: string[] = [];
  private readonly logStale = (): void => {
    const staleEndpoints = this.staleToLog;
    this.staleToLog = [];
    this.logger?.warn(
      { detector: this.name, staleEndpoints },
      this.ignoreStale
        ? 'endpoints with missing or stale metrics are left out of the saturation reading'
        : 'endpoints with missing or stale metrics are read as saturated',
    );
  };

  /**
   * The earliest time a currently-fresh endpoint's metrics turn stale: `metricsAt +
   * metricsStalenessThreshold` (the last instant it is still fresh — staleness is strict >, so it
   * reads stale at any later time); undefined when no endpoint is fresh. Lets the flow controller
   * re-evaluate when staleness flips the reading, with no scrape or request to trigger it.
   */
  nextChangeAt(now: number, endpoints: readonly Endpoint[]): number | undefined {
    let earliest: number | undefined;
    for (const endpoint of endpoints) {
      if (this.isStale(endpoint, now)) continue;
      const at = endpoint.metricsAt + this.stalenessMs;
      if (earliest === undefined || at < earliest) earliest = at;
    }
    return earliest;
  }

  filter(ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[]): Endpoint[] {
    const now = ctx.clock.now();
    const kept: Endpoint[] = [];
    for (const endpoint of endpoints) {
      if (this.isStale(endpoint, now)) continue;
      const m = endpoint.metrics!;
      if (this.waiting(endpoint, m) < this.queueLimit && m.kvUsage < this.kvLimit) kept.push(endpoint);
    }
    // Fail open: a fully saturated set is still better served than refused here; flow control gates.
    return kept.length === 0 ? endpoints.slice() : kept;
  }
}

export const utilizationDetectorDefinition: PluginDefinition<UtilizationDetectorParams> = {
  type: UTILIZATION_DETECTOR_TYPE,
  kinds: ['filter', 'saturationDetector'],
  params: utilizationDetectorParams,
  configWarnings(params, { metricsIntervalMs }) {
    // Metrics age up to one interval (plus the scrape) before the next lands: with the threshold no
    // longer than that, every endpoint reads stale, hence saturated, for part of every interval.
    if (params.stalenessPolicy !== 'saturated' || metricsIntervalMs < params.metricsStalenessThreshold) return headroomWarnings(params);
    return [
      ...headroomWarnings(params),
      {
        parameter: 'metricsStalenessThreshold',
        setting: ['pool', 'metrics', 'interval'],
        message:
          `pool.metrics.interval (${formatDuration(metricsIntervalMs)}) is not shorter than ${UTILIZATION_DETECTOR_TYPE} metricsStalenessThreshold ` +
          `(${formatDuration(params.metricsStalenessThreshold)}): every endpoint's metrics go stale before the next scrape lands, so each reads saturated ` +
          'and requests wait in the flow-control queue for a scrape. Scrape a few times per threshold (the defaults are 50ms and 200ms), ' +
          'raise the threshold, or set stalenessPolicy: ignore',
      },
    ];
  },
  create: (name, params, deps) => new UtilizationDetector(name, params, deps.logger),
};
