/**
 * The effective configuration: what the loader returns after parsing, validation, defaults and the
 * "ensure" step (SPEC §3.5, §3.6). Durations are milliseconds, sizes are bytes/counts (numbers).
 * Keys mirror the YAML so `sluice validate` can print it back (durations/sizes re-formatted).
 */

export interface UpstreamConfig {
  connectTimeout: number; // ms, default 5s
  /** Max wait for upstream response headers (ms); 504 past it. Default 5m (vLLM may queue). */
  headersTimeout: number;
  /** Max idle gap between upstream body chunks (ms); default 5m. */
  bodyTimeout: number;
  retries: number; // default 2
  /** Connections per endpoint at most; 0 (the default) = no limit. A limit queues requests past it inside the HTTP client. */
  connections: number;
  outlierDetection: OutlierDetectionConfig;
}

/** Passive health checking (datalayer/outlier.ts). */
export interface OutlierDetectionConfig {
  /** Failed requests in a row (upstream 5xx, time-out, lost or refused connection) that set an endpoint aside; 0 = never. Default 5. */
  consecutiveFailures: number;
  /** First ejection (ms), doubled for each ejection in a row; default 5s. */
  baseEjectionTime: number;
  /** Longest ejection (ms); default 5m. */
  maxEjectionTime: number;
  /** Share of the pool's endpoints that may be set aside at once (floor), 0–100; default 50. */
  maxEjectionPercent: number;
  /** An endpoint running requests whose work counters have not moved for this long (ms) is set aside; 0 = never. Default 30s. */
  stallTimeout: number;
  /**
   * Requests in flight on a stalled or silent endpoint that it has said nothing of for that long are
   * given up on: sent to another server, or ended with a 504 once part of the answer went out. Default true.
   */
  rescueInFlight: boolean;
}

export interface ServerConfig {
  host: string; // default "0.0.0.0"
  port: number; // 8080
  metricsPort: number; // 9090
  bodyLimit: number; // bytes, default 16Mi
  shutdownGracePeriod: number; // ms, default 30s
  /** A client must send its request headers within this (slowloris guard); 408 past it. Default 30s. */
  requestHeadersTimeout: number;
  /** A client must send its whole request (headers + body) within this; 408 past it. Default 5m. */
  requestTimeout: number;
  /** Requests pipelined on one connection that may wait behind the one being answered; 429 past it, 0 = no limit. Default 16. */
  maxPipelinedRequests: number;
  /** Serve /debug/profile/{cpu,heap} on the metrics port (llm-d's --enable-pprof). Default true. */
  profiling: boolean;
  /**
   * Stored Responses API answers whose server is remembered, newest first, so that a request
   * continuing one (`previous_response_id`) goes to the server holding it; 0 = off. Default 100000.
   */
  storedResponses: number;
  upstream: UpstreamConfig;
}

export interface EndpointConfig {
  name: string;
  address: string;
  port: number; // defaulted from pool.targetPort
  labels: Record<string, string>;
}

export interface PoolConfig {
  name: string; // default "default-pool"
  targetPort: number; // default 8000
  /**
   * "/metrics", 50ms, 1s; maxBytes: the largest page read (4Mi), past it the scrape fails;
   * defaultEngine: the engine type of an endpoint without an engine-type label (vllm).
   */
  metrics: { path: string; interval: number; timeout: number; maxBytes: number; defaultEngine: string };
  endpoints: EndpointConfig[];
}

export interface Objective {
  name: string;
  priority: number;
}

export interface PluginSpec {
  type: string;
  name: string;
  /** Parameters after the plugin's schema filled its defaults. */
  parameters: Record<string, unknown>;
}

export interface ProfilePluginRef {
  pluginRef: string;
  weight?: number; // scorers: defaulted to 1 by ensure
}

export interface SchedulingProfileConfig {
  name: string;
  plugins: ProfilePluginRef[];
  /** Sluice: `false` opts this profile out of the auto-appended saturation-detector filter. */
  saturationFilter?: boolean;
}

export interface PriorityBandConfig {
  priority: number;
  maxBytes: number; // default 1e9
  maxRequests: number; // default 5000
  fairnessPolicyRef: string; // default global-strict-fairness-policy
  orderingPolicyRef: string; // default fcfs-ordering-policy
}

export interface FlowControlConfig {
  maxBytes: number; // 0 = unlimited
  maxRequests: number; // 0 = unlimited
  defaultRequestTTL: number; // ms, 60s
  noEndpointRequestTTL: number; // ms, follows defaultRequestTTL
  defaultPriorityBand: Omit<PriorityBandConfig, 'priority'>;
  defaultNegativePriorityBand?: Omit<PriorityBandConfig, 'priority'>;
  priorityBands: PriorityBandConfig[];
  usageLimitPolicyPluginRef: string; // static-usage-limit-policy
  saturationDetector: { pluginRef: string }; // utilization-detector
  /**
   * Sluice: how many later requests of the same flow a dispatch may look at when the head's
   * favourite endpoint is saturated (and so how often a request may be overtaken). 0 = strict order, as llm-d.
   */
  affinityLookahead: number; // 8
}

export interface SluiceConfig {
  apiVersion: string;
  kind: string;
  server: ServerConfig;
  pool: PoolConfig;
  objectives: Objective[];
  /** Raw gate strings as written; see `featureEnabled`. */
  featureGates: string[];
  plugins: PluginSpec[];
  schedulingProfiles: SchedulingProfileConfig[];
  flowControl: FlowControlConfig;
}

/** Where each auto-injected piece came from, for `sluice validate` and logs. */
export interface Injection {
  /** e.g. "plugins", "schedulingProfiles[0].plugins" */
  where: string;
  what: string;
}

export interface LoadedConfig {
  file: string;
  config: SluiceConfig;
  injections: Injection[];
}
