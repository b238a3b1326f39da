/**
 * The live endpoint set and everything the gateway knows about each endpoint (ARCHITECTURE: state
 * lives in one place). Scheduling and detectors read `endpoints` synchronously; the scraper writes
 * through `recordScrape`, the proxy through `acquire`/`release` and `promptSent`/`promptDone`, a
 * reload through `setEndpoints`; the flow controller listens with `onChange` so it re-runs dispatch
 * when anything that could change saturation changes.
 */
import type { PoolView } from '../plugins/registry.js';
import { Endpoint, engineTypeOf, type EndpointMetrics, type EndpointSpec, type InFlightAttempt } from './endpoint.js';
import { formatDuration } from '../config/units.js';
import { DEFAULT_OUTLIER_POLICY, recordFailure, recordSuccess, stalledMs, type OutlierPolicy } from './outlier.js';

export type PoolChangeReason = 'metrics' | 'endpoints' | 'inflight' | 'outlier';
export type PoolListener = (reason: PoolChangeReason, ep?: Endpoint) => void;
/** A scrape's outcome; `answered`: the server gave an answer (an HTTP error, a page that could not be read), so it is not silent. */
export type ScrapeResult = { metrics: EndpointMetrics } | { error: string; answered?: boolean };

/** An endpoint was set aside for failing (`ms` long) or for making no progress (stalled), or takes requests again. */
export type OutlierEvent =
  | { kind: 'ejected'; ms: number; reason: string }
  | { kind: 'returned' }
  | { kind: 'stalled'; reason: string }
  | { kind: 'progressing' };

export interface PoolOptions {
  /** Told about broken invariants (e.g. a release without an acquire); the pool never throws for them. */
  onInvariantViolation?: (message: string, ep: Endpoint) => void;
  /** Outlier detection (outlier.ts); its defaults when unset. */
  outlierPolicy?: OutlierPolicy;
  /** Told when an endpoint is ejected or back (logs, metrics). */
  onOutlier?: (ep: Endpoint, event: OutlierEvent) => void;
  /** Told when the set of models the endpoints' pages name changes (each endpoint's in `servedBy`). */
  onServedModels?: (servedBy: ReadonlyMap<string, readonly string[]>) => void;
  /** An endpoint whose scrapes got no answer at all for this long (ms) is silent (scraper.ts silenceWindowMs); default: never. */
  silenceMs?: number;
}

function sameLabels(a: Readonly<Record<string, string>>, b: Readonly<Record<string, string>>): boolean {
  const aKeys = Object.keys(a);
  if (aKeys.length !== Object.keys(b).length) return false;
  for (const key of aKeys) {
    if (!Object.prototype.hasOwnProperty.call(b, key) || a[key] !== b[key]) return false;
  }
  return true;
}

function sameServer(ep: Endpoint, spec: EndpointSpec): boolean {
  return ep.address === spec.address && ep.port === spec.port;
}

/** Rejects duplicate names and duplicate address:port pairs (SPEC §3.1) before anything changes. */
function checkUnique(specs: readonly EndpointSpec[]): void {
  const names = new Set<string>();
  const targets = new Set<string>();
  for (const spec of specs) {
    if (names.has(spec.name)) throw new Error(`duplicate endpoint name '${spec.name}'`);
    names.add(spec.name);
    const target = `${spec.address}|${spec.port}`;
    if (targets.has(target)) throw new Error(`duplicate endpoint address ${spec.address}:${spec.port} ('${spec.name}')`);
    targets.add(target);
  }
}

/**
 * `to` serves `from`'s server under a new name: `from`'s requests in flight (and prompt tokens owed)
 * count on `to`, and are released against it (Endpoint.successor). Its page, once scraped, shows
 * them too: they were sent before any scrape of `to` (Pool.recordScrape).
 */
function handOverInFlight(from: Endpoint, to: Endpoint): void {
  to.inFlight += from.inFlight;
  to.inFlightTokens += from.inFlightTokens;
  to.unseenPromptTokens += from.unseenPromptTokens;
  from.inFlight = 0;
  from.inFlightTokens = 0;
  from.unseenPromptTokens = 0;
  from.probes = 0;
  from.successor = to;
}

/** The endpoint that now counts `ep`'s requests: `ep`, or the last of its successors (a renamed server). */
function current(ep: Endpoint): Endpoint {
  while (ep.successor !== undefined) ep = ep.successor;
  return ep;
}

/**
 * A stage every endpoint of which is set aside keeps them all (`open`: the stages with one left):
 * its requests are better served by them than by none. Not the prefill stage: without it a P/D
 * request is served decode-only (SPEC §7.3), where an ejected or stalled prefill tier would hold
 * every prefill leg until it failed or timed out.
 */
function keepsWholeStage(ep: Endpoint, open: ReadonlySet<Endpoint['stage']> | undefined): boolean {
  return ep.stage !== 'prefill' && open?.has(ep.stage) !== true;
}

/** LoRA adapters seen last whose model the pool remembers at least (Pool.noteAdapters; at most twice as many). */
const MAX_ADAPTERS_NOTED = 10_000;
/** An adapter shown by servers of two models: no model of its own (a page's model_name is never empty). */
const ANY_MODEL = '';

export class Pool implements PoolView {
  private list: readonly Endpoint[] = Object.freeze([]);
  private readonly byNameMap = new Map<string, Endpoint>();
  /** Removed endpoints with requests still in flight, by name: taken back if the same server returns. */
  private readonly draining = new Map<string, Endpoint>();
  // Copy-on-write so notify() can iterate without copying and listeners may unsubscribe mid-notify.
  private listeners: readonly PoolListener[] = [];
  private readonly onInvariantViolation: ((message: string, ep: Endpoint) => void) | undefined;
  private readonly onOutlier: ((ep: Endpoint, event: OutlierEvent) => void) | undefined;
  private outlierPolicy: OutlierPolicy;
  private silenceMs: number;
  // The endpoints requests may go to (`eligible`), as of the last look: recomputed when an ejection
  // starts or ends, when a stall starts or ends, when a probe leaves or returns, when the list or the
  // policy changes — never per request otherwise.
  private eligibleList: readonly Endpoint[] = this.list;
  /** Endpoints left out of `eligibleList` at the last look (0: it is `list`). */
  private leftOut = 0;
  /** The earliest end of an ejection running at the last look (Infinity: none). */
  private nextReturnAt = Infinity;
  private eligibleStale = false;
  /**
   * The models the endpoints in `list` name (Endpoint.servedModel), with how many name each: a page
   * naming a model costs O(1), not a recount.
   */
  private modelCounts = new Map<string, number>();
  /** LoRA adapters seen running or waiting on a server (vllm:lora_requests_info), to the model that server serves. */
  private adapterBase = new Map<string, string>();
  /** The generation of adapterBase before (noteAdapters): names not seen again since. */
  private adaptersBefore: ReadonlyMap<string, string> = new Map();
  /** eligibleFor's answer per model served (an adapter's: its model's), while the eligible list it narrowed is the current one. */
  private readonly byModel = new Map<string, { from: readonly Endpoint[]; kept: readonly Endpoint[] }>();
  private readonly onServedModels: PoolOptions['onServedModels'];

  /** Releases that would have taken an in-flight count below zero (a proxy accounting bug). */
  releaseUnderflows = 0;

  constructor(specs: readonly EndpointSpec[], opts: PoolOptions = {}) {
    this.onInvariantViolation = opts.onInvariantViolation;
    this.onOutlier = opts.onOutlier;
    this.onServedModels = opts.onServedModels;
    this.outlierPolicy = opts.outlierPolicy ?? DEFAULT_OUTLIER_POLICY;
    this.silenceMs = opts.silenceMs ?? Infinity;
    this.setEndpoints(specs);
  }

  /** Current endpoints in configuration order. The array is frozen and replaced only when the set changes. */
  get endpoints(): readonly Endpoint[] {
    return this.list;
  }

  /**
   * The endpoints requests may be sent to at `now`, in configuration order: all but those outlier
   * detection sets aside (outlier.ts: ejected for failing, stalled, or on probation with its one
   * probe request in flight). A stage (decode, interleaved) whose every endpoint is set aside keeps
   * them all: its requests are better served by them than by none (not prefill: keepsWholeStage). The same frozen array
   * as `endpoints` while nothing is left out. The saturation reading is taken over these too, so
   * what is set aside neither holds the gate closed nor counts as room.
   */
  eligible(now: number): readonly Endpoint[] {
    if (this.leftOut === 0 && !this.eligibleStale && now < this.nextReturnAt) return this.list;
    if (this.eligibleStale || now >= this.nextReturnAt) this.refreshEligible(now);
    return this.eligibleList;
  }

  /**
   * `eligible(now)` for a request of `model`. When the pool's servers name several models (their
   * pages' `model_name`, EndpointMetrics.model) and `model` is one of them, only its servers and
   * those whose pages name none: a server of another model would answer 404. A model whose every
   * server in a stage is set aside keeps them there, as a stage does. A LoRA adapter a server's page
   * showed running or waiting goes to the servers of that server's model; a model no page names (an
   * adapter not seen yet, a second served name) may go to any. Cached per model served and eligible list.
   */
  eligibleFor(model: string, now: number): readonly Endpoint[] {
    const eligible = this.eligible(now);
    const base = this.servedModelOf(model);
    if (base === undefined) return eligible;
    // Per model served, not per name asked for: its adapters share its answer (one copy, one pass).
    const hit = this.byModel.get(base);
    if (hit !== undefined && hit.from === eligible) return hit.kept;
    const serves = (ep: Endpoint): boolean => ep.servedModel === undefined || ep.servedModel === base;
    let kept = eligible.filter(serves);
    // Per stage, as `eligible`: a stage whose every server of the model is set aside keeps them (P/D:
    // the model's decode servers all ejected while another model's keep the decode stage open).
    const open = new Set<Endpoint['stage']>();
    for (const ep of kept) if (ep.servedModel === base) open.add(ep.stage);
    if (this.list.some((ep) => ep.servedModel === base && !open.has(ep.stage))) {
      const isEligible = new Set(eligible);
      kept = this.list.filter((ep) => serves(ep) && (isEligible.has(ep) || (ep.servedModel === base && keepsWholeStage(ep, open))));
    }
    // Named by no server that can answer it (its decode servers gone, its prefill ones not yet): as a
    // model no page names, rather than a decode profile left empty (429 "saturated" on an idle pool).
    const answer = kept.some((ep) => ep.servedModel === base && (ep.stage === 'decode' || ep.stage === 'interleaved')) ? Object.freeze(kept) : eligible;
    this.byModel.set(base, { from: eligible, kept: answer });
    return answer;
  }

  /**
   * The servers of `model` that eligibleFor leaves out at `now`, set aside by outlier detection, in
   * configuration order: a request searching for the server that holds a stored response asks them
   * last (forward.ts), as a pinned one goes to its home set aside.
   */
  setAsideFor(model: string, now: number): Endpoint[] {
    const eligible = this.eligibleFor(model, now);
    if (eligible === this.list) return [];
    const base = this.servedModelOf(model);
    return this.list.filter((ep) => !eligible.includes(ep) && (base === undefined || ep.servedModel === undefined || ep.servedModel === base));
  }

  /**
   * The served model whose servers a request for `model` goes to (an adapter's: the model of the
   * servers that showed it); undefined when any server may take it (one model served, or a name no
   * page shows).
   */
  private servedModelOf(model: string): string | undefined {
    const served = this.modelCounts;
    if (served.size < 2) return undefined;
    const base = served.has(model) ? model : (this.adapterBase.get(model) ?? this.adaptersBefore.get(model));
    return base !== undefined && served.has(base) ? base : undefined;
  }

  /**
   * Notes the model of adapters a page showed. eligibleFor caches per model, so nothing cached
   * changes. Names come from the servers' pages: bounded in two generations, so at least the last
   * MAX_ADAPTERS_NOTED seen are remembered (at most twice that), at O(1) a name.
   */
  private noteAdapters(adapters: readonly string[], model: string): void {
    for (const adapter of adapters) {
      const current = this.adapterBase.get(adapter);
      if (current === model || current === ANY_MODEL) continue;
      const known = current ?? this.adaptersBefore.get(adapter);
      // Shown by servers of two models (two deployments of one base model under two names, say):
      // either may serve it, so it goes anywhere rather than to whichever page came last.
      const noted = known === undefined || known === model ? model : ANY_MODEL;
      if (this.adapterBase.size >= MAX_ADAPTERS_NOTED) {
        this.adaptersBefore = this.adapterBase;
        this.adapterBase = new Map();
      }
      this.adapterBase.set(adapter, noted);
    }
  }

  /** The list changed: recounts the models, and says so when the set of them changed. */
  private recountModels(): void {
    this.byModel.clear();
    const before = this.modelCounts;
    const counts = new Map<string, number>();
    for (const ep of this.list) if (ep.servedModel !== undefined) counts.set(ep.servedModel, (counts.get(ep.servedModel) ?? 0) + 1);
    this.modelCounts = counts;
    if (counts.size !== before.size || [...counts.keys()].some((m) => !before.has(m))) this.tellServedModels();
  }

  /** onServedModels, with each model's endpoints (O(n): only when the set of models changed). */
  private tellServedModels(): void {
    if (this.onServedModels === undefined) return;
    const servedBy = new Map<string, string[]>();
    for (const ep of this.list) {
      if (ep.servedModel === undefined) continue;
      const names = servedBy.get(ep.servedModel);
      if (names === undefined) servedBy.set(ep.servedModel, [ep.name]);
      else names.push(ep.name);
    }
    this.onServedModels(servedBy);
  }

  /**
   * `ep`'s page names `model`, another than before: the counts move, and the pass over the list
   * (O(n)) is made only when a model appears or disappears, so a pool's first scrapes cost O(n) in
   * all, not O(n²).
   */
  private servesModel(ep: Endpoint, model: string): void {
    const before = ep.servedModel;
    ep.servedModel = model;
    this.byModel.clear();
    if (this.byNameMap.get(ep.name) !== ep) return; // removed (draining): not counted
    const counts = this.modelCounts;
    const now = (counts.get(model) ?? 0) + 1;
    counts.set(model, now);
    let gone = false;
    if (before !== undefined) {
      const left = (counts.get(before) ?? 1) - 1;
      if (left > 0) counts.set(before, left);
      else gone = counts.delete(before);
    }
    if (now === 1 || gone) this.tellServedModels();
  }

  /** When the earliest running ejection ends (undefined: none runs): the reading can change then. */
  nextReturnTime(now: number): number | undefined {
    if (this.eligibleStale || now >= this.nextReturnAt) this.refreshEligible(now);
    return this.nextReturnAt === Infinity ? undefined : this.nextReturnAt;
  }

  /**
   * Ejected (failing), stalled, or on probation after an ejection with its probe still in flight
   * (requests sent before the ejection, a long stream, say, do not hold it out).
   */
  private leavesOut(ep: Endpoint, now: number): boolean {
    return ep.isSetAside(now) || (ep.probes > 0 && this.onProbation(ep));
  }

  /**
   * Back from an ejection, not yet answered 2xx: one request at a time (a probe), so the backlog that
   * waited for its return does not all land on a server that most likely still fails.
   */
  onProbation(ep: Endpoint): boolean {
    const threshold = this.outlierPolicy.consecutiveFailures;
    return ep.ejections > 0 && threshold > 0 && ep.failureStreak >= threshold;
  }

  private refreshEligible(now: number): void {
    this.eligibleStale = false;
    let next = Infinity;
    let leftOut = 0;
    // Stages with at least one endpoint not left out (the others keep theirs, above).
    let served: Set<Endpoint['stage']> | undefined;
    for (const ep of this.list) {
      if (ep.ejectedUntil > now) {
        if (ep.ejectedUntil < next) next = ep.ejectedUntil;
      } else if (ep.ejectedFor !== undefined) {
        ep.ejectedFor = undefined;
        this.onOutlier?.(ep, { kind: 'returned' });
      }
      if (this.leavesOut(ep, now)) leftOut++;
      else (served ??= new Set()).add(ep.stage);
    }
    this.nextReturnAt = next;
    if (leftOut === 0) {
      this.leftOut = 0;
      this.eligibleList = this.list;
      return;
    }
    const kept = this.list.filter((ep) => !this.leavesOut(ep, now) || keepsWholeStage(ep, served));
    this.leftOut = this.list.length - kept.length;
    this.eligibleList = this.leftOut === 0 ? this.list : Object.freeze(kept);
  }

  /**
   * A reload's outlier detection settings. The endpoints' runs of failures and ejections stay, but
   * an ejection running is cut to the new `maxEjectionTime`; turning detection off (0 failures)
   * ends every ejection and forgets the runs, `stallTimeout: 0` every stall.
   */
  setOutlierPolicy(policy: OutlierPolicy, now: number): void {
    this.outlierPolicy = policy;
    for (const ep of this.list) {
      if (policy.consecutiveFailures === 0) {
        ep.failureStreak = 0;
        ep.ejections = 0;
        ep.ejectedUntil = 0;
      } else if (ep.ejectedUntil > now + policy.maxEjectionTime) ep.ejectedUntil = now + policy.maxEjectionTime;
      // (With stallTimeout 0 a hold has run out already.)
      if (!policy.rescueInFlight) ep.gaveUpOnWorkAt = 0;
      if (policy.stallTimeout === 0 && ep.stalledFor !== undefined) {
        ep.stalledFor = undefined;
        this.onOutlier?.(ep, { kind: 'progressing' });
      }
    }
    this.eligibleStale = true;
    this.notify('outlier');
  }

  /** The silence window (ms) of a new metrics configuration (scraper.ts silenceWindowMs). */
  setSilenceWindow(ms: number): void {
    this.silenceMs = ms;
  }

  /**
   * A request to `ep` failed there (`error`: the kind counted in sluice_endpoint_upstream_errors_total):
   * one more in its run of failures, which may eject it (outlier.ts). At most `maxEjectionPercent` of
   * its stage is set aside at once.
   */
  upstreamFailed(ep: Endpoint, error: string, now: number): void {
    if (ep.removed) return;
    let stageSize = 0;
    let setAside = 0;
    for (const e of this.list) {
      if (e.stage !== ep.stage) continue;
      stageSize++;
      // Another endpoint whose probe is in flight is out too (eligible); this one, only if set aside.
      if (e === ep ? e.isSetAside(now) : this.leavesOut(e, now)) setAside++;
    }
    const ms = recordFailure(this.outlierPolicy, ep, now, setAside, stageSize);
    if (ms === 0) return;
    ep.ejectedFor = `${ep.failureStreak} failed requests in a row, the last: ${error}`;
    this.eligibleStale = true;
    this.onOutlier?.(ep, { kind: 'ejected', ms, reason: ep.ejectedFor });
    this.notify('outlier', ep);
  }

  /** A request to `ep` got its whole 2xx answer: its runs of failures and ejections end (outlier.ts). */
  upstreamSucceeded(ep: Endpoint): void {
    // Off probation: it takes any number of requests again.
    if (ep.ejections > 0) this.eligibleStale = true;
    recordSuccess(ep);
  }

  byName(name: string): Endpoint | undefined {
    return this.byNameMap.get(name);
  }

  /**
   * Applies a new endpoint list (config reload); the list is replaced when anything changed. An endpoint whose name, address and port are
   * unchanged keeps its object — metrics, error counts and in-flight count survive the reload, new
   * labels are applied to it (`relabelled`); anything else gets a fresh object. Endpoints that left
   * are marked `removed` (their in-flight requests still finish and release against the old object).
   * A removed endpoint whose requests are still in flight is taken back, counts and all, when the
   * same name, address and port return (a reverted edit): a fresh object would count them as 0.
   * Throws, changing nothing, on duplicate names/targets.
   */
  setEndpoints(specs: readonly EndpointSpec[]): { added: Endpoint[]; removed: Endpoint[]; relabelled: Endpoint[] } {
    checkUnique(specs);
    const added: Endpoint[] = [];
    const removed: Endpoint[] = [];
    const relabelled: Endpoint[] = [];
    const next: Endpoint[] = [];
    const kept = new Set<Endpoint>();
    for (const spec of specs) {
      let existing = this.byNameMap.get(spec.name);
      if (existing === undefined) {
        const gone = this.draining.get(spec.name);
        if (gone !== undefined && sameServer(gone, spec)) {
          // Back in the list, so the list changes and nothing below returns early.
          gone.removed = false;
          this.draining.delete(spec.name);
          existing = gone;
          added.push(gone);
        }
      }
      if (existing !== undefined && sameServer(existing, spec)) {
        if (!sameLabels(existing.labels, spec.labels) || existing.engineType !== engineTypeOf(spec.labels, spec.defaultEngine)) {
          existing.relabel(spec.labels, spec.defaultEngine);
          relabelled.push(existing);
        }
        next.push(existing);
        kept.add(existing);
      } else {
        const ep = new Endpoint(spec);
        next.push(ep);
        added.push(ep);
      }
    }
    for (const ep of this.list) {
      if (!kept.has(ep)) removed.push(ep);
    }
    // A server kept under a new name: the new endpoint takes over what is in flight on it, or a
    // limit counting Sluice's own requests (concurrency-detector) would let it take as many again.
    for (const ep of added) {
      const before = this.previousOnServer(ep, removed);
      if (before === undefined) continue;
      handOverInFlight(before, ep);
      if (this.draining.get(before.name) === before) this.draining.delete(before.name);
    }

    const orderChanged = next.length !== this.list.length || next.some((ep, k) => ep !== this.list[k]);
    // A new list also when only labels changed: what is cached per list (the stage partition) follows.
    if (!orderChanged && relabelled.length === 0) return { added, removed, relabelled };

    for (const ep of removed) {
      ep.removed = true;
      // Not scraped while out: a silence or a give-up before is no news of it when it is back.
      ep.unansweredSince = undefined;
      ep.gaveUpOnWorkAt = 0;
      if (ep.inFlight > 0 || ep.inFlightTokens > 0) this.draining.set(ep.name, ep);
    }
    this.byNameMap.clear();
    for (const ep of next) this.byNameMap.set(ep.name, ep);
    this.list = Object.freeze(next);
    // An endpoint set aside stays so in the new list (one taken back from draining too); one that
    // left is no longer counted.
    this.eligibleList = this.list;
    this.eligibleStale = true;
    this.recountModels();
    this.notify('endpoints');
    return { added, removed, relabelled };
  }

  /** Subscribes to changes; returns the unsubscribe function. */
  onChange(fn: PoolListener): () => void {
    this.listeners = [...this.listeners, fn];
    return () => {
      this.listeners = this.listeners.filter((l) => l !== fn);
    };
  }

  /**
   * Tells every listener. A throwing listener does not keep the others from hearing about the change;
   * the first error is rethrown once all have run.
   */
  notify(reason: PoolChangeReason, ep?: Endpoint): void {
    const listeners = this.listeners;
    let firstError: unknown;
    let failed = false;
    for (const fn of listeners) {
      try {
        fn(reason, ep);
      } catch (err) {
        if (!failed) {
          failed = true;
          firstError = err;
        }
      }
    }
    if (failed) throw firstError;
  }

  /**
   * A request was sent to `ep`. Returns whether it is a probe (sent while the endpoint is on
   * probation: eligible, onProbation), which its release must say.
   */
  acquire(ep: Endpoint): boolean {
    ep = current(ep);
    const probe = ep.ejections > 0 && this.onProbation(ep);
    if (probe) {
      ep.probes++;
      this.eligibleStale = true;
    }
    ep.inFlight++;
    ep.dispatched++;
    this.notify('inflight', ep);
    return probe;
  }

  /** `ep` was given a prompt to compute: `promptTokens` uncached tokens (scheduling/prompt-load.ts). */
  promptSent(ep: Endpoint, promptTokens: number, unseen = false): void {
    // Not a count (NaN, Infinity) would stay in the sum for good: ignored, as promptDone ignores it.
    if (!isTokenCount(promptTokens)) return;
    ep = current(ep);
    ep.inFlightTokens += promptTokens;
    if (unseen) ep.unseenPromptTokens += promptTokens;
    this.notify('inflight', ep);
  }

  /** `ep` is done with that prompt (the answer began, or the request ended first): once per promptSent. */
  promptDone(ep: Endpoint, promptTokens: number, unseen = false): void {
    if (!isTokenCount(promptTokens)) return;
    ep = current(ep);
    if (unseen) ep.unseenPromptTokens = Math.max(0, ep.unseenPromptTokens - promptTokens);
    if (ep.inFlightTokens < promptTokens) {
      this.releaseUnderflows++;
      this.onInvariantViolation?.(`prompt tokens released without being sent on endpoint '${ep.name}'`, ep);
    }
    ep.inFlightTokens = Math.max(0, ep.inFlightTokens - promptTokens);
    if (ep.removed) this.forgetIfIdle(ep);
    this.notify('inflight', ep);
  }

  /**
   * A request to `ep` finished (exactly once per acquire); `answered`: with a 2xx answer, which grows
   * a slow start (Endpoint.grownSlots); `probe`: what its acquire returned. Never takes the count
   * below zero.
   */
  release(ep: Endpoint, answered = false, probe = false): void {
    ep = current(ep);
    if (ep.inFlight <= 0) {
      this.releaseUnderflows++;
      this.onInvariantViolation?.(`release without a matching acquire on endpoint '${ep.name}'`, ep);
      return;
    }
    // Slow start (Endpoint.grownSlots): answered with every assumed slot in use and no queue ever
    // shown, so the server holds at least one more than assumed — up to twice the last page's.
    if (answered && ep.observedSlots === 0) {
      const slots = ep.slowStartSlots();
      if (ep.inFlight >= slots && slots < 2 * ep.slowStartAtScrape) ep.grownSlots = slots + 1;
    }
    ep.inFlight--;
    if (probe) {
      ep.probes = Math.max(0, ep.probes - 1);
      this.eligibleStale = true;
    }
    if (ep.removed) this.forgetIfIdle(ep);
    this.notify('inflight', ep);
  }

  /**
   * An endpoint that owes work while its page has not changed for stallTimeout is set aside, until a
   * page changes or it owes nothing (outlier.ts). `prev`: the page before `m`.
   */
  private checkProgress(ep: Endpoint, prev: EndpointMetrics | undefined, m: EndpointMetrics, now: number): void {
    // No work counters (trtllm-serve): its gauges alone could sit still on a busy server.
    const moved =
      m.progress === undefined ||
      prev === undefined ||
      m.progress !== prev.progress ||
      m.running !== prev.running ||
      m.waiting !== prev.waiting ||
      m.kvUsage !== prev.kvUsage;
    // Requests it should be working on: those its page shows running, and Sluice's whose answer has
    // not begun (a hung engine's page often froze idle), or that were given up on there while it
    // stalled; not a stream a slow client still drains.
    if (moved) ep.gaveUpOnWorkAt = 0;
    const gaveUpOnWork = ep.gaveUpOnWorkAt > 0 && now - ep.gaveUpOnWorkAt < this.outlierPolicy.stallTimeout;
    const owed = m.running > 0 || ep.inFlightTokens - ep.unseenPromptTokens > 0 || gaveUpOnWork;
    const ms = stalledMs(ep, moved, owed, now);
    const timeout = this.outlierPolicy.stallTimeout;
    const stalled = timeout > 0 && ms >= timeout;
    if (stalled === (ep.stalledFor !== undefined)) return;
    this.eligibleStale = true;
    if (stalled) {
      const work = m.running > 0 ? `${m.running} running` : 'requests sent and not answered';
      ep.stalledFor = `${work}, and its metrics page unchanged for ${formatDuration(Math.round(ms))}`;
      this.onOutlier?.(ep, { kind: 'stalled', reason: ep.stalledFor });
    } else {
      ep.stalledFor = undefined;
      this.onOutlier?.(ep, { kind: 'progressing' });
    }
  }

  /** A removed or draining endpoint of `ep`'s server under another name, with requests in flight. */
  private previousOnServer(ep: Endpoint, removed: readonly Endpoint[]): Endpoint | undefined {
    const onServer = (e: Endpoint): boolean => e !== ep && e.name !== ep.name && e.hostPort === ep.hostPort && (e.inFlight > 0 || e.inFlightTokens > 0);
    return removed.find(onServer) ?? [...this.draining.values()].find(onServer);
  }

  /** A removed endpoint is kept for its return only while it has something in flight. */
  private forgetIfIdle(ep: Endpoint): void {
    if (ep.inFlight === 0 && ep.inFlightTokens === 0 && this.draining.get(ep.name) === ep) this.draining.delete(ep.name);
  }

  /** A scrape of `ep` is being sent: what is sent from now on is not in its page. */
  scrapeStarted(ep: Endpoint): void {
    ep.dispatchedAtScrapeStart = ep.dispatched;
    ep.connectFailuresAtScrapeStart = ep.connectFailures;
  }

  /** A request could not connect to the endpoint: it reads as stale until a later scrape succeeds. */
  connectFailed(ep: Endpoint, error: string): void {
    ep.connectFailure = error;
    ep.connectFailures++;
  }

  /**
   * Stores a scrape outcome. Success: new metrics, `metricsAt = now`, error cleared. Failure: the last
   * good metrics stay with their old timestamp (so they age into staleness), the error is recorded
   * and counted. Results for endpoints no longer in the pool are dropped.
   */
  recordScrape(ep: Endpoint, result: ScrapeResult, now: number): void {
    if (ep.removed) return;
    if ('metrics' in result) {
      const prev = ep.metrics;
      ep.metrics = result.metrics;
      ep.metricsAt = now;
      // Requests sent after the scrape was cannot be in the page: they stay counted on top of it.
      // Which of them are still in flight is not known; at most all of them are (conservative:
      // one that already finished counts until the next scrape).
      const sentSince = ep.dispatched - ep.dispatchedAtScrapeStart;
      ep.inFlightAtScrape = ep.inFlight - Math.min(sentSince, ep.inFlight);
      const m = result.metrics;
      if (m.waiting > 0 && m.running > ep.observedSlots) ep.observedSlots = m.running;
      if (m.running > ep.peakRunning) ep.peakRunning = m.running;
      ep.slowStartAtScrape = ep.slowStartSlots();
      this.checkProgress(ep, prev, m, now);
      if (m.model !== undefined && m.model !== ep.servedModel) this.servesModel(ep, m.model);
      if (m.lora !== undefined && m.model !== undefined) {
        this.noteAdapters(m.lora.running, m.model);
        this.noteAdapters(m.lora.waiting, m.model);
      }
      ep.lastError = undefined;
      ep.unansweredSince = undefined;
      // A page fetched while a request was being refused says nothing about the server now.
      if (ep.connectFailures === ep.connectFailuresAtScrapeStart) ep.connectFailure = undefined;
    } else {
      ep.lastError = result.error;
      ep.scrapeErrors++;
      if (result.answered === true) ep.unansweredSince = undefined;
      else ep.unansweredSince ??= now;
    }
    this.rescueStuck(ep, now);
    this.notify('metrics', ep);
  }

  /**
   * With `rescueInFlight`, what is in flight on an endpoint that stalled, or went silent (its scrapes
   * got no answer at all for the silence window, counted from the first that got none), and that it
   * has said nothing of for as long (`stallTimeout`; the window), is given up on: its server would
   * most likely hold it until the upstream time-outs.
   * Looked at on every scrape of the endpoint, so that what is sent there later is too.
   */
  private rescueStuck(ep: Endpoint, now: number): void {
    if (ep.attempts.oldest === undefined || !this.outlierPolicy.rescueInFlight) return;
    let quietMs: number;
    let why: string;
    // Silent: its scrapes get no answer at all (an HTTP error is an answer: the server is there).
    // Read first: a stalled server that then went silent too is given the (shorter) silence window.
    const silentMs = ep.unansweredSince === undefined ? 0 : now - ep.unansweredSince;
    if (silentMs >= this.silenceMs) {
      quietMs = this.silenceMs;
      why = `silent (no answer to its metrics scrapes for ${formatDuration(Math.round(silentMs))})`;
    } else if (ep.stalledFor !== undefined) {
      quietMs = this.outlierPolicy.stallTimeout;
      why = `stalled (${ep.stalledFor})`;
    } else return;
    let stuck: InFlightAttempt[] | undefined;
    for (let a: InFlightAttempt | undefined = ep.attempts.oldest; a !== undefined; a = a.newer) if (now - a.heardAt >= quietMs) (stuck ??= []).push(a);
    // Each ends its own membership (abandon → release), so not while walking the list.
    if (stuck === undefined) return;
    let gaveUp = false;
    for (const a of stuck) gaveUp = a.abandon(why) || gaveUp;
    if (gaveUp && ep.stalledFor !== undefined) ep.gaveUpOnWorkAt = now;
  }
}

/** A positive, finite number of tokens. */
function isTokenCount(tokens: number): boolean {
  return tokens > 0 && tokens !== Infinity;
}
