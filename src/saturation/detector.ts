/**
 * The saturation detector contract (SPEC §6, reference epp-flow-control §3.1).
 *
 * `saturation()` reads a set of endpoints as one number: < 1 is the fraction of capacity in use,
 * ≥ 1 is saturated, and values above 1 are the depth of oversubscription (never clamped). An empty
 * set reads 1.0 (fail closed). Every detector is also a scheduling Filter (SPEC §7.2): it drops
 * endpoints that are saturated on their own, but never empties the candidate list.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { PluginConfigWarning } from '../plugins/registry.js';
import type { Filter } from '../scheduling/framework.js';

export interface SaturationReading {
  /** ≥ 0; 1.0 is the gating set point. */
  value: number;
  /** Endpoints whose metrics were missing or stale at this evaluation (the stale-endpoints gauge). */
  stale: number;
}

export interface SaturationDetector extends Filter {
  saturation(now: number, endpoints: readonly Endpoint[]): SaturationReading;
  /**
   * Optional, for the flow controller's wake-up timer: the instant after which the reading may
   * change with no new input (e.g. fresh metrics going stale — staleness is strict >, so a timer
   * should fire strictly after it), or undefined when nothing is pending. Detectors whose reading
   * only changes on events (counters, scrapes) omit it.
   */
  nextChangeAt?(now: number, endpoints: readonly Endpoint[]): number | undefined;
}

export const isSaturationDetector = (p: object): p is SaturationDetector =>
  typeof (p as SaturationDetector).saturation === 'function' && typeof (p as SaturationDetector).filter === 'function';

/** A detector's `headroom` above 1 was most likely meant as a percentage (a config warning at that key). */
export function headroomWarnings(params: { headroom: number }): PluginConfigWarning[] {
  return params.headroom > 1 ? [{ parameter: 'headroom', message: `headroom is a fraction (0.2 = 20%), not a percentage: ${params.headroom} allows ${params.headroom * 100}% over the thresholds` }] : [];
}
