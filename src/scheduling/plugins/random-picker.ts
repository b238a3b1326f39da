/**
 * `random-picker` — picker.
 *
 * Ignores scores: `maxNumOfEndpoints` endpoints drawn uniformly at random (ctx.random) without
 * replacement.
 *
 * Parameters (defaults): `maxNumOfEndpoints` 1 — integer; ≤ 0 is read as 1 with a warning (as llm-d does).
 */
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Picker, ScoredEndpoint, SchedulingRequest } from '../framework.js';
import { pickCount, pickerParams, pickerWarnings, type PickerParams } from './picker-params.js';

export const RANDOM_PICKER_TYPE = 'random-picker';

export const randomPickerParams = pickerParams;
export type RandomPickerParams = PickerParams;

/** Partial Fisher–Yates: the first `count` entries of `scored` become a uniform sample. */
export function pickUniformly(random: () => number, scored: ScoredEndpoint[], count: number): Endpoint[] {
  const n = scored.length;
  const k = Math.min(count, n);
  const out: Endpoint[] = new Array(k);
  for (let i = 0; i < k; i++) {
    const j = i + Math.floor(random() * (n - i));
    const tmp = scored[i]!;
    scored[i] = scored[j]!;
    scored[j] = tmp;
    out[i] = scored[i]!.endpoint;
  }
  return out;
}

export class RandomPicker implements Picker {
  readonly type = RANDOM_PICKER_TYPE;
  readonly maxNumOfEndpoints: number;

  constructor(
    readonly name: string,
    params: RandomPickerParams,
  ) {
    this.maxNumOfEndpoints = pickCount(params);
  }

  pick(ctx: CycleContext, _req: SchedulingRequest, scored: ScoredEndpoint[]): Endpoint[] {
    return pickUniformly(ctx.random, scored, this.maxNumOfEndpoints);
  }
}

export const randomPickerDefinition: PluginDefinition<RandomPickerParams> = {
  type: RANDOM_PICKER_TYPE,
  kinds: ['picker'],
  params: randomPickerParams,
  configWarnings: pickerWarnings,
  create: (name, params) => new RandomPicker(name, params),
};
