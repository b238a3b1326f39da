/**
 * Every metric Sluice exposes on the metrics port (SPEC §9), defined in one place.
 *
 * Names and labels follow llm-d's EPP (`llm_d_epp_` prefix) so existing dashboards and alerts work
 * unchanged. Three kinds of recording:
 * - per request (proxy, scheduler): typed methods over cached labelled children, so the hot path
 *   does a Map lookup instead of building label objects;
 * - per endpoint (age, queue, in-flight): computed at scrape time from the pool, so nothing is
 *   recorded per request and removed endpoints simply disappear; the recorded per-endpoint series
 *   (attempts, errors, first byte) of a removed endpoint are exposed once more, then dropped;
 * - flow control: counters/histograms recorded by the flow controller through methods here, gauges
 *   (saturation, queue sizes, capacity) computed at scrape time from sources it registers.
 *
 * Label values a client controls (`model_name`, `target_model_name`, `fairness_id`) go through a
 * `LabelCap`, so a client cannot create unbounded series.
 */
import { FLOW_OUTCOMES, type FlowOutcome } from '../flowcontrol/types.js';
import {
  Counter,
  Gauge,
  Histogram,
  Registry,
  collectDefaultMetrics,
  type CounterConfiguration,
  type GaugeConfiguration,
  type HistogramConfiguration,
  type Metric,
} from 'prom-client';
import type { Endpoint, Stage } from '../datalayer/endpoint.js';
import type { PoolView } from '../plugins/registry.js';
import {
  PREVIOUS_RESPONSE_RESULTS,
  PREVIOUS_RESPONSE_SEARCH_RESULTS,
  type PreviousResponseResult,
  type PreviousResponseSearchResult,
} from '../proxy/stored-responses.js';

const ignore = (): void => undefined;

/** How long rendering /metrics runs before it lets requests through (render). */
const RENDER_SLICE_MS = 5;

/** Value used once a `LabelCap` is full. */
export const OVERFLOW_LABEL_VALUE = 'other';

/** Default number of distinct client-controlled label values before folding into `other`. */
export const DEFAULT_MAX_LABEL_VALUES = 1000;

/** Longest label value kept (longer values are truncated) — a 1 MB model name must not become a 1 MB series. */
export const MAX_LABEL_VALUE_LENGTH = 256;

/** Where a request is (`/debug/requests`) or was when its client went away (`sluice_request_cancelled_total{stage}`). */
const REQUEST_STAGES = ['queued', 'waiting_first_byte', 'streaming'] as const;
/** Metrics fresher than this count in the pool gauges until the gateway sets its readiness window (llm-d's 2 s). */
const DEFAULT_FRESH_MS = 2000;
export type RequestStage = (typeof REQUEST_STAGES)[number];

/**
 * The error codes the gateway itself answers with (flow control's 429, 502/504 upstream failures,
 * 503): counted from 0 for every model from its first request, so increase() sees their first burst.
 * Other codes (a model server's own 4xx/5xx) appear with their first event.
 */
const GATEWAY_ERROR_CODES = ['429', '502', '503', '504'] as const;

/** How a request failed at an endpoint (`sluice_endpoint_upstream_errors_total{error}`). */
const UPSTREAM_ERROR_KINDS = ['connect', 'reset', 'headers_timeout', 'body_timeout', 'failed', 'cut', 'http_5xx', 'stream_error', 'abandoned'] as const;
export type UpstreamErrorKind = (typeof UPSTREAM_ERROR_KINDS)[number];

/** The status of each answer the gateway gives a request before it counts as an inference request. */
const REJECTION_CODES = {
  invalid_request: '400',
  malformed_http: '400',
  unknown_route: '404',
  request_timeout: '408',
  body_too_large: '413',
  compressed_body: '415',
  expectation_failed: '417',
  headers_too_large: '431',
  too_many_pipelined: '429',
  shutting_down: '503',
} as const;
/** Why the gateway answered a request itself before knowing its model (sluice_request_rejected_total). */
export type RejectionReason = keyof typeof REJECTION_CODES;

/**
 * Maps a client-controlled label value to itself for the first `maxValues` distinct values and to
 * `other` afterwards. Admission is permanent (a series, once created, keeps its identity).
 */
export class LabelCap {
  private readonly admitted = new Set<string>();

  constructor(
    readonly maxValues: number = DEFAULT_MAX_LABEL_VALUES,
    readonly overflowValue: string = OVERFLOW_LABEL_VALUE,
    readonly maxLength: number = MAX_LABEL_VALUE_LENGTH,
  ) {
    if (!Number.isInteger(maxValues) || maxValues < 0) throw new RangeError(`maxValues must be a non-negative integer, got ${maxValues}`);
  }

  map(value: string): string {
    const v = value.length > this.maxLength ? value.slice(0, this.maxLength) : value;
    if (this.admitted.has(v)) return v;
    if (this.admitted.size >= this.maxValues) return this.overflowValue;
    this.admitted.add(v);
    return v;
  }

  /** Distinct values admitted so far (excluding the overflow value unless a client sent it literally). */
  get size(): number {
    return this.admitted.size;
  }
}

// ---------------------------------------------------------------------------------------------
// Buckets

/** Request latency and TTFT, seconds: 5 ms .. 1 h (LLM requests range from cached one-token answers to long generations). */
const LATENCY_BUCKETS_SECONDS = [
  0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180,
  240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
];
/** Token counts: powers of two up to 1Mi tokens (context windows). */
const TOKEN_BUCKETS = Array.from({ length: 21 }, (_, i) => 2 ** i);
/** In-process work (scheduling, a dispatch cycle): 10 µs .. 100 ms. */
const MICRO_BUCKETS_SECONDS = [
  0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
];
/** Time spent queued in flow control: llm-d's bounds (0.0001 … 60 s, the default TTL), then 120 and 300 s for longer TTLs. */
const QUEUE_BUCKETS_SECONDS = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

// ---------------------------------------------------------------------------------------------
// Hot-path metric types
//
// prom-client's labelled children build a label-hash string on every inc/observe (and check every
// label name). The per-request series below are plain objects updated with a few arithmetic
// operations; the metric registers itself in the prom-client registry and renders the same
// exposition as prom-client's Counter/Gauge/Histogram (a series appears once first updated).

type Labels = Record<string, string>;

/** A value a registry renders (the shape prom-client's Counter/Gauge `get()` produce). */
interface ValueSample {
  value: number;
  labels: Labels;
}

/** One labelled series of a FastCounter or FastGauge. */
export class ValueSeries {
  private active = false;
  private sample: ValueSample;

  /** @internal constructed by the metric */
  constructor(
    private readonly onFirstUse: (s: ValueSample) => void,
    labels: Labels,
    private readonly monotonic: boolean,
  ) {
    this.sample = { value: 0, labels };
  }

  inc(value = 1): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    if (this.monotonic && value < 0) throw new Error('It is not possible to decrease a counter');
    if (!this.active) this.activate();
    this.sample.value += value;
  }

  dec(value = 1): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    if (!this.active) this.activate();
    this.sample.value -= value;
  }

  private activate(): void {
    this.active = true;
    this.onFirstUse(this.sample);
  }

  /** @internal the metric was reset: the series is gone until updated again */
  clear(): void {
    this.active = false;
    this.sample = { value: 0, labels: this.sample.labels };
  }

  /** @internal the sample the metric renders for this series */
  current(): ValueSample {
    return this.sample;
  }
}

/** A labelled counter (or up/down gauge) with cached series objects; renders like prom-client's. */
class FastValueMetric<L extends string> {
  readonly aggregator = 'sum';
  private samples: ValueSample[] = [];
  private readonly series = new Map<string, ValueSeries>();
  private readonly addSample = (s: ValueSample): void => {
    this.samples.push(s);
  };

  constructor(
    readonly type: 'counter' | 'gauge',
    readonly name: string,
    readonly help: string,
    readonly labelNames: readonly L[],
    registry: Registry,
  ) {
    registry.registerMetric(this as unknown as Metric<string>);
  }

  /** The series of these label values (in `labelNames` order); create once and keep it. */
  labels(...values: string[]): ValueSeries {
    const key = values.join('\u0000');
    let s = this.series.get(key);
    if (s === undefined) {
      const labels: Labels = {};
      this.labelNames.forEach((n, i) => (labels[n] = values[i]!));
      s = new ValueSeries(this.addSample, labels, this.type === 'counter');
      this.series.set(key, s);
    }
    return s;
  }

  reset(): void {
    this.samples = [];
    for (const s of this.series.values()) s.clear();
  }

  /** Drops the series of these label values (in `labelNames` order) from the exposition. */
  remove(...values: string[]): void {
    const key = values.join('\u0000');
    const s = this.series.get(key);
    if (s === undefined) return;
    this.series.delete(key);
    const sample = s.current();
    this.samples = this.samples.filter((x) => x !== sample);
  }

  async get(): Promise<{ help: string; name: string; type: string; values: ValueSample[]; aggregator: string }> {
    return { help: this.help, name: this.name, type: this.type, values: this.samples.slice(), aggregator: this.aggregator };
  }
}

/** One labelled series of a FastHistogram. */
export class HistogramSeries {
  /** @internal */ active = false;
  /** @internal */ sum = 0;
  /** @internal */ count = 0;
  /** @internal observations per finite bucket, not cumulative */ readonly counts: Float64Array;

  /** @internal constructed by the metric */
  constructor(
    private readonly owner: FastHistogram<string>,
    readonly labels: Labels,
  ) {
    this.counts = new Float64Array(owner.upperBounds.length);
  }

  observe(value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    if (!this.active) {
      this.active = true;
      this.owner.activate(this);
    }
    this.sum += value;
    this.count++;
    const bounds = this.owner.upperBounds;
    for (let i = 0; i < bounds.length; i++) {
      if (value <= bounds[i]!) {
        this.counts[i]++;
        return;
      }
    }
  }

  /** @internal */
  clear(): void {
    this.active = false;
    this.sum = 0;
    this.count = 0;
    this.counts.fill(0);
  }
}

interface HistogramSample {
  labels: Record<string, string | number>;
  sharedLabels: Labels;
  value: number;
  metricName: string;
  exemplar: null | undefined;
}

/** A histogram with cached series objects; renders like prom-client's Histogram. */
class FastHistogram<L extends string> {
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  private active: HistogramSeries[] = [];
  private readonly series = new Map<string, HistogramSeries>();
  private readonly unlabelled: HistogramSeries | undefined;

  constructor(
    readonly name: string,
    readonly help: string,
    readonly labelNames: readonly L[],
    readonly upperBounds: readonly number[],
    registry: Registry,
  ) {
    registry.registerMetric(this as unknown as Metric<string>);
    // Like prom-client, a histogram without labels always has its (zero) series.
    if (labelNames.length === 0) {
      this.unlabelled = new HistogramSeries(this as FastHistogram<string>, {});
      this.activate(this.unlabelled);
      this.unlabelled.active = true;
    }
  }

  /** The series of these label values (in `labelNames` order); create once and keep it. */
  labels(...values: string[]): HistogramSeries {
    const key = values.join('\u0000');
    let s = this.series.get(key);
    if (s === undefined) {
      const labels: Labels = {};
      this.labelNames.forEach((n, i) => (labels[n] = values[i]!));
      s = new HistogramSeries(this as FastHistogram<string>, labels);
      this.series.set(key, s);
    }
    return s;
  }

  /** Observation on the histogram without labels. */
  observe(value: number): void {
    this.unlabelled!.observe(value);
  }

  /** @internal a series got its first observation */
  activate(s: HistogramSeries): void {
    this.active.push(s);
  }

  /** Drops the series of these label values (in `labelNames` order) from the exposition. */
  remove(...values: string[]): void {
    const key = values.join('\u0000');
    const s = this.series.get(key);
    if (s === undefined) return;
    this.series.delete(key);
    this.active = this.active.filter((x) => x !== s);
  }

  reset(): void {
    this.active = [];
    for (const s of this.series.values()) s.clear();
    if (this.unlabelled !== undefined) {
      this.unlabelled.clear();
      this.unlabelled.active = true;
      this.active.push(this.unlabelled);
    }
  }

  async getForPromString(): Promise<{ name: string; help: string; type: string; values: HistogramSample[]; aggregator: string }> {
    const values: HistogramSample[] = [];
    const bucket = `${this.name}_bucket`;
    for (const s of this.active) {
      let acc = 0;
      for (let i = 0; i < this.upperBounds.length; i++) {
        acc += s.counts[i]!;
        values.push({ labels: { le: this.upperBounds[i]! }, sharedLabels: s.labels, value: acc, metricName: bucket, exemplar: null });
      }
      values.push({ labels: { le: '+Inf' }, sharedLabels: s.labels, value: s.count, metricName: bucket, exemplar: null });
      values.push({ labels: {}, sharedLabels: s.labels, value: s.sum, metricName: `${this.name}_sum`, exemplar: undefined });
      values.push({ labels: {}, sharedLabels: s.labels, value: s.count, metricName: `${this.name}_count`, exemplar: undefined });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }

  async get(): Promise<{ name: string; help: string; type: string; values: Omit<HistogramSample, 'sharedLabels'>[]; aggregator: string }> {
    const data = await this.getForPromString();
    return {
      ...data,
      values: data.values.map(({ sharedLabels, labels, ...rest }) => ({ ...rest, labels: { ...labels, ...sharedLabels } })),
    };
  }
}

// ---------------------------------------------------------------------------------------------
// Public types

export type SaturationStage = Stage;

/** One plugin's approximate prefix index, read at scrape time (`llm_d_epp_prefix_indexer_size`). */
export interface PrefixIndexerSnapshot {
  name: string;
  type: string;
  /** (endpoint, block) entries. */
  size: number;
}

/** What the saturation detector reports, read at scrape time. */
export interface SaturationSnapshot {
  /** Per non-empty stage; an absent stage has no series. */
  stages: Partial<Record<SaturationStage, number>>;
  /** Effective value: max over non-empty stages. */
  global: number;
  /** Endpoints scored saturated because their metrics are missing or stale. */
  stale: number;
  /** Detector plugin name, the `detector` label. */
  detector: string;
}

/** Queue state per flow and per band, read at scrape time. */
export interface FlowControlSnapshot {
  flows: ReadonlyArray<{ fairnessId: string; priority: number; requests: number; bytes: number }>;
  /** Fraction (0..1+) of each band's capacity used by queued requests / bytes. */
  bands: ReadonlyArray<{ priority: number; requestsUtilization: number; bytesUtilization: number }>;
}

/** Flow-control outcome label values (SPEC §6): the controller's outcomes. */
export type FlowControlOutcome = FlowOutcome;

export type SchedulerAttemptStatus = 'success' | 'failure';

export interface GatewayMetricsOptions {
  /** The `inference_pool` label. */
  poolName: string;
  /** Live endpoint set, read at scrape time. */
  pool: () => PoolView;
  /** Clock in ms (for metrics ages). Default Date.now. */
  now?: () => number;
  /** Distinct client-controlled label values per label before `other`. Default 1000. */
  maxLabelValues?: number;
  /** Include prom-client's standard `process_*` / `nodejs_*` metrics. Default true. */
  defaultMetrics?: boolean;
  /** How long rendering /metrics runs before it lets requests through, ms. Default RENDER_SLICE_MS. */
  renderSliceMs?: number;
}

type CounterChild = ReturnType<Counter<string>['labels']>;
type GaugeChild = ReturnType<Gauge<string>['labels']>;
type HistogramChild = ReturnType<Histogram<string>['labels']>;

/**
 * The request-level series of one (model_name, target_model_name) pair, resolved once per request by
 * `GatewayMetrics.forModel`; every method is a cached-child update.
 */
export class ModelRequestMetrics {
  private readonly errorChildren = new Map<string, CounterChild>();
  private readonly errorCodeCap = new LabelCap(100);
  private readonly cancelChildren = new Map<RequestStage, CounterChild>();

  /** @internal constructed by GatewayMetrics */
  constructor(
    readonly modelName: string,
    readonly targetModelName: string,
    private readonly totalChild: ValueSeries,
    private readonly runningChild: ValueSeries,
    private readonly durationChild: HistogramSeries,
    private readonly ttftStreamingChild: HistogramSeries,
    private readonly ttftUnaryChild: HistogramSeries,
    private readonly inputTokensChild: HistogramSeries,
    private readonly outputTokensChild: HistogramSeries,
    private readonly errorCounter: Counter<'model_name' | 'target_model_name' | 'error_code'>,
    cancelCounter: Counter<'model_name' | 'target_model_name' | 'stage'>,
  ) {
    // From 0: a series made by its first event holds that whole burst in its first sample, which
    // rate() and increase() cannot see.
    for (const stage of REQUEST_STAGES) {
      const child = cancelCounter.labels(modelName, targetModelName, stage);
      child.inc(0);
      this.cancelChildren.set(stage, child);
    }
    for (const code of GATEWAY_ERROR_CODES) this.errorChild(code).inc(0);
  }

  /** A request for this model arrived (request_total++, request_running++). Pair with `ended()`. */
  started(): void {
    this.totalChild.inc();
    this.runningChild.inc();
  }

  /** The request is over, successfully or not (request_running--). */
  ended(): void {
    this.runningChild.dec();
  }

  /** The request failed; `code` is an HTTP status or an llm-d error code string. */
  error(code: string | number): void {
    this.errorChild(typeof code === 'number' ? String(code) : code).inc();
  }

  private errorChild(code: string): CounterChild {
    let child = this.errorChildren.get(code);
    if (child === undefined) {
      child = this.errorCounter.labels(this.modelName, this.targetModelName, this.errorCodeCap.map(code));
      this.errorChildren.set(code, child);
    }
    return child;
  }

  /** The client went away before its answer was complete, while the request was at `stage`. */
  cancelled(stage: RequestStage): void {
    this.cancelChildren.get(stage)!.inc();
  }

  /** End-to-end duration as the client saw it, seconds. */
  duration(seconds: number): void {
    this.durationChild.observe(seconds);
  }

  /** Time to first byte of the answer body (first token for streams), seconds. */
  ttft(seconds: number, streaming: boolean): void {
    (streaming ? this.ttftStreamingChild : this.ttftUnaryChild).observe(seconds);
  }

  /** Token counts from the response `usage`; either may be unknown. */
  tokens(input: number | undefined, output: number | undefined): void {
    if (input !== undefined && Number.isFinite(input)) this.inputTokensChild.observe(input);
    if (output !== undefined && Number.isFinite(output)) this.outputTokensChild.observe(output);
  }
}

/** Mean and population standard deviation of one scraped quantity over the pool. */
export interface PoolSpread {
  mean: number;
  stdDev: number;
}

/** llm-d's pool gauges: over the endpoints in the pool whose metrics are fresh. */
export interface PoolStats {
  readyEndpoints: number;
  /** Absent when no endpoint has fresh metrics. */
  kvCacheUtilization?: PoolSpread;
  queueSize?: PoolSpread;
  runningRequests?: PoolSpread;
}

function spread(values: readonly number[]): PoolSpread {
  let sum = 0;
  for (const v of values) sum += v;
  const mean = sum / values.length;
  let squares = 0;
  for (const v of values) squares += (v - mean) ** 2;
  return { mean, stdDev: Math.sqrt(squares / values.length) };
}

/**
 * The pool's averages and standard deviations of KV-cache usage, waiting and running requests, and
 * its ready endpoints: those in the pool whose last successful scrape is at most `freshMs` old (llm-d
 * counts pods with fresh metrics the same way).
 */
export function poolStats(endpoints: readonly Endpoint[], now: number, freshMs: number): PoolStats {
  const kv: number[] = [];
  const waiting: number[] = [];
  const running: number[] = [];
  for (const ep of endpoints) {
    const m = ep.metrics;
    if (ep.removed || m === undefined || ep.metricsAge(now) > freshMs) continue;
    kv.push(m.kvUsage);
    waiting.push(m.waiting);
    running.push(m.running);
  }
  if (kv.length === 0) return { readyEndpoints: 0 };
  return { readyEndpoints: kv.length, kvCacheUtilization: spread(kv), queueSize: spread(waiting), runningRequests: spread(running) };
}

/** All Sluice metrics on a private registry. */
export class GatewayMetrics {
  readonly registry = new Registry();
  private poolName: string;
  private readonly pool: () => PoolView;
  private readonly now: () => number;
  private readonly renderSliceMs: number;

  private readonly modelCap: LabelCap;
  private readonly targetModelCap: LabelCap;
  private readonly fairnessCap: LabelCap;
  private readonly maxModelPairs: number;

  private saturationSource: (() => SaturationSnapshot | undefined) | undefined;
  /** How recent an endpoint's metrics must be to count in the pool gauges (the gateway's readiness window). */
  private freshWindowMs: () => number = () => DEFAULT_FRESH_MS;
  private currentPoolStats: PoolStats = { readyEndpoints: 0 };
  private prefixIndexerSource: (() => Iterable<PrefixIndexerSnapshot>) | undefined;
  private flowControlSource: (() => FlowControlSnapshot | undefined) | undefined;
  private receivingSource: (() => { bodies: number; bytes: number }) | undefined;
  private storedResponsesSource: (() => number) | undefined;

  // Caches of labelled children, keyed by already-capped values (nested maps: no key-string building).
  private readonly modelPairs = new Map<string, Map<string, ModelRequestMetrics>>();
  private modelPairCount = 0;
  private readonly runningByModel = new Map<string, ValueSeries>();
  private readonly attemptChildren = new Map<SchedulerAttemptStatus, Map<string, ValueSeries>>();
  private readonly pollErrorChildren = new Map<string, CounterChild>();
  private readonly retryChildren = new Map<string, CounterChild>();
  private readonly ejectionChildren = new Map<string, CounterChild>();
  private readonly degradedChildren = new Map<string, ValueSeries>();
  private readonly firstByteSeries = new Map<string, HistogramSeries>();
  private readonly upstreamErrorChildren = new Map<string, Map<UpstreamErrorKind, CounterChild>>();
  /** Endpoints out of the pool at the previous exposition: their series go at the next one. */
  private retiring = new Set<string>();
  private readonly fcRequestChildren = new Map<string, Map<number, ValueSeries>>();
  private readonly fcQueueDurationChildren = new Map<string, Map<number, Map<string, HistogramSeries>>>();
  private readonly disaggChildren = new Map<string, Map<string, CounterChild>>();
  private readonly decisionCounters = new Map<string, Counter<'plugin_name' | 'outcome'>>();

  // --- request
  readonly requestTotal: FastValueMetric<'model_name' | 'target_model_name'>;
  readonly requestErrorTotal: Counter<'model_name' | 'target_model_name' | 'error_code'>;
  readonly requestCancelledTotal: Counter<'model_name' | 'target_model_name' | 'stage'>;
  readonly requestBodyIncompleteTotal: Counter<never>;
  readonly requestRejectedTotal: Counter<'reason' | 'code'>;
  readonly previousResponseRoutingTotal: Counter<'result'>;
  readonly previousResponseSearchTotal: Counter<'result'>;
  readonly requestDuration: FastHistogram<'model_name' | 'target_model_name'>;
  readonly requestTtft: FastHistogram<'model_name' | 'target_model_name' | 'streaming'>;
  readonly requestInputTokens: FastHistogram<'model_name' | 'target_model_name'>;
  readonly requestOutputTokens: FastHistogram<'model_name' | 'target_model_name'>;
  readonly requestRunning: FastValueMetric<'model_name'>;
  // --- scheduler
  readonly schedulerE2eDuration: FastHistogram<never>;
  readonly schedulerAttemptsTotal: FastValueMetric<'status' | 'endpoint_name'>;
  // --- prefix indexers (llm-d's approximate prefix cache metrics)
  readonly prefixIndexerSize: Gauge<'plugin_name' | 'plugin_type'>;
  readonly prefixIndexerHitRatio: FastHistogram<'plugin_name' | 'plugin_type'>;
  readonly prefixIndexerHitBytes: FastHistogram<'plugin_name' | 'plugin_type'>;
  // --- endpoints (scrape-time)
  readonly endpointMetricsAge: Gauge<'endpoint_name' | 'role'>;
  readonly perEndpointQueueSize: Gauge<'endpoint_name' | 'role'>;
  readonly endpointRunningRequests: Gauge<'endpoint_name' | 'role'>;
  readonly endpointKvCacheUsage: Gauge<'endpoint_name' | 'role'>;
  readonly endpointInflightRequests: Gauge<'endpoint_name' | 'role'>;
  readonly endpointInflightTokens: Gauge<'endpoint_name' | 'role'>;
  readonly datalayerPollErrorsTotal: Counter<'endpoint_name'>;
  readonly upstreamRetriesTotal: Counter<'endpoint_name'>;
  readonly endpointEjected: Gauge<'endpoint_name' | 'role'>;
  readonly endpointEjectionsTotal: Counter<'endpoint_name'>;
  readonly endpointFirstByteSeconds: FastHistogram<'endpoint_name'>;
  readonly endpointUpstreamErrorsTotal: Counter<'endpoint_name' | 'error'>;
  // --- configuration (Sluice's own; named like Prometheus' config_last_reload_successful)
  readonly configReloadsTotal: Counter<'result'>;
  readonly configLastReloadSuccessful: Gauge<string>;
  readonly configRestartPending: Gauge;
  readonly configInfo: Gauge<'digest'>;
  // --- flow control
  readonly poolSaturation: Gauge<'inference_pool' | 'stage'>;
  readonly staleEndpoints: Gauge<'detector'>;
  readonly queueSize: Gauge<'fairness_id' | 'priority' | 'inference_pool'>;
  readonly queueBytes: Gauge<'fairness_id' | 'priority' | 'inference_pool'>;
  readonly flowControlRequestsTotal: FastValueMetric<'outcome' | 'priority' | 'inference_pool'>;
  readonly requestQueueDuration: FastHistogram<'fairness_id' | 'priority' | 'outcome' | 'inference_pool'>;
  readonly dispatchCycleDuration: FastHistogram<never>;
  readonly affinityOvertakesTotal: Counter;
  readonly capacityUtilizationRequests: Gauge<'priority' | 'inference_pool'>;
  readonly capacityUtilizationBytes: Gauge<'priority' | 'inference_pool'>;
  readonly disaggDecisionTotal: Counter<'model_name' | 'decision_type'>;
  readonly pdDegradedTotal: FastValueMetric<'connector'>;

  constructor(opts: GatewayMetricsOptions) {
    this.poolName = opts.poolName;
    this.pool = opts.pool;
    this.now = opts.now ?? Date.now;
    this.renderSliceMs = opts.renderSliceMs ?? RENDER_SLICE_MS;
    const maxLabelValues = opts.maxLabelValues ?? DEFAULT_MAX_LABEL_VALUES;
    this.modelCap = new LabelCap(maxLabelValues);
    this.targetModelCap = new LabelCap(maxLabelValues);
    this.fairnessCap = new LabelCap(maxLabelValues);
    this.maxModelPairs = maxLabelValues;

    const registers = [this.registry];
    const counter = <L extends string>(c: CounterConfiguration<L>): Counter<L> => new Counter<L>({ ...c, registers });
    const gauge = <L extends string>(c: GaugeConfiguration<L>): Gauge<L> => new Gauge<L>({ ...c, registers });
    const histogram = <L extends string>(c: HistogramConfiguration<L>): Histogram<L> =>
      new Histogram<L>({ ...c, registers });
    const modelLabels = ['model_name', 'target_model_name'] as const;
    // The per-request series (see FastValueMetric / FastHistogram).
    const fastCounter = <L extends string>(c: { name: string; help: string; labelNames: readonly L[] }): FastValueMetric<L> =>
      new FastValueMetric<L>('counter', c.name, c.help, c.labelNames, this.registry);
    const fastHistogram = <L extends string>(c: { name: string; help: string; labelNames?: readonly L[]; buckets: readonly number[] }): FastHistogram<L> =>
      new FastHistogram<L>(c.name, c.help, c.labelNames ?? [], c.buckets, this.registry);

    this.requestTotal = fastCounter({
      name: 'llm_d_epp_request_total',
      help: 'Inference requests received, by requested model (model_name) and model sent upstream (target_model_name).',
      labelNames: modelLabels,
    });
    this.requestErrorTotal = counter({
      name: 'llm_d_epp_request_error_total',
      help: 'Inference requests that ended in an error, by model and error_code (the HTTP status sent to the client, e.g. 429, 503, or the code of the error event a model server ended a 200 stream with; not llm-d\'s error-code names).',
      labelNames: [...modelLabels, 'error_code'],
    });
    this.requestCancelledTotal = counter({
      name: 'sluice_request_cancelled_total',
      help: 'Inference requests whose client went away before the answer was complete, by where the request was: queued (in flow control or before an endpoint was chosen), waiting_first_byte (sent to an endpoint), streaming (part of the answer relayed). With request_error_total and the answered requests, accounts for request_total.',
      labelNames: [...modelLabels, 'stage'],
    });
    this.requestBodyIncompleteTotal = counter({
      name: 'sluice_request_body_incomplete_total',
      help: 'API requests whose connection ended before their whole body arrived: the client went away, or it was cut (408 past server.requestTimeout, 503 when the shutdown grace period ended). Not in request_total: the model is not known before the body is.',
    });
    const receiving: Gauge = gauge({
      name: 'sluice_request_bodies_receiving',
      help: 'API requests whose body is still arriving (not yet requests of a model): each holds what it sent so far, up to server.bodyLimit, until it is whole or server.requestTimeout cuts it.',
      collect: (): void => receiving.set(this.receivingSource?.().bodies ?? 0),
    });
    const receivingBytes: Gauge = gauge({
      name: 'sluice_request_body_bytes_receiving',
      help: 'Bytes held for request bodies still arriving (outside flowControl.maxBytes, which counts queued requests).',
      collect: (): void => receivingBytes.set(this.receivingSource?.().bytes ?? 0),
    });
    this.requestRejectedTotal = counter({
      name: 'sluice_request_rejected_total',
      help: 'Requests the gateway answered itself before they counted as inference requests (no model known yet, so not in request_total or request_error_total), by reason and the HTTP status sent: invalid_request 400 (invalid JSON or fields), malformed_http 400 (not parseable HTTP), unknown_route 404, request_timeout 408, body_too_large 413, compressed_body 415, expectation_failed 417, headers_too_large 431, too_many_pipelined 429 (more than server.maxPipelinedRequests pipelined on one connection waiting for their answers), shutting_down 503 (arrived during the drain).',
      labelNames: ['reason', 'code'],
    });
    // Every series from the start, so a rate over them reads 0 rather than nothing.
    for (const [reason, code] of Object.entries(REJECTION_CODES)) this.requestRejectedTotal.inc({ reason, code }, 0);
    this.previousResponseRoutingTotal = counter({
      name: 'sluice_previous_response_routing_total',
      help: 'Responses API requests with a previous_response_id, by what Sluice knew of the server holding that response: pinned (sent there, whatever the scorers said), unknown (no stored response of that id relayed by this gateway, or forgotten past server.storedResponses), unavailable (that server left the pool). An unknown or unavailable one is scheduled as usual, and a server answering that it does not hold the response is passed over for the next (sluice_previous_response_search_total).',
      labelNames: ['result'],
    });
    for (const result of PREVIOUS_RESPONSE_RESULTS) this.previousResponseRoutingTotal.inc({ result }, 0);
    this.previousResponseSearchTotal = counter({
      name: 'sluice_previous_response_search_total',
      help: 'Responses API requests continuing a response this gateway knew no server for, whose first server answered 404 that it does not hold it (or whose known server could not be reached), by how the search over the other servers of the model ended: found (another server answered 2xx; it is remembered), not_found (none holds it, or could be reached: the last 404 relayed). A search that ended otherwise (the client left, connection failures past upstream.retries, an error answer relayed) is not counted.',
      labelNames: ['result'],
    });
    for (const result of PREVIOUS_RESPONSE_SEARCH_RESULTS) this.previousResponseSearchTotal.inc({ result }, 0);
    const storedResponses: Gauge = gauge({
      name: 'sluice_stored_responses',
      help: 'Stored Responses API answers whose server the gateway remembers (at most server.storedResponses), for the requests continuing them (previous_response_id).',
      collect: (): void => storedResponses.set(this.storedResponsesSource?.() ?? 0),
    });
    this.requestDuration = fastHistogram({
      name: 'llm_d_epp_request_duration_seconds',
      help: 'End-to-end request latency in seconds, from arrival at the gateway to the last byte of the answer (includes queueing).',
      labelNames: modelLabels,
      buckets: LATENCY_BUCKETS_SECONDS,
    });
    this.requestTtft = fastHistogram({
      name: 'llm_d_epp_request_ttft_seconds',
      help: 'Time to first token in seconds, from arrival at the gateway to the first answer byte relayed (streaming="true": first SSE event; of a Responses API stream, the first past response.created and response.in_progress).',
      labelNames: [...modelLabels, 'streaming'],
      buckets: LATENCY_BUCKETS_SECONDS,
    });
    this.requestInputTokens = fastHistogram({
      name: 'llm_d_epp_request_input_tokens',
      help: 'Prompt tokens per request (usage.prompt_tokens of the answer; input_tokens of a Responses API answer), in tokens.',
      labelNames: modelLabels,
      buckets: TOKEN_BUCKETS,
    });
    this.requestOutputTokens = fastHistogram({
      name: 'llm_d_epp_request_output_tokens',
      help: 'Generated tokens per request (usage.completion_tokens of the answer; output_tokens of a Responses API answer; none for an answer without a count, such as embeddings), in tokens.',
      labelNames: modelLabels,
      buckets: TOKEN_BUCKETS,
    });
    this.requestRunning = new FastValueMetric(
      'gauge',
      'llm_d_epp_request_running',
      'Requests currently being handled by the gateway (queued or in flight upstream), by requested model.',
      ['model_name'],
      this.registry,
    );

    this.schedulerE2eDuration = fastHistogram({
      name: 'llm_d_epp_scheduler_e2e_duration_seconds',
      help: 'Time in seconds to run the scheduler for one request (profiles: filters, scorers, picker).',
      buckets: MICRO_BUCKETS_SECONDS,
    });
    const pluginLabels = ['plugin_name', 'plugin_type'] as const;
    this.prefixIndexerSize = gauge({
      name: 'llm_d_epp_prefix_indexer_size',
      help: 'Entries in the approximate prefix index: (endpoint, block) pairs it remembers, summed over endpoints.',
      labelNames: pluginLabels,
      collect: () => this.collectPrefixIndexers(),
    });
    this.prefixIndexerHitRatio = fastHistogram({
      name: 'llm_d_epp_prefix_indexer_hit_ratio',
      help: "Per scheduled request: the share of its prompt's blocks the index believed the chosen endpoint to cache, before learning them (0–1; prompts shorter than one block are left out).",
      labelNames: pluginLabels,
      buckets: [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1],
    });
    this.prefixIndexerHitBytes = fastHistogram({
      name: 'llm_d_epp_prefix_indexer_hit_bytes',
      help: 'Per scheduled request: the prompt length the index believed the chosen endpoint to cache, in bytes estimated as matched blocks × blockSizeTokens × 4 (as llm-d).',
      labelNames: pluginLabels,
      buckets: [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
    });
    this.schedulerAttemptsTotal = fastCounter({
      name: 'llm_d_epp_scheduler_attempts_total',
      help: 'Scheduling attempts by status (success|failure) and the endpoint picked (empty on failure).',
      labelNames: ['status', 'endpoint_name'],
    });
    // From the start: rate() sees the first requests no profile could place (SluiceSchedulingRefused).
    cachedChild2(this.attemptChildren, this.schedulerAttemptsTotal, 'failure', '').inc(0);

    // llm-d's pool gauges, from the stats text() takes once per scrape.
    const poolGauge = (name: string, help: string, value: (s: PoolStats) => number | undefined): void => {
      const g: Gauge<'name'> = gauge({
        name,
        help,
        labelNames: ['name'],
        collect: () => {
          g.reset();
          const v = value(this.currentPoolStats);
          if (v !== undefined) g.set({ name: this.poolName }, v);
        },
      });
    };
    const fresh = 'over the endpoints with fresh metrics (no series while none has)';
    poolGauge('llm_d_epp_average_kv_cache_utilization', `Mean KV-cache usage (0-1) ${fresh}.`, (s) => s.kvCacheUtilization?.mean);
    poolGauge('llm_d_epp_average_queue_size', `Mean of the requests waiting in the model servers' own queues ${fresh}.`, (s) => s.queueSize?.mean);
    poolGauge('llm_d_epp_average_running_requests', `Mean of the requests the model servers run ${fresh}.`, (s) => s.runningRequests?.mean);
    poolGauge('llm_d_epp_std_dev_kv_cache_utilization', `Standard deviation of KV-cache usage ${fresh}.`, (s) => s.kvCacheUtilization?.stdDev);
    poolGauge('llm_d_epp_std_dev_queue_size', `Standard deviation of the model servers' waiting requests ${fresh}.`, (s) => s.queueSize?.stdDev);
    poolGauge('llm_d_epp_std_dev_running_requests', `Standard deviation of the model servers' running requests ${fresh}.`, (s) => s.runningRequests?.stdDev);
    poolGauge('llm_d_epp_ready_endpoints', 'Endpoints in the pool whose metrics are fresh (scraped within the gateway\'s readiness window).', (s) => s.readyEndpoints);

    // Endpoint gauges are recomputed from the pool at every scrape (reset first, so removed endpoints vanish).
    const endpointGauge = (name: string, help: string, value: (ep: Endpoint, now: number) => number | undefined): Gauge<'endpoint_name' | 'role'> => {
      const g: Gauge<'endpoint_name' | 'role'> = gauge({ name, help, labelNames: ['endpoint_name', 'role'], collect: () => this.collectEndpointGauge(g, value) });
      return g;
    };
    this.endpointMetricsAge = endpointGauge(
      'llm_d_epp_endpoint_metrics_age_seconds',
      'Age in seconds of the last successful scrape of the endpoint\'s /metrics; -1 means never scraped successfully.',
      (ep, now) => (ep.metricsAt === 0 ? -1 : Math.max(0, now - ep.metricsAt) / 1000),
    );
    const asScraped = 'as last scraped; no series until the first successful scrape.';
    this.perEndpointQueueSize = endpointGauge(
      'llm_d_epp_per_endpoint_queue_size',
      `Requests waiting in the endpoint's own queue (vllm:num_requests_waiting) ${asScraped}`,
      (ep) => ep.metrics?.waiting,
    );
    this.endpointRunningRequests = endpointGauge(
      'sluice_endpoint_running_requests',
      `Requests the endpoint runs (vllm:num_requests_running) ${asScraped}`,
      (ep) => ep.metrics?.running,
    );
    this.endpointKvCacheUsage = endpointGauge(
      'sluice_endpoint_kv_cache_usage_ratio',
      `KV-cache usage of the endpoint (vllm:kv_cache_usage_perc, 0-1), what the utilization detector compares with kvCacheUtilThreshold, ${asScraped}`,
      (ep) => ep.metrics?.kvUsage,
    );
    this.endpointInflightRequests = endpointGauge(
      'llm_d_epp_endpoint_inflight_requests',
      'Requests the gateway currently has outstanding on the endpoint.',
      (ep) => ep.inFlight,
    );
    this.endpointInflightTokens = endpointGauge(
      'llm_d_epp_inflight_tokens',
      'Uncached prompt tokens the gateway has sent the endpoint whose answer has not begun (its prefill backlog, as llm-d\'s in-flight load producer counts it).',
      (ep) => ep.inFlightTokens,
    );
    this.endpointEjected = endpointGauge(
      'sluice_endpoint_ejected',
      '1 while outlier detection sets the endpoint aside (server.upstream.outlierDetection): ejected for failing request after request, until the ejection runs out, or stalled (work owed and its metrics page unchanged for stallTimeout), until the page changes; it gets no requests then, unless every endpoint of its stage is set aside. Else 0.',
      (ep, now) => (ep.isSetAside(now) ? 1 : 0),
    );
    this.endpointEjectionsTotal = counter({
      name: 'sluice_endpoint_ejections_total',
      help: 'Times the endpoint was set aside for failing server.upstream.outlierDetection.consecutiveFailures requests in a row (5xx, time-outs, lost or refused connections).',
      labelNames: ['endpoint_name'],
    });
    this.datalayerPollErrorsTotal = counter({
      name: 'llm_d_epp_datalayer_poll_errors_total',
      help: 'Failed scrapes of an endpoint\'s /metrics (connection error, time-out, bad status or unparsable page).',
      labelNames: ['endpoint_name'],
    });
    this.endpointFirstByteSeconds = fastHistogram({
      name: 'sluice_endpoint_first_byte_seconds',
      help: 'Time from sending a request to the endpoint to its first answer byte: the model server\'s own time to first token plus the network, without the gateway\'s queue (a P/D decode leg: from sending that leg).',
      labelNames: ['endpoint_name'],
      buckets: LATENCY_BUCKETS_SECONDS,
    });
    this.endpointUpstreamErrorsTotal = counter({
      name: 'sluice_endpoint_upstream_errors_total',
      help: 'Requests to the endpoint that failed there, by error: connect (no connection; retried elsewhere when possible), reset (the connection was lost before any answer byte: retried elsewhere too, though the server may have begun the work), headers_timeout (504), body_timeout (the answer stalled past upstream.bodyTimeout: 504), failed (another error before an answer: 502; a prefill leg answered 2xx with no JSON object), cut (the answer broke off mid-way: 502), http_5xx (the endpoint answered 5xx, relayed), stream_error (a 2xx stream the endpoint ended with an error event of code 5xx, relayed: how vLLM reports a generation that failed after its status line).',
      labelNames: ['endpoint_name', 'error'],
    });
    this.upstreamRetriesTotal = counter({
      name: 'llm_d_epp_upstream_retries_total',
      help: 'Requests retried because the connection to this endpoint failed before any byte reached the client: on another endpoint, or once more on this one when it lost (not refused) the connection and no other was left.',
      labelNames: ['endpoint_name'],
    });
    this.configReloadsTotal = counter({
      name: 'sluice_config_reloads_total',
      help: 'Configuration reloads (SIGHUP or a change of the file), by result: success (applied) or failure (rejected, the previous configuration keeps serving).',
      labelNames: ['result'],
    });
    this.configLastReloadSuccessful = gauge({
      name: 'sluice_config_last_reload_successful',
      help: '1 when the configuration file last read was valid and is in force, 0 when the last reload was rejected.',
    });
    this.configLastReloadSuccessful.set(1);
    // Both series from the start: increase() sees the first failure, and an alert on it has a series.
    for (const result of ['success', 'failure']) this.configReloadsTotal.labels(result).inc(0);
    this.configInfo = gauge({
      name: 'sluice_config_info',
      help: 'Always 1; its digest label identifies the configuration in force (the digest line `sluice validate` prints for the file).',
      labelNames: ['digest'],
    });
    this.configRestartPending = gauge({
      name: 'sluice_config_restart_pending',
      help: '1 when the configuration in force asks for settings only a restart applies (ports, host, request time-outs), which therefore still run as the process started; 0 otherwise.',
    });
    this.configRestartPending.set(0);

    this.poolSaturation = gauge({
      name: 'llm_d_epp_flow_control_pool_saturation',
      help:
        'Saturation of the inference pool per stage (prefill, decode, interleaved; global = max over non-empty stages), dimensionless. ' +
        '1.0 is the gating set point; values above 1.0 are the magnitude of oversubscription; ' +
        'an empty pool and stale metrics read 1.0 (fail closed). Empty stages have no series.',
      labelNames: ['inference_pool', 'stage'],
      collect: () => this.collectSaturation(),
    });
    this.staleEndpoints = gauge({
      name: 'llm_d_epp_flow_control_stale_endpoints',
      help: 'Endpoints the saturation detector scored as saturated (with stalenessPolicy ignore: left out) because their metrics are missing or stale, as of its latest evaluation.',
      labelNames: ['detector'],
      collect: () => this.collectStaleEndpoints(),
    });
    const flowLabels = ['fairness_id', 'priority', 'inference_pool'] as const;
    this.queueSize = gauge({
      name: 'llm_d_epp_flow_control_queue_size',
      help: 'Requests currently queued in flow control, per flow (fairness_id, priority).',
      labelNames: flowLabels,
      collect: () => this.collectFlowGauge(this.queueSize, 'requests'),
    });
    this.queueBytes = gauge({
      name: 'llm_d_epp_flow_control_queue_bytes',
      help: 'Request body bytes currently queued in flow control, per flow (fairness_id, priority).',
      labelNames: flowLabels,
      collect: () => this.collectFlowGauge(this.queueBytes, 'bytes'),
    });
    this.flowControlRequestsTotal = fastCounter({
      name: 'llm_d_epp_flow_control_requests_total',
      help: 'Requests that left flow control, by outcome (Dispatched, Rejected*, Evicted*) and priority.',
      labelNames: ['outcome', 'priority', 'inference_pool'],
    });
    this.requestQueueDuration = fastHistogram({
      name: 'llm_d_epp_flow_control_request_queue_duration_seconds',
      help: 'Time in seconds a request spent in flow control before its outcome, by flow and outcome.',
      labelNames: ['fairness_id', 'priority', 'outcome', 'inference_pool'],
      buckets: QUEUE_BUCKETS_SECONDS,
    });
    this.dispatchCycleDuration = fastHistogram({
      name: 'llm_d_epp_flow_control_dispatch_cycle_duration_seconds',
      help: 'Time in seconds of one flow-control dispatch run: saturation, ceilings and the cycles that dispatch heads of bands until the gate closes or the queue empties, including the synchronous start (scheduling, upstream request) of each request dispatched.',
      buckets: MICRO_BUCKETS_SECONDS,
    });
    this.affinityOvertakesTotal = counter({
      name: 'sluice_flow_control_affinity_overtakes_total',
      help: 'Requests dispatched ahead of earlier requests of their flow, because those would rather wait for a saturated endpoint that suits them clearly better (flowControl.affinityLookahead).',
    });
    this.capacityUtilizationRequests = gauge({
      name: 'llm_d_epp_flow_control_capacity_utilization_requests',
      help: 'Fraction of the priority band\'s request capacity (maxRequests) used by queued requests; 0 when unlimited.',
      labelNames: ['priority', 'inference_pool'],
      collect: () => this.collectBandGauge(this.capacityUtilizationRequests, 'requestsUtilization'),
    });
    this.capacityUtilizationBytes = gauge({
      name: 'llm_d_epp_flow_control_capacity_utilization_bytes',
      help: 'Fraction of the priority band\'s byte capacity (maxBytes) used by queued requests; 0 when unlimited.',
      labelNames: ['priority', 'inference_pool'],
      collect: () => this.collectBandGauge(this.capacityUtilizationBytes, 'bytesUtilization'),
    });
    this.disaggDecisionTotal = counter({
      name: 'llm_d_epp_disagg_decision_total',
      help: 'Prefill/decode disaggregation decisions of the profile handler, by model and decision_type.',
      labelNames: ['model_name', 'decision_type'],
    });
    this.pdDegradedTotal = fastCounter({
      name: 'sluice_pd_degraded_total',
      help: 'Requests disaggregated by the profile handler that were served decode-only after all (a prefill leg that failed, timed out or answered without kv_transfer_params; a body the connector could not rewrite), by connector. Counted as prefill-decode in llm_d_epp_disagg_decision_total.',
      labelNames: ['connector'],
    });

    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /**
   * The Prometheus text exposition of every metric. Pages are rendered one after another: a render
   * yields between families (render), and a second scrape sweeping removed endpoints or taking new
   * pool stats meanwhile would take them out of the page under way.
   */
  text(): Promise<string> {
    const page = this.rendering.then(() => this.renderPage());
    this.rendering = page.then(ignore, ignore); // holds no page: a large one is megabytes
    return page;
  }

  /** Settles when the page being rendered (if any) is done. */
  private rendering: Promise<void> = Promise.resolve();

  private renderPage(): Promise<string> {
    const { endpoints } = this.pool();
    this.currentPoolStats = poolStats(endpoints, this.now(), this.freshWindowMs());
    const live = new Set<string>();
    for (const ep of endpoints) if (!ep.removed) live.add(ep.name);
    this.sweepRemovedEndpoints(live);
    this.endpointFailuresFromZero(live);
    return this.render();
  }

  /**
   * The registry's text, family by family, yielding to the event loop every renderSliceMs: a page of
   * a few hundred thousand series (client-chosen model names and fairness ids, up to their caps) took
   * 0.8 s to render at once, and every request and stream waited that long at each scrape.
   */
  private async render(): Promise<string> {
    const parts: string[] = [];
    let sliceStart = performance.now();
    for (const metric of this.registry.getMetricsAsArray()) {
      parts.push(await this.registry.getSingleMetricAsString(metric.name));
      if (performance.now() - sliceStart < this.renderSliceMs) continue;
      await new Promise<void>((resolve) => setImmediate(resolve));
      sliceStart = performance.now();
    }
    // As Registry.metrics() joins them (text format 0.0.4).
    return `${parts.join('\n\n')}\n`;
  }

  /**
   * Each endpoint's failure counters (scrape errors, upstream errors by kind, retries) counted from
   * 0 before its first failure: a series made by its first event holds that whole burst in its
   * first sample, which rate() and increase() cannot see.
   */
  private endpointFailuresFromZero(live: ReadonlySet<string>): void {
    for (const name of live) {
      if (!this.pollErrorChildren.has(name)) cachedCounterChild(this.pollErrorChildren, this.datalayerPollErrorsTotal, name).inc(0);
      if (!this.retryChildren.has(name)) cachedCounterChild(this.retryChildren, this.upstreamRetriesTotal, name).inc(0);
      if (!this.ejectionChildren.has(name)) cachedCounterChild(this.ejectionChildren, this.endpointEjectionsTotal, name).inc(0);
      const kinds = this.upstreamErrorChildren.get(name);
      if (kinds?.size === UPSTREAM_ERROR_KINDS.length) continue;
      for (const kind of UPSTREAM_ERROR_KINDS) if (!kinds?.has(kind)) cachedChild2(this.upstreamErrorChildren, this.endpointUpstreamErrorsTotal, name, kind).inc(0);
    }
  }

  /**
   * The recorded per-endpoint series (counters, first-byte histogram) of an endpoint that left the
   * pool are exposed once more with their last values, then dropped, so a fleet whose endpoints
   * come and go does not grow the exposition for ever. A late event of a removed endpoint (a
   * stream that ends after the reload) makes its series again: exposed once, dropped the same way.
   */
  private sweepRemovedEndpoints(live: ReadonlySet<string>): void {
    const gone = new Set<string>();
    const note = (names: Iterable<string>): void => {
      for (const name of names) if (name !== '' && !live.has(name)) gone.add(name);
    };
    for (const byEndpoint of this.attemptChildren.values()) note(byEndpoint.keys());
    note(this.pollErrorChildren.keys());
    note(this.retryChildren.keys());
    note(this.ejectionChildren.keys());
    note(this.firstByteSeries.keys());
    note(this.upstreamErrorChildren.keys());
    for (const name of this.retiring) {
      if (!gone.has(name)) continue;
      gone.delete(name);
      this.forgetEndpoint(name);
    }
    this.retiring = gone;
  }

  private forgetEndpoint(name: string): void {
    for (const [status, byEndpoint] of this.attemptChildren) {
      if (byEndpoint.delete(name)) this.schedulerAttemptsTotal.remove(status, name);
    }
    if (this.pollErrorChildren.delete(name)) this.datalayerPollErrorsTotal.remove(name);
    if (this.retryChildren.delete(name)) this.upstreamRetriesTotal.remove(name);
    if (this.ejectionChildren.delete(name)) this.endpointEjectionsTotal.remove(name);
    if (this.firstByteSeries.delete(name)) this.endpointFirstByteSeconds.remove(name);
    for (const error of this.upstreamErrorChildren.get(name)?.keys() ?? []) this.endpointUpstreamErrorsTotal.remove(name, error);
    this.upstreamErrorChildren.delete(name);
  }

  /** The `inference_pool` label changes on a config reload that renames the pool. */
  setPoolName(name: string): void {
    if (name === this.poolName) return;
    this.dropUnusedBandSeries(new Set()); // the old name's counters that never counted anything
    this.poolName = name;
    this.fcRequestChildren.clear();
    this.fcQueueDurationChildren.clear();
  }

  /** How recent an endpoint's metrics must be to count in the pool gauges, ms (read at each scrape). */
  setFreshWindow(ms: () => number): void {
    this.freshWindowMs = ms;
  }

  setSaturationSource(source: (() => SaturationSnapshot | undefined) | undefined): void {
    this.saturationSource = source;
  }

  /** Request bodies still arriving: how many, and their bytes so far. */
  setReceivingSource(source: () => { bodies: number; bytes: number }): void {
    this.receivingSource = source;
  }

  /** How many stored Responses API answers' servers are remembered, read at scrape time. */
  setStoredResponsesSource(source: () => number): void {
    this.storedResponsesSource = source;
  }

  /** The prefix indexers in force (the plugins keeping an approximate prefix index), read at scrape time. */
  setPrefixIndexerSource(source: (() => Iterable<PrefixIndexerSnapshot>) | undefined): void {
    this.prefixIndexerSource = source;
  }

  /**
   * Records one scheduled request's expected prefix hit for plugin `pluginName` (llm-d's
   * `prefix_indexer_hit_ratio` / `_hit_bytes`); the returned function is bound to its series.
   */
  prefixIndexerMatch(pluginName: string, pluginType: string): (matchedBytes: number, totalBytes: number) => void {
    const ratio = this.prefixIndexerHitRatio.labels(pluginName, pluginType);
    const bytes = this.prefixIndexerHitBytes.labels(pluginName, pluginType);
    return (matchedBytes, totalBytes) => {
      bytes.observe(matchedBytes);
      if (totalBytes > 0) ratio.observe(matchedBytes / totalBytes);
    };
  }

  setFlowControlSource(source: (() => FlowControlSnapshot | undefined) | undefined): void {
    this.flowControlSource = source;
  }

  // ----------------------------------------------------------------------------- per request

  /**
   * The request series for a model pair; call once per request and keep the result. Client-controlled
   * names are capped; past the cap of distinct pairs every new pair maps to (`other`, `other`).
   */
  forModel(modelName: string, targetModelName: string = modelName): ModelRequestMetrics {
    let model = this.modelCap.map(modelName);
    let target = this.targetModelCap.map(targetModelName);
    let byTarget = this.modelPairs.get(model);
    let series = byTarget?.get(target);
    if (series !== undefined) return series;
    if (this.modelPairCount >= this.maxModelPairs) {
      model = OVERFLOW_LABEL_VALUE;
      target = OVERFLOW_LABEL_VALUE;
      byTarget = this.modelPairs.get(model);
      series = byTarget?.get(target);
      if (series !== undefined) return series;
    }
    if (byTarget === undefined) {
      byTarget = new Map();
      this.modelPairs.set(model, byTarget);
    }
    series = new ModelRequestMetrics(
      model,
      target,
      this.requestTotal.labels(model, target),
      this.runningFor(model),
      this.requestDuration.labels(model, target),
      this.requestTtft.labels(model, target, 'true'),
      this.requestTtft.labels(model, target, 'false'),
      this.requestInputTokens.labels(model, target),
      this.requestOutputTokens.labels(model, target),
      this.requestErrorTotal,
      this.requestCancelledTotal,
    );
    byTarget.set(target, series);
    this.modelPairCount++;
    return series;
  }

  private runningFor(cappedModel: string): ValueSeries {
    let child = this.runningByModel.get(cappedModel);
    if (child === undefined) {
      child = this.requestRunning.labels(cappedModel);
      this.runningByModel.set(cappedModel, child);
    }
    return child;
  }

  /** Duration of one scheduling run, seconds. */
  schedulerDuration(seconds: number): void {
    this.schedulerE2eDuration.observe(seconds);
  }

  /** One scheduling attempt; `endpointName` is the primary pick ('' on failure). */
  schedulerAttempt(status: SchedulerAttemptStatus, endpointName = ''): void {
    cachedChild2(this.attemptChildren, this.schedulerAttemptsTotal, status, endpointName).inc();
  }

  /** A failed scrape of the endpoint's /metrics. */
  scrapeError(endpointName: string): void {
    cachedCounterChild(this.pollErrorChildren, this.datalayerPollErrorsTotal, endpointName).inc();
  }

  /** First answer byte from the endpoint, `seconds` after the request was sent to it. */
  endpointFirstByte(endpointName: string, seconds: number): void {
    let series = this.firstByteSeries.get(endpointName);
    if (series === undefined) {
      series = this.endpointFirstByteSeconds.labels(endpointName);
      this.firstByteSeries.set(endpointName, series);
    }
    series.observe(seconds);
  }

  /** A request failed at the endpoint (error paths only). */
  endpointUpstreamError(endpointName: string, error: UpstreamErrorKind): void {
    cachedChild2(this.upstreamErrorChildren, this.endpointUpstreamErrorsTotal, endpointName, error).inc();
  }

  /** An API request's connection ended before its whole body arrived. */
  bodyIncomplete(): void {
    this.requestBodyIncompleteTotal.inc();
  }

  /** The gateway refused a request before it counted as an inference request. */
  requestRejected(reason: RejectionReason): void {
    this.requestRejectedTotal.inc({ reason, code: REJECTION_CODES[reason] });
  }

  /** What was known of the server holding the response a request continues (stored-responses.ts). */
  previousResponseRouting(result: PreviousResponseResult): void {
    this.previousResponseRoutingTotal.inc({ result });
  }

  /** How the search for a response no server was known for ended (forward.ts). */
  previousResponseSearch(result: PreviousResponseSearchResult): void {
    this.previousResponseSearchTotal.inc({ result });
  }

  /** A request decided prefill-decode was served decode-only after all. */
  pdDegraded(connector: string): void {
    this.degradedChild(connector).inc();
  }

  private degradedChild(connector: string): ValueSeries {
    let child = this.degradedChildren.get(connector);
    if (child === undefined) {
      child = this.pdDegradedTotal.labels(connector);
      child.inc(0);
      this.degradedChildren.set(connector, child);
    }
    return child;
  }

  /**
   * The connectors P/D decisions are carried out with now (at start and on reload): their degraded
   * count starts at 0, so `rate()` sees the first fallback; a connector's series still at 0 goes
   * when the configuration stops using it.
   */
  pdConnectors(inUse: Iterable<string>): void {
    const keep = new Set(inUse);
    for (const [connector, child] of this.degradedChildren) {
      if (keep.has(connector) || child.current().value !== 0) continue;
      this.pdDegradedTotal.remove(connector);
      this.degradedChildren.delete(connector);
    }
    for (const connector of keep) this.degradedChild(connector);
  }

  /** A request moved off this endpoint because connecting to it failed. */
  upstreamRetry(endpointName: string): void {
    cachedCounterChild(this.retryChildren, this.upstreamRetriesTotal, endpointName).inc();
  }

  /** The endpoint was set aside for failing (outlier detection). */
  endpointEjection(endpointName: string): void {
    cachedCounterChild(this.ejectionChildren, this.endpointEjectionsTotal, endpointName).inc();
  }

  /** The configuration now in force (its effective-config digest). */
  configInForce(digest: string): void {
    this.configInfo.reset();
    this.configInfo.labels(digest).set(1);
  }

  /** Whether the configuration in force differs from what the process started with in restart-only settings. */
  configRestartNeeded(pending: boolean): void {
    this.configRestartPending.set(pending ? 1 : 0);
  }

  /** A reload was applied or rejected, or found the configuration already in force. */
  configReload(result: 'applied' | 'rejected' | 'in-force'): void {
    // A file that gives the configuration in force is not a reload, but it is valid and in force.
    if (result !== 'in-force') this.configReloadsTotal.labels(result === 'applied' ? 'success' : 'failure').inc();
    this.configLastReloadSuccessful.set(result === 'rejected' ? 0 : 1);
  }

  // ----------------------------------------------------------------------------- flow control

  /**
   * Every outcome of each of these priorities counted from 0 (the configured ones, at start and on
   * a reload): a series made by its first event holds that whole burst in its first sample, which
   * rate() and increase() cannot see — the first requests a band drops would read as none.
   */
  flowControlPriorities(priorities: Iterable<number>): void {
    const configured = new Set(priorities);
    this.dropUnusedBandSeries(configured);
    for (const priority of configured) for (const outcome of FLOW_OUTCOMES) this.fcRequestChild(outcome, priority);
  }

  /** The series still at 0 of priorities not in `keep` (a band a reload removed, or all when flow control went off). */
  private dropUnusedBandSeries(keep: ReadonlySet<number>): void {
    for (const [outcome, byPriority] of this.fcRequestChildren) {
      for (const [priority, child] of byPriority) {
        if (keep.has(priority) || child.current().value !== 0) continue;
        this.flowControlRequestsTotal.remove(outcome, String(priority), this.poolName);
        byPriority.delete(priority);
      }
    }
  }

  private fcRequestChild(outcome: FlowControlOutcome, priority: number): ValueSeries {
    let byPriority = this.fcRequestChildren.get(outcome);
    if (byPriority === undefined) {
      byPriority = new Map();
      this.fcRequestChildren.set(outcome, byPriority);
    }
    let child = byPriority.get(priority);
    if (child === undefined) {
      child = this.flowControlRequestsTotal.labels(outcome, String(priority), this.poolName);
      child.inc(0);
      byPriority.set(priority, child);
    }
    return child;
  }

  /** A request left flow control with this outcome after `queuedSeconds` in the queue. */
  flowControlOutcome(outcome: FlowControlOutcome, priority: number, fairnessId: string, queuedSeconds: number): void {
    this.fcRequestChild(outcome, priority).inc();

    const flow = this.fairnessCap.map(fairnessId);
    let byFlowPriority = this.fcQueueDurationChildren.get(outcome);
    if (byFlowPriority === undefined) {
      byFlowPriority = new Map();
      this.fcQueueDurationChildren.set(outcome, byFlowPriority);
    }
    let byFlow = byFlowPriority.get(priority);
    if (byFlow === undefined) {
      byFlow = new Map();
      byFlowPriority.set(priority, byFlow);
    }
    let histogramChild = byFlow.get(flow);
    if (histogramChild === undefined) {
      histogramChild = this.requestQueueDuration.labels(flow, String(priority), outcome, this.poolName);
      byFlow.set(flow, histogramChild);
    }
    histogramChild.observe(queuedSeconds);
  }

  /** Duration of one dispatch cycle, seconds. */
  dispatchCycle(seconds: number): void {
    this.dispatchCycleDuration.observe(seconds);
  }

  /** A dispatch that went ahead of earlier requests of its flow (affinity look-ahead). */
  affinityOvertake(): void {
    this.affinityOvertakesTotal.inc();
  }

  /**
   * A plugin type's decision counter, `llm_d_epp_<type>_decisions_total{plugin_name,outcome}` (type
   * with `-` as `_`, as llm-d names them): made on first use and shared by every instance of the
   * type, including those a reload makes.
   */
  decisionCounter(pluginType: string, help: string): (pluginName: string, outcome: string) => void {
    let counter = this.decisionCounters.get(pluginType);
    if (counter === undefined) {
      counter = new Counter({
        name: `llm_d_epp_${pluginType.replace(/-/g, '_')}_decisions_total`,
        help,
        labelNames: ['plugin_name', 'outcome'],
        registers: [this.registry],
      });
      this.decisionCounters.set(pluginType, counter);
    }
    const metric = counter;
    const children = new Map<string, Map<string, CounterChild>>();
    return (pluginName, outcome) => cachedChild2(children, metric, pluginName, outcome).inc();
  }

  /** One prefill/decode decision (e.g. `decode-only`, `prefill-decode`). */
  disaggDecision(modelName: string, decisionType: string): void {
    cachedChild2(this.disaggChildren, this.disaggDecisionTotal, this.modelCap.map(modelName), decisionType).inc();
  }

  // ----------------------------------------------------------------------------- scrape time

  // Each gauge recomputes only its own series in its collect(), so correctness does not depend on the
  // order in which the registry renders metrics. Sources are therefore read a few times per scrape.

  private collectPrefixIndexers(): void {
    const g = this.prefixIndexerSize;
    g.reset();
    for (const p of this.prefixIndexerSource?.() ?? []) g.labels(p.name, p.type).set(p.size);
  }

  private collectEndpointGauge(gauge: Gauge<'endpoint_name' | 'role'>, value: (ep: Endpoint, now: number) => number | undefined): void {
    gauge.reset();
    const now = this.now();
    for (const ep of this.pool().endpoints) {
      if (ep.removed) continue; // still draining in-flight requests, but no longer part of the pool
      const v = value(ep, now);
      if (v !== undefined) gauge.set({ endpoint_name: ep.name, role: ep.role }, v);
    }
  }

  private collectSaturation(): void {
    this.poolSaturation.reset();
    const snapshot = this.saturationSource?.();
    if (snapshot === undefined) return;
    for (const [stage, value] of Object.entries(snapshot.stages)) {
      if (value !== undefined) this.poolSaturation.set({ inference_pool: this.poolName, stage }, value);
    }
    this.poolSaturation.set({ inference_pool: this.poolName, stage: 'global' }, snapshot.global);
  }

  private collectStaleEndpoints(): void {
    this.staleEndpoints.reset();
    const snapshot = this.saturationSource?.();
    if (snapshot !== undefined) this.staleEndpoints.set({ detector: snapshot.detector }, snapshot.stale);
  }

  private collectFlowGauge(gauge: Gauge<'fairness_id' | 'priority' | 'inference_pool'>, field: 'requests' | 'bytes'): void {
    gauge.reset();
    const snapshot = this.flowControlSource?.();
    if (snapshot === undefined) return;
    // Several flows may fold into `fairness_id="other"`, so accumulate rather than set.
    for (const flow of snapshot.flows) {
      gauge.inc({ fairness_id: this.fairnessCap.map(flow.fairnessId), priority: String(flow.priority), inference_pool: this.poolName }, flow[field]);
    }
  }

  private collectBandGauge(gauge: Gauge<'priority' | 'inference_pool'>, field: 'requestsUtilization' | 'bytesUtilization'): void {
    gauge.reset();
    const snapshot = this.flowControlSource?.();
    if (snapshot === undefined) return;
    for (const band of snapshot.bands) gauge.set({ priority: String(band.priority), inference_pool: this.poolName }, band[field]);
  }
}

/** The series of labels (a, b) of a two-label metric, from a cache of nested maps (no key strings built). */
function cachedChild2<A extends string, B extends string, V>(cache: Map<A, Map<B, V>>, metric: { labels(a: A, b: B): V }, a: A, b: B): V {
  let inner = cache.get(a);
  if (inner === undefined) {
    inner = new Map();
    cache.set(a, inner);
  }
  let child = inner.get(b);
  if (child === undefined) {
    child = metric.labels(a, b);
    inner.set(b, child);
  }
  return child;
}

function cachedCounterChild<L extends string>(cache: Map<string, CounterChild>, counter: Counter<L>, value: string): CounterChild {
  let child = cache.get(value);
  if (child === undefined) {
    child = counter.labels(value);
    cache.set(value, child);
  }
  return child;
}
