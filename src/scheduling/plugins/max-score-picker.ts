/**
 * `max-score-picker` — picker.
 *
 * Takes the `maxNumOfEndpoints` highest-scoring endpoints, best first. Ties are broken uniformly at
 * random (ctx.random): as llm-d, shuffle then stable-sort by score descending. For the common
 * single pick a linear scan with reservoir tie-breaking gives the same distribution without sorting.
 *
 * Parameters (defaults): `maxNumOfEndpoints` 1 — integer > 0.
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Picker, ScoredEndpoint, SchedulingRequest } from '../framework.js';

export const MAX_SCORE_PICKER_TYPE = 'max-score-picker';

export const maxScorePickerParams = z.strictObject({
  maxNumOfEndpoints: z.number().int().positive().default(1),
});

export type MaxScorePickerParams = z.infer<typeof maxScorePickerParams>;

const byScoreDescending = (a: ScoredEndpoint, b: ScoredEndpoint): number => b.score - a.score;

export class MaxScorePicker implements Picker {
  readonly type = MAX_SCORE_PICKER_TYPE;
  readonly maxNumOfEndpoints: number;

  constructor(
    readonly name: string,
    params: MaxScorePickerParams,
  ) {
    this.maxNumOfEndpoints = params.maxNumOfEndpoints;
  }

  pick(ctx: CycleContext, _req: SchedulingRequest, scored: ScoredEndpoint[]): Endpoint[] {
    const n = scored.length;
    if (n === 0) return [];
    if (this.maxNumOfEndpoints === 1) {
      let best = scored[0]!;
      let ties = 1;
      for (let i = 1; i < n; i++) {
        const candidate = scored[i]!;
        if (candidate.score > best.score) {
          best = candidate;
          ties = 1;
        } else if (candidate.score === best.score) {
          // Reservoir sampling over the tied set: each tie ends up chosen with probability 1/ties.
          ties++;
          if (ctx.random() * ties < 1) best = candidate;
        }
      }
      return [best.endpoint];
    }
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(ctx.random() * (i + 1));
      const tmp = scored[i]!;
      scored[i] = scored[j]!;
      scored[j] = tmp;
    }
    scored.sort(byScoreDescending);
    const count = Math.min(this.maxNumOfEndpoints, n);
    const out: Endpoint[] = new Array(count);
    for (let i = 0; i < count; i++) out[i] = scored[i]!.endpoint;
    return out;
  }
}

export const maxScorePickerDefinition: PluginDefinition<MaxScorePickerParams> = {
  type: MAX_SCORE_PICKER_TYPE,
  kinds: ['picker'],
  params: maxScorePickerParams,
  create: (name, params) => new MaxScorePicker(name, params),
};
