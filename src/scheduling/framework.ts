/**
 * The scheduling framework's extension points, after llm-d: Filter, Scorer, Picker, ProfileHandler,
 * plus the PreRequest hook (run once the destination is chosen, e.g. to teach the prefix index).
 * The framework (scheduler.ts) only iterates these interfaces; it never names a concrete plugin.
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Clock, RandomSource } from '../util/clock.js';

export type ApiKind = 'chat' | 'completions' | 'embeddings' | 'responses';

/** What scheduling knows about a request. Built once per request by the proxy. */
export interface SchedulingRequest {
  readonly requestId: string;
  /** `model` from the body. */
  readonly model: string;
  readonly api: ApiKind;
  /**
   * Parsed JSON body (read-only for plugins). Whole while the request is scheduled (filters,
   * scorers, pickers, PreRequest hooks); `{}` (and `promptText` '') while it waits in the queue and
   * once it is sent to a model server (so in `onResponseHeaders`), when the request keeps only its
   * bytes (proxy/scheduling-request.ts).
   */
  readonly body: Readonly<Record<string, unknown>>;
  /**
   * Text the prefix index hashes (chat: the messages JSON as the client sent it; completions: the
   * prompt string or an array's JSON as sent; embeddings: likewise for input; responses: JSON of
   * [instructions, tools, input]).
   */
  readonly promptText: string;
  /** Lower-cased request headers. */
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
  /** Per-request scratch space shared between plugins of one scheduling run (e.g. prefix hashes). */
  readonly state: Map<string, unknown>;
}

/** Per-cycle context: time and chance, injected. */
export interface CycleContext {
  readonly clock: Clock;
  readonly random: RandomSource;
  /**
   * Set when the run is a probe (flow control's affinity look-ahead asking where a request would
   * go): nothing may be counted or learned.
   */
  readonly probe?: boolean;
}

export interface Plugin {
  /** llm-d type name, e.g. `queue-scorer`. */
  readonly type: string;
  /** Instance name (defaults to type); what `pluginRef` refers to. */
  readonly name: string;
  /**
   * After a reload, called on the new instance of a plugin that has the same name and type as
   * `previous`: it takes over what the old one learned (a prefix index, an LRU) when its own
   * parameters still fit it. Without this, a reload would cost the fleet its cache affinity.
   * `replaced`: endpoint names now at another address or port — what was learned of them is not
   * the new server's.
   */
  carryOver?(previous: Plugin, replaced: ReadonlySet<string>): void;
}

/** Narrows the candidate list. Returning an empty list fails the profile (429 rejected-saturated). */
export interface Filter extends Plugin {
  filter(ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[]): Endpoint[];
}

/**
 * Scores every candidate. `out[i]` is the score of `endpoints[i]`; the framework clamps to [0,1]
 * and multiplies by the profile weight. Writing into a caller-provided array keeps the hot path
 * allocation-free.
 */
export interface Scorer extends Plugin {
  score(ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void;
}

export interface ScoredEndpoint {
  endpoint: Endpoint;
  score: number;
}

export interface Picker extends Plugin {
  /**
   * Chooses up to `maxNumOfEndpoints` endpoints, best first. Never empty for a non-empty input.
   * `profile`: the profile picking (one picker may serve several, e.g. the auto-injected one).
   */
  pick(ctx: CycleContext, req: SchedulingRequest, scored: ScoredEndpoint[], profile?: string): Endpoint[];
}

/** Result of running one profile. */
export interface ProfileRunResult {
  /** Chosen endpoints, best first; empty when the profile failed. */
  targets: Endpoint[];
  /** Every endpoint that passed the filters with its weighted score (absent when a filter failed the profile). */
  scored?: readonly ScoredEndpoint[];
  /** Why it failed, when it did (e.g. "filter decode-filter left no endpoints"). */
  failure?: string;
}

/** A configured profile, ready to run. */
export interface SchedulingProfile {
  readonly name: string;
  readonly filters: readonly Filter[];
  readonly scorers: readonly { scorer: Scorer; weight: number }[];
  readonly picker: Picker;
}

export interface SchedulingResult {
  /** Name of the primary profile; its first target is where the request goes. */
  primaryProfile: string;
  profileResults: Map<string, ProfileRunResult>;
  /**
   * Set by a prefill/decode handler (`disagg-profile-handler`): what it decided for this request and
   * how the proxy carries a P/D decision out. The primary target is the decode endpoint.
   */
  disaggregation?: Disaggregation;
  /**
   * Uncached prompt tokens (prompt-load.ts) of the primary target and, with P/D, of the prefill
   * endpoint; reckoned by the scheduler before any PreRequest hook teaches the prefix index this
   * prompt. The proxy counts them (`endpoint.inFlightTokens`) on the endpoint that computes the
   * prompt: the prefill endpoint with P/D, the primary otherwise or when P/D falls back.
   */
  primaryPromptTokens?: number;
  prefillPromptTokens?: number;
}

/** How a P/D decision is carried out (SPEC §7.4). */
export type ConnectorName = 'sidecar' | 'nixlv2' | 'shared-storage';

/** One prompt, one sequence (no `n` > 1, no `/v1/completions` prompt batch): what one prefill leg's KV can serve. */
export function singleSequence(body: Readonly<Record<string, unknown>>): boolean {
  const n = body.n;
  if (typeof n === 'number' && n > 1) return false;
  const prompt = body.prompt;
  return !(Array.isArray(prompt) && prompt.length > 1 && (typeof prompt[0] === 'string' || Array.isArray(prompt[0])));
}

/** Decision types of `llm_d_epp_disagg_decision_total{decision_type}` (llm-d names). */
export type DisaggDecision = 'decode-only' | 'prefill-decode';

export interface Disaggregation {
  /** What happens to this request; the proxy counts it once per request. */
  decision: DisaggDecision;
  /** The prefill endpoint; set iff decision is `prefill-decode`. */
  prefill?: Endpoint;
  connector: ConnectorName;
}

/**
 * A P/D decider (kind `decider`): given the request and the already chosen decode endpoint, should
 * the prompt be prefilled elsewhere? Must not throw for a well-formed request.
 */
export interface Decider extends Plugin {
  disaggregate(ctx: CycleContext, req: SchedulingRequest, decode: Endpoint): boolean;
}

/** Decides which profiles run (possibly in several rounds) and which result is primary. */
export interface ProfileHandler extends Plugin {
  /**
   * Profiles to run next, given the results so far (empty map on the first call). Return [] to stop.
   */
  pickProfiles(
    ctx: CycleContext,
    req: SchedulingRequest,
    profiles: ReadonlyMap<string, SchedulingProfile>,
    results: ReadonlyMap<string, ProfileRunResult>,
  ): SchedulingProfile[];
  /** The connector its prefill/decode decisions are carried out with; undefined when it never disaggregates. */
  readonly disaggregatesWith?: ConnectorName;
  /** Chooses the primary profile once no more profiles are to run. */
  processResults(req: SchedulingRequest, results: ReadonlyMap<string, ProfileRunResult>): SchedulingResult;
}

/** Runs after a destination was chosen and before the request is sent (e.g. prefix index learning). */
export interface PreRequest extends Plugin {
  preRequest(req: SchedulingRequest, result: SchedulingResult): void;
}

/**
 * Runs when the upstream response headers arrive; may add response headers (e.g. session token).
 * `endpoint` is the one that answered; `result` the scheduling run that chose it.
 */
export interface ResponseHeadersHook extends Plugin {
  onResponseHeaders(req: SchedulingRequest, endpoint: Endpoint, setHeader: (name: string, value: string) => void, result?: SchedulingResult): void;
}

export const isFilter = (p: object): p is Filter => typeof (p as Filter).filter === 'function';
export const isScorer = (p: object): p is Scorer => typeof (p as Scorer).score === 'function';
export const isPicker = (p: object): p is Picker => typeof (p as Picker).pick === 'function';
export const isProfileHandler = (p: object): p is ProfileHandler =>
  typeof (p as ProfileHandler).pickProfiles === 'function';
export const isDecider = (p: object): p is Decider => typeof (p as Decider).disaggregate === 'function';
export const isPreRequest = (p: object): p is PreRequest => typeof (p as PreRequest).preRequest === 'function';
export const isResponseHeadersHook = (p: object): p is ResponseHeadersHook =>
  typeof (p as ResponseHeadersHook).onResponseHeaders === 'function';
