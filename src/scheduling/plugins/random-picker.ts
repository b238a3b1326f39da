/**
 * `random-picker` — picker.
 *
 * Ignores scores: `maxNumOfEndpoints` endpoints drawn uniformly at random (ctx.random) without
 * replacement.
 *
 * Parameters (defaults): `maxNumOfEndpoints` 1 — integer > 0.
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Picker, ScoredEndpoint, SchedulingRequest } from '../framework.js';

export const RANDOM_PICKER_TYPE = 'random-picker';

export const randomPickerParams = z.strictObject({
  maxNumOfEndpoints: z.number().int().positive().default(1),
});

export type RandomPickerParams = z.infer<typeof randomPickerParams>;

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
    this.maxNumOfEndpoints = params.maxNumOfEndpoints;
  }

  pick(ctx: CycleContext, _req: SchedulingRequest, scored: ScoredEndpoint[]): Endpoint[] {
    return pickUniformly(ctx.random, scored, this.maxNumOfEndpoints);
  }
}

export const randomPickerDefinition: PluginDefinition<RandomPickerParams> = {
  type: RANDOM_PICKER_TYPE,
  kinds: ['picker'],
  params: randomPickerParams,
  create: (name, params) => new RandomPicker(name, params),
};
