/** Shared builders for the scheduling tests: endpoints, requests, contexts. */
import { Endpoint, ROLE_LABEL, type EndpointMetrics } from '../../src/datalayer/endpoint.js';
import type { PluginDeps, PluginLogger } from '../../src/plugins/registry.js';
import type { CycleContext, ScoredEndpoint, SchedulingRequest } from '../../src/scheduling/framework.js';
import { ManualClock, seededRandom, type RandomSource } from '../../src/util/clock.js';

export interface EndpointOptions {
  waiting?: number;
  running?: number;
  kv?: number;
  /** Metrics age in ms relative to `now` (default 0 = fresh). */
  age?: number;
  /** No metrics at all (never scraped). */
  noMetrics?: boolean;
  role?: string;
  labels?: Record<string, string>;
  inFlight?: number;
  numGpuBlocks?: number;
}

let port = 8000;
let requestCounter = 0;

export function makeEndpoint(name: string, opts: EndpointOptions = {}, now = 1_000_000): Endpoint {
  const labels: Record<string, string> = { ...(opts.labels ?? {}) };
  if (opts.role !== undefined) labels[ROLE_LABEL] = opts.role;
  const endpoint = new Endpoint({ name, address: '127.0.0.1', port: port++, labels });
  if (!opts.noMetrics) {
    const metrics: EndpointMetrics = { waiting: opts.waiting ?? 0, running: opts.running ?? 0, kvUsage: opts.kv ?? 0 };
    if (opts.numGpuBlocks !== undefined) metrics.cacheConfig = { blockSize: 16, numGpuBlocks: opts.numGpuBlocks };
    endpoint.metrics = metrics;
    endpoint.metricsAt = now - (opts.age ?? 0);
  }
  endpoint.inFlight = opts.inFlight ?? 0;
  // The metrics were taken with these requests in flight; tests move inFlight to model later dispatches.
  if (!opts.noMetrics) endpoint.inFlightAtScrape = endpoint.inFlight;
  return endpoint;
}

export function makeRequest(promptText = 'hello', opts: { model?: string; body?: Record<string, unknown> } = {}): SchedulingRequest {
  const model = opts.model ?? 'test-model';
  return {
    requestId: `req-${++requestCounter}`,
    model,
    api: 'completions',
    body: { model, prompt: promptText, ...(opts.body ?? {}) },
    promptText,
    headers: {},
    state: new Map(),
  };
}

export function makeContext(seed = 1, clock = new ManualClock()): CycleContext & { clock: ManualClock; random: RandomSource } {
  return { clock, random: seededRandom(seed) };
}

export interface RecordingLogger extends PluginLogger {
  warnings: { obj: object; msg?: string }[];
}

export function recordingLogger(): RecordingLogger {
  const warnings: { obj: object; msg?: string }[] = [];
  return {
    warnings,
    warn: (obj, msg) => void warnings.push({ obj, msg }),
    info: () => {},
    debug: () => {},
  };
}

export function makeDeps(
  opts: { clock?: ManualClock; seed?: number; endpoints?: Endpoint[]; logger?: PluginLogger } = {},
): PluginDeps & { clock: ManualClock } {
  const endpoints = opts.endpoints ?? [];
  return {
    clock: opts.clock ?? new ManualClock(),
    random: seededRandom(opts.seed ?? 1),
    pool: { endpoints },
    logger: opts.logger ?? recordingLogger(),
    plugins: new Map(),
  };
}

export function scoredOf(entries: [Endpoint, number][]): ScoredEndpoint[] {
  return entries.map(([endpoint, score]) => ({ endpoint, score }));
}

export function names(endpoints: readonly Endpoint[]): string[] {
  return endpoints.map((e) => e.name);
}

/** Counts how often each name occurs. */
export function tally(values: readonly string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const v of values) counts.set(v, (counts.get(v) ?? 0) + 1);
  return counts;
}
