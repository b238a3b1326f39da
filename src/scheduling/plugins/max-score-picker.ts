/**
 * `max-score-picker` — picker.
 *
 * Takes the `maxNumOfEndpoints` highest-scoring endpoints, best first. Equal scores are taken in
 * turn, as llm-d does since its PR #2515/#2709 (it broke them at random before): candidates are
 * stable-sorted by score, then each tier of equal scores that reaches the picked places is rotated
 * by the picks made so far — counted per profile (one picker serving the decode and the prefill
 * profile would otherwise give each every other turn: always the same of two prefill endpoints), and
 * not advanced by flow control's look-ahead probes. Four idle endpoints get four requests one each, where random draws
 * leave one of them idle nine times in ten. The common single pick is two linear scans, no sort.
 *
 * Parameters (defaults): `maxNumOfEndpoints` 1 — integer; ≤ 0 is read as 1 with a warning (as llm-d does).
 */
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Picker, ScoredEndpoint, SchedulingRequest } from '../framework.js';
import { pickCount, pickerParams, pickerWarnings, type PickerParams } from './picker-params.js';

export const MAX_SCORE_PICKER_TYPE = 'max-score-picker';

export const maxScorePickerParams = pickerParams;
export type MaxScorePickerParams = PickerParams;

const byScoreDescending = (a: ScoredEndpoint, b: ScoredEndpoint): number => b.score - a.score;

/** Wraps the pick count well inside the small-integer range (a tier's turn is the count modulo its size). */
const TURN_MASK = 0x3fffffff;

export class MaxScorePicker implements Picker {
  readonly type = MAX_SCORE_PICKER_TYPE;
  readonly maxNumOfEndpoints: number;
  /** Picks made so far per profile (masked): which of the tied endpoints is next. */
  private readonly turns = new Map<string | undefined, number>();

  constructor(
    readonly name: string,
    params: MaxScorePickerParams,
  ) {
    this.maxNumOfEndpoints = pickCount(params);
  }

  pick(ctx: CycleContext, _req: SchedulingRequest, scored: ScoredEndpoint[], profile?: string): Endpoint[] {
    const n = scored.length;
    if (n === 0) return [];
    const turn = this.turns.get(profile) ?? 0;
    if (ctx.probe !== true) this.turns.set(profile, (turn + 1) & TURN_MASK);
    if (this.maxNumOfEndpoints === 1) {
      let best = scored[0]!.score;
      let ties = 1;
      for (let i = 1; i < n; i++) {
        const score = scored[i]!.score;
        if (score > best) {
          best = score;
          ties = 1;
        } else if (score === best) ties++;
      }
      let k = turn % ties;
      for (let i = 0; i < n; i++) {
        if (scored[i]!.score === best && k-- === 0) return [scored[i]!.endpoint];
      }
    }
    scored.sort(byScoreDescending); // stable: equal scores keep the candidates' order
    const count = Math.min(this.maxNumOfEndpoints, n);
    for (let start = 0; start < count; ) {
      let end = start + 1;
      while (end < n && scored[end]!.score === scored[start]!.score) end++;
      if (end - start > 1) rotate(scored, start, end, turn % (end - start));
      start = end;
    }
    const out: Endpoint[] = new Array(count);
    for (let i = 0; i < count; i++) out[i] = scored[i]!.endpoint;
    return out;
  }
}

/** Rotates `a[start, end)` left by `by` places. */
function rotate<T>(a: T[], start: number, end: number, by: number): void {
  if (by === 0) return;
  const tier = a.slice(start, end);
  const len = end - start;
  for (let i = 0; i < len; i++) a[start + i] = tier[(i + by) % len]!;
}

export const maxScorePickerDefinition: PluginDefinition<MaxScorePickerParams> = {
  type: MAX_SCORE_PICKER_TYPE,
  kinds: ['picker'],
  params: maxScorePickerParams,
  configWarnings: pickerWarnings,
  create: (name, params) => new MaxScorePicker(name, params),
};
