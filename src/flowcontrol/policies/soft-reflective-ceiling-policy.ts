/**
 * `soft-reflective-ceiling-policy` — usage-limit policy (alpha in llm-d, never auto-injected). Takes
 * no parameters (any parameter is an error). Gates lower bands proportionally as saturation s rises.
 *
 * Formula (N bands, i = 0 highest):
 * - N = 1 → [1.0]. Band 0 always gets 1.0 (it dispatches while s < 1).
 * - For i ≥ 1, reflective ceiling `r_i = 1 − i·s/(N − 1)`:
 *   - s < r_i → 1.0 (open);
 *   - else s ≥ 1 → 0.0 (closed);
 *   - else the band alternates: `period = max(1, round(s/(1 − s + 1e-9)))`, open (1.0) when
 *     `tick % period == 0`, else 0.0 — on average it dispatches 1/period of the cycles.
 * - One policy-wide tick counter advances once per call while any band alternates (which happens
 *   iff 0.5 ≤ s < 1, the last band's r being 1 − s); it is incremented before the test, so the
 *   first alternating call sees tick 1. It is never reset. All alternating bands share the same
 *   open/closed decision on a call, which keeps ceilings non-increasing down the list.
 *   (Reference §2.7; later llm-d code keeps one counter per band instead.)
 * - llm-d runs a cycle every 1 ms; Sluice's cycles follow events, so while the policy alternates
 *   and requests wait it asks for a cycle 1 ms later (`changesNextCycle`): a band alternating with
 *   period p opens about every p ms, as in llm-d, not every p-th scrape.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { UsageLimitPolicy } from './types.js';

export const SOFT_REFLECTIVE_CEILING_POLICY = 'soft-reflective-ceiling-policy';

export const softReflectiveCeilingParams = z.strictObject({});
export type SoftReflectiveCeilingParams = z.output<typeof softReflectiveCeilingParams>;

export class SoftReflectiveCeilingPolicy implements UsageLimitPolicy {
  readonly type = SOFT_REFLECTIVE_CEILING_POLICY;
  /** Dispatch-spreading state only (no smoothing): the alternation counter. */
  tick = 0;
  /** Whether the last call alternated: the next call may open what this one closed. */
  private alternated = false;

  constructor(readonly name: string) {}

  computeCeilings(saturation: number, priorities: readonly number[], out: Float64Array): void {
    const n = priorities.length;
    if (n === 0) return;
    out[0] = 1.0;
    if (n === 1) return;
    const s = saturation;
    // The tick advances once per call, before any band reads it, iff some band alternates; the last
    // band has the lowest reflective ceiling, so checking it decides "any band".
    const lastReflective = 1 - ((n - 1) * s) / (n - 1);
    const alternating = !(s < lastReflective) && s < 1;
    this.alternated = alternating;
    let open = false;
    if (alternating) {
      this.tick++;
      const period = Math.max(1, Math.round(s / (1 - s + 1e-9)));
      open = this.tick % period === 0;
    }
    for (let i = 1; i < n; i++) {
      const reflective = 1 - (i * s) / (n - 1);
      if (s < reflective) out[i] = 1.0;
      else if (s >= 1) out[i] = 0.0;
      else out[i] = open ? 1.0 : 0.0;
    }
  }

  changesNextCycle(): boolean {
    return this.alternated;
  }
}

export const softReflectiveCeilingPolicyDefinition: PluginDefinition<SoftReflectiveCeilingParams> = {
  type: SOFT_REFLECTIVE_CEILING_POLICY,
  kinds: ['usageLimitPolicy'],
  params: softReflectiveCeilingParams,
  create: (name) => new SoftReflectiveCeilingPolicy(name),
};
