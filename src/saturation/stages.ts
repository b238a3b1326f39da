/**
 * Stage-aware saturation (SPEC §6): endpoints are partitioned by `endpoint.stage` into prefill,
 * decode and interleaved; the detector runs once per non-empty stage and the effective (global)
 * value is the max. Empty stages are skipped (not read as saturated); encode-only endpoints
 * (stage null) take part in no stage. When every stage is empty the detector reads the whole list,
 * so an empty pool is 1.0. Values are never clamped.
 */
import type { Endpoint, Stage } from '../datalayer/endpoint.js';
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

type StagePartition = ReadonlyArray<readonly [Stage, readonly Endpoint[]]>;

/**
 * The non-empty stages of an endpoint list. The pool's list is frozen and replaced whenever the set
 * or an endpoint's labels (so its stage) change, so the partition is computed once per list:
 * flow control reads saturation on every dispatch and must not re-partition (or allocate) each time.
 */
const partitions = new WeakMap<readonly Endpoint[], StagePartition>();

function partition(endpoints: readonly Endpoint[]): StagePartition {
  let parts = partitions.get(endpoints);
  if (parts !== undefined) return parts;
  const byStage = new Map<Stage, Endpoint[]>([
    ['prefill', []],
    ['decode', []],
    ['interleaved', []],
  ]);
  for (const endpoint of endpoints) if (endpoint.stage !== null) byStage.get(endpoint.stage)?.push(endpoint);
  parts = [...byStage].filter(([, members]) => members.length > 0);
  if (Object.isFrozen(endpoints)) partitions.set(endpoints, parts);
  return parts;
}

/** A stage whose reading is NaN (a detector bug) saturates the gate rather than vanishing from the max. */
function failClosed(value: number): number {
  return Number.isNaN(value) ? Infinity : value;
}

export function stageSaturation(
  detector: SaturationDetector,
  now: number,
  endpoints: readonly Endpoint[],
): StageSaturation {
  const parts = partition(endpoints);
  if (parts.length === 0) {
    const r = detector.saturation(now, endpoints);
    return { global: r.value, stale: r.stale };
  }
  const out: StageSaturation = { global: -Infinity, stale: 0 };
  for (const [stage, members] of parts) {
    const r = detector.saturation(now, members);
    out[stage] = r.value;
    out.stale += r.stale;
    const value = failClosed(r.value);
    if (value > out.global) out.global = value;
  }
  return out;
}

/** `stageSaturation(...).global` without building the per-stage record (the flow controller's hot path). */
export function globalSaturation(detector: SaturationDetector, now: number, endpoints: readonly Endpoint[]): number {
  const parts = partition(endpoints);
  if (parts.length === 0) return detector.saturation(now, endpoints).value;
  let global = -Infinity;
  for (let i = 0; i < parts.length; i++) {
    const value = failClosed(detector.saturation(now, parts[i]![1]).value);
    if (value > global) global = value;
  }
  return global;
}
