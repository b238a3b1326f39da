/**
 * Stage-aware saturation (SPEC §6): endpoints are partitioned by `endpoint.stage` into prefill,
 * decode and interleaved; the detector runs once per non-empty stage and the effective (global)
 * value is the max. Empty stages are skipped (not read as saturated); encode-only endpoints
 * (stage null) take part in no stage. When every stage is empty the detector reads the whole list,
 * so an empty pool is 1.0. Values are never clamped.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { SaturationDetector } from './detector.js';

export interface StageSaturation {
  prefill?: number;
  decode?: number;
  interleaved?: number;
  /** max over non-empty stages (or the whole-list reading when all stages are empty). */
  global: number;
  /** Stale endpoints summed over the evaluated stages. */
  stale: number;
}

export function stageSaturation(
  detector: SaturationDetector,
  now: number,
  endpoints: readonly Endpoint[],
): StageSaturation {
  const prefill: Endpoint[] = [];
  const decode: Endpoint[] = [];
  const interleaved: Endpoint[] = [];
  for (const endpoint of endpoints) {
    switch (endpoint.stage) {
      case 'prefill':
        prefill.push(endpoint);
        break;
      case 'decode':
        decode.push(endpoint);
        break;
      case 'interleaved':
        interleaved.push(endpoint);
        break;
      default:
        break; // encode-only: no stage
    }
  }

  const out: StageSaturation = { global: -Infinity, stale: 0 };
  const stages = [
    ['prefill', prefill],
    ['decode', decode],
    ['interleaved', interleaved],
  ] as const;
  for (const [stage, members] of stages) {
    if (members.length === 0) continue;
    const r = detector.saturation(now, members);
    out[stage] = r.value;
    out.stale += r.stale;
    if (r.value > out.global) out.global = r.value;
  }
  if (out.global === -Infinity) {
    const r = detector.saturation(now, endpoints);
    out.global = r.value;
    out.stale = r.stale;
  }
  return out;
}
