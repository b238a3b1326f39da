/**
 * `weighted-random-picker` — picker.
 *
 * Draws `maxNumOfEndpoints` endpoints without replacement, each with probability proportional to
 * its score, by A-Res reservoir sampling: key = U^(1/score) with U uniform (ctx.random), highest
 * keys win (computed as ln(U)/score, same order, no underflow). Endpoints scoring ≤ 0 are only
 * used to fill up after every positive one; if all scores are ≤ 0 the pick is uniform.
 *
 * Parameters (defaults): `maxNumOfEndpoints` 1 — integer; ≤ 0 is read as 1 with a warning (as llm-d does).
 */
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Picker, ScoredEndpoint, SchedulingRequest } from '../framework.js';
import { pickCount, pickerParams, pickerWarnings, type PickerParams } from './picker-params.js';
import { pickUniformly } from './random-picker.js';

export const WEIGHTED_RANDOM_PICKER_TYPE = 'weighted-random-picker';

export const weightedRandomPickerParams = pickerParams;
export type WeightedRandomPickerParams = PickerParams;

interface KeyedEndpoint {
  endpoint: Endpoint;
  key: number;
}

const byKeyDescending = (a: KeyedEndpoint, b: KeyedEndpoint): number =>
  a.key === b.key ? 0 : b.key > a.key ? 1 : -1;

export class WeightedRandomPicker implements Picker {
  readonly type = WEIGHTED_RANDOM_PICKER_TYPE;
  readonly maxNumOfEndpoints: number;

  constructor(
    readonly name: string,
    params: WeightedRandomPickerParams,
  ) {
    this.maxNumOfEndpoints = pickCount(params);
  }

  pick(ctx: CycleContext, _req: SchedulingRequest, scored: ScoredEndpoint[]): Endpoint[] {
    const n = scored.length;
    let positive = 0;
    for (let i = 0; i < n; i++) if (scored[i]!.score > 0) positive++;
    if (positive === 0) return pickUniformly(ctx.random, scored, this.maxNumOfEndpoints);

    if (this.maxNumOfEndpoints === 1) {
      let best: ScoredEndpoint | undefined;
      let bestKey = -Infinity;
      for (let i = 0; i < n; i++) {
        const candidate = scored[i]!;
        if (!(candidate.score > 0)) continue;
        // ln(U)/score orders like U^(1/score); ≤ 0, and −Infinity only when U = 0.
        const key = Math.log(ctx.random()) / candidate.score;
        if (best === undefined || key > bestKey) {
          best = candidate;
          bestKey = key;
        }
      }
      return [best!.endpoint];
    }

    // Several picks: shuffle first so non-positive scores (key −Infinity) fill up in random order,
    // then a stable sort by key.
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(ctx.random() * (i + 1));
      const tmp = scored[i]!;
      scored[i] = scored[j]!;
      scored[j] = tmp;
    }
    const keyed: KeyedEndpoint[] = new Array(n);
    for (let i = 0; i < n; i++) {
      const { endpoint, score } = scored[i]!;
      keyed[i] = { endpoint, key: score > 0 ? Math.log(ctx.random()) / score : -Infinity };
    }
    keyed.sort(byKeyDescending);
    const count = Math.min(this.maxNumOfEndpoints, n);
    const out: Endpoint[] = new Array(count);
    for (let i = 0; i < count; i++) out[i] = keyed[i]!.endpoint;
    return out;
  }
}

export const weightedRandomPickerDefinition: PluginDefinition<WeightedRandomPickerParams> = {
  type: WEIGHTED_RANDOM_PICKER_TYPE,
  kinds: ['picker'],
  params: weightedRandomPickerParams,
  configWarnings: pickerWarnings,
  create: (name, params) => new WeightedRandomPicker(name, params),
};
