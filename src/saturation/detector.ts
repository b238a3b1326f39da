/**
 * The saturation detector contract (SPEC §6, reference epp-flow-control §3.1).
 *
 * `saturation()` reads a set of endpoints as one number: < 1 is the fraction of capacity in use,
 * ≥ 1 is saturated, and values above 1 are the depth of oversubscription (never clamped). An empty
 * set reads 1.0 (fail closed). Every detector is also a scheduling Filter (SPEC §7.2): it drops
 * endpoints that are saturated on their own, but never empties the candidate list.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Filter } from '../scheduling/framework.js';

export interface SaturationReading {
  /** ≥ 0; 1.0 is the gating set point. */
  value: number;
  /** Endpoints whose metrics were missing or stale at this evaluation (the stale-endpoints gauge). */
  stale: number;
}

export interface SaturationDetector extends Filter {
  saturation(now: number, endpoints: readonly Endpoint[]): SaturationReading;
}

export const isSaturationDetector = (p: object): p is SaturationDetector =>
  typeof (p as SaturationDetector).saturation === 'function' && typeof (p as SaturationDetector).filter === 'function';
