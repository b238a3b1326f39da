/**
 * The scheduler: one decision per request (SPEC §7, reference epp-flow-control §5.1).
 *
 * The profile handler says which profiles run (possibly over several rounds) and which result is
 * primary; a profile runs its filters in order (the first that returns nothing fails the profile),
 * then sums `weight × clamp(score, 0, 1)` over its scorers (NaN → 0), then lets its picker choose.
 * Once the primary profile has a target, every PreRequest hook runs (e.g. prefix-index learning).
 *
 * Only interfaces are used here; no concrete plugin is named.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type {
  CycleContext,
  Filter,
  PreRequest,
  ProfileHandler,
  ProfileRunResult,
  ScoredEndpoint,
  SchedulingProfile,
  SchedulingRequest,
  SchedulingResult,
} from './framework.js';
import { uncachedTokens, type PrefixMatcher } from './prompt-load.js';

/**
 * What one profile run saw and decided, for the debug log ("why did it go there?"): filled only when
 * the caller passes a trace, so an untraced decision pays one check per step and allocates nothing.
 */
export interface ProfileTrace {
  profile: string;
  candidates: number;
  /** Each filter in run order: how many endpoints it kept and which it dropped. */
  filters: { filter: string; kept: number; dropped: string[] }[];
  /** Scorer weights of the profile, by scorer name. */
  weights: Record<string, number>;
  /** Per endpoint that passed the filters: the weighted total, and each scorer's score clamped to [0, 1]. */
  scores: Record<string, { total: number; scorers: Record<string, number> }>;
  picked: string[];
  failure?: string;
}

/** The profile runs of one scheduling decision, in the order the profile handler asked for them. */
export type DecisionTrace = ProfileTrace[];

export type SchedulingOutcome =
  | { ok: true; result: SchedulingResult; target: Endpoint }
  /** `no-endpoints` → 503 rejected-no-endpoints; `filtered` → 429 rejected-saturated. */
  | { ok: false; reason: 'no-endpoints' | 'filtered'; message: string };

/**
 * How much worse (as a share of the favourite's weighted score) the endpoint a request would get now
 * must be before it would rather wait for its favourite. With the default weights a prompt cached on
 * the favourite and not on the alternative scores about 40 % lower there; two endpoints that both
 * cache it differ by a few per cent.
 */
const AFFINITY_MARGIN = 0.2;

/** A handler that keeps asking for profiles is a bug; stop it rather than spin forever. */
const MAX_HANDLER_ROUNDS = 64;

/**
 * Scratch buffers the scorers write into, one per candidate count (a scorer gets exactly one slot
 * per candidate). Scheduling is synchronous and runs one profile at a time, so a buffer per count
 * serves every run: P/D profiles, the saturation filter and the look-ahead probe change the count
 * from run to run, and one buffer resized to each would be re-allocated on nearly every decision.
 * Counts above MAX_CACHED_SCRATCH get a buffer each time (bounded memory for huge pools).
 */
const scoreScratch: (Float64Array | undefined)[] = [];
const MAX_CACHED_SCRATCH = 256;

function scoreBuffer(length: number): Float64Array {
  if (length > MAX_CACHED_SCRATCH) return new Float64Array(length);
  return (scoreScratch[length] ??= new Float64Array(length));
}

/** Runs one profile over the candidates: filters (but `skip`) → weighted scorers → picker. */
export function runProfile(
  ctx: CycleContext,
  profile: SchedulingProfile,
  req: SchedulingRequest,
  candidates: readonly Endpoint[],
  skip?: Filter,
  trace?: DecisionTrace,
): ProfileRunResult {
  const t = trace === undefined ? undefined : startTrace(trace, profile, candidates.length);
  const remaining = runFilters(ctx, profile, req, candidates, skip, t);
  const result = typeof remaining === 'string' ? { targets: [], failure: remaining } : scoreAndPick(ctx, profile, req, remaining, t);
  if (t !== undefined) {
    t.picked = result.targets.map((e) => e.name);
    if (result.failure !== undefined) t.failure = result.failure;
  }
  return result;
}

function startTrace(trace: DecisionTrace, profile: SchedulingProfile, candidates: number): ProfileTrace {
  const weights: Record<string, number> = {};
  for (const { scorer, weight } of profile.scorers) weights[scorer.name] = weight;
  const t: ProfileTrace = { profile: profile.name, candidates, filters: [], weights, scores: {}, picked: [] };
  trace.push(t);
  return t;
}

/** The candidates a profile's filters (but `skip`) keep, in order; or why none is left. */
function runFilters(
  ctx: CycleContext,
  profile: SchedulingProfile,
  req: SchedulingRequest,
  candidates: readonly Endpoint[],
  skip?: Filter,
  trace?: ProfileTrace,
): readonly Endpoint[] | string {
  if (candidates.length === 0) return `profile ${profile.name}: no candidate endpoints`;
  let remaining = candidates;
  for (const filter of profile.filters) {
    if (filter === skip) continue;
    const before = remaining;
    remaining = filter.filter(ctx, req, remaining);
    if (trace !== undefined) {
      const kept = new Set(remaining);
      trace.filters.push({ filter: filter.name, kept: remaining.length, dropped: before.filter((e) => !kept.has(e)).map((e) => e.name) });
    }
    if (remaining.length === 0) return `profile ${profile.name}: filter ${filter.name} left no endpoints`;
  }
  return remaining;
}

/** A profile's weighted scorers over endpoints that passed its filters, then its picker. */
function scoreAndPick(
  ctx: CycleContext,
  profile: SchedulingProfile,
  req: SchedulingRequest,
  remaining: readonly Endpoint[],
  trace?: ProfileTrace,
): ProfileRunResult {
  const n = remaining.length;
  const scored: ScoredEndpoint[] = new Array(n);
  for (let i = 0; i < n; i++) scored[i] = { endpoint: remaining[i]!, score: 0 };
  const traced = trace === undefined ? undefined : remaining.map((e) => (trace.scores[e.name] = { total: 0, scorers: {} as Record<string, number> }));

  if (profile.scorers.length > 0) {
    const out = scoreBuffer(n);
    for (const { scorer, weight } of profile.scorers) {
      out.fill(0);
      scorer.score(ctx, req, remaining, out);
      for (let i = 0; i < n; i++) {
        let s = out[i]!;
        // `!(s > 0)` also catches NaN.
        if (!(s > 0)) s = 0;
        else if (s > 1) s = 1;
        scored[i]!.score += s * weight;
        if (traced !== undefined) traced[i]!.scorers[scorer.name] = s;
      }
    }
  }
  if (traced !== undefined) for (let i = 0; i < n; i++) traced[i]!.total = scored[i]!.score;

  const targets = profile.picker.pick(ctx, req, scored, profile.name);
  if (targets.length === 0) {
    return { targets, scored, failure: `profile ${profile.name}: picker ${profile.picker.name} chose no endpoint` };
  }
  return { targets, scored };
}

export class Scheduler {
  /** The context of the look-ahead's probe runs. */
  private readonly probeCtx: CycleContext;

  constructor(
    readonly handler: ProfileHandler,
    readonly profiles: ReadonlyMap<string, SchedulingProfile>,
    readonly preRequest: readonly PreRequest[],
    readonly ctx: CycleContext,
    /** The flow-control saturation detector, as the filter the profiles run (SPEC §7.2). */
    readonly saturationFilter?: Filter,
    /** What each endpoint caches of a prompt, for its prompt tokens (none: nothing is cached). */
    readonly prefixMatcher?: PrefixMatcher,
  ) {
    this.probeCtx = { ...ctx, probe: true };
  }

  /** One decision; with `trace`, every profile run is also recorded into it (for the debug log). */
  schedule(req: SchedulingRequest, candidates: readonly Endpoint[], trace?: DecisionTrace): SchedulingOutcome {
    if (candidates.length === 0) {
      return { ok: false, reason: 'no-endpoints', message: 'no endpoints available for scheduling' };
    }
    const result = this.decide(this.ctx, req, candidates, undefined, trace);
    const primary = result.profileResults.get(result.primaryProfile);
    const target = primary?.targets[0];
    if (target === undefined) {
      return {
        ok: false,
        reason: 'filtered',
        message: primary?.failure ?? `primary profile ${result.primaryProfile} chose no endpoint`,
      };
    }
    result.primaryPromptTokens = uncachedTokens(req, target, this.prefixMatcher);
    const prefill = result.disaggregation?.prefill;
    if (prefill !== undefined) result.prefillPromptTokens = uncachedTokens(req, prefill, this.prefixMatcher);
    for (const hook of this.preRequest) hook.preRequest(req, result);
    return { ok: true, result, target };
  }

  /**
   * Whether this request would be served clearly worse now than by the endpoint it suits best, only
   * because that endpoint is saturated: its primary profile, run without the saturation filter,
   * scores the endpoint it would be sent to now more than `AFFINITY_MARGIN` below its favourite. (A
   * request the saturation filter merely moves between equally good endpoints — two that cache its
   * prompt — is content to go.) A probe for flow control (`affinityLookahead`): no PreRequest hook
   * runs, nothing is learned or counted.
   */
  favouriteIsSaturated(req: SchedulingRequest, candidates: readonly Endpoint[]): boolean {
    const skip = this.saturationFilter;
    if (skip === undefined || candidates.length === 0) return false;
    const ctx = this.probeCtx;
    const unfiltered = this.decide(ctx, req, candidates, skip);
    const run = unfiltered.profileResults.get(unfiltered.primaryProfile);
    const favourite = run?.targets[0];
    const profile = this.profiles.get(unfiltered.primaryProfile);
    if (favourite === undefined || run?.scored === undefined || profile === undefined || !profile.filters.includes(skip)) return false;
    // The common case, cheaply: the favourite passes the filters, so nothing keeps the request from it.
    const remaining = runFilters(ctx, profile, req, candidates);
    if (typeof remaining === 'string' || remaining.includes(favourite)) return false;
    // What dispatching now would pick: the same profile over what its filters keep.
    const pick = scoreAndPick(ctx, profile, req, remaining).targets[0];
    if (pick === undefined) return false;
    // Both scored in the same (unfiltered) run, so min-max normalised scorers compare like with like.
    let favouriteScore = NaN;
    let pickScore = NaN;
    for (const s of run.scored) {
      if (s.endpoint === favourite) favouriteScore = s.score;
      else if (s.endpoint === pick) pickScore = s.score;
    }
    return pickScore < favouriteScore * (1 - AFFINITY_MARGIN);
  }

  /** The profile handler's rounds over the candidates (profiles run without `skip`). */
  private decide(ctx: CycleContext, req: SchedulingRequest, candidates: readonly Endpoint[], skip?: Filter, trace?: DecisionTrace): SchedulingResult {
    const { handler, profiles } = this;
    const results = new Map<string, ProfileRunResult>();
    for (let round = 0; ; round++) {
      const next = handler.pickProfiles(ctx, req, profiles, results);
      if (next.length === 0) break;
      if (round >= MAX_HANDLER_ROUNDS) {
        throw new Error(`profile handler ${handler.name} still picking profiles after ${MAX_HANDLER_ROUNDS} rounds`);
      }
      for (const profile of next) results.set(profile.name, runProfile(ctx, profile, req, candidates, skip, trace));
    }
    return handler.processResults(req, results);
  }
}
