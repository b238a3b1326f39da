/**
 * Strict zod schema of the raw configuration file (SPEC §3): an llm-d `EndpointPickerConfig` plus
 * Sluice's `server`, `pool` and `objectives`. Parsing fills the static defaults (reference §1.5) and
 * converts durations to ms and quantities to integers; the "ensure" step (defaults.ts) and the
 * cross-reference checks (load.ts) come after. Every object is strict: unknown keys are errors.
 */
import { isIP } from 'node:net';
import { z } from 'zod';
import type {
  EndpointConfig,
  FlowControlConfig,
  Objective,
  PoolConfig,
  PriorityBandConfig,
  ProfilePluginRef,
  SchedulingProfileConfig,
  ServerConfig,
} from './types.js';
import { formatDuration, parseDuration, parseQuantity } from './units.js';
import { engineLabelOf } from '../datalayer/endpoint.js';
import { KNOWN_ENGINE_TYPES } from '../datalayer/vllm-metrics.js';
import { MAX_TIMER_DELAY_MS } from '../util/clock.js';

export const API_VERSION = 'llm-d.ai/v1alpha1';
/** llm-d's newer apiVersion: the same document (it differs only under `dataLayer`, which Sluice ignores). */
export const API_VERSION_V1 = 'llm-d.ai/v1';
/** GIE's apiVersion: still accepted, with a deprecation warning. */
export const DEPRECATED_API_VERSION = 'inference.networking.x-k8s.io/v1alpha1';
export const CONFIG_KIND = 'EndpointPickerConfig';

export const DEFAULT_FAIRNESS_POLICY = 'global-strict-fairness-policy';
export const DEFAULT_ORDERING_POLICY = 'fcfs-ordering-policy';
export const DEFAULT_USAGE_LIMIT_POLICY = 'static-usage-limit-policy';
export const DEFAULT_SATURATION_DETECTOR = 'utilization-detector';
export const DEFAULT_BAND_MAX_BYTES = 1_000_000_000;
export const DEFAULT_BAND_MAX_REQUESTS = 5000;
export const DEFAULT_REQUEST_TTL_MS = 60_000;

/**
 * Known feature gates and their defaults. Sluice turns flow control on by default (SPEC §6);
 * `haPopulateNonLeaderDatastore` is llm-d's other gate, accepted (and meaningless here) so llm-d
 * configs load unchanged; so are GIE's `dataLayer` and `enableLegacyMetrics`.
 */
export const FEATURE_GATE_DEFAULTS: Readonly<Record<string, boolean>> = {
  flowControl: true,
  haPopulateNonLeaderDatastore: true,
  // GIE's gates, accepted with a warning (they change nothing here).
  dataLayer: false,
  enableLegacyMetrics: false,
  prepareDataPlugins: false,
};

/** Gates accepted only so that llm-d and GIE files load: setting one changes nothing. */
export const NO_EFFECT_FEATURE_GATES: ReadonlySet<string> = new Set(['dataLayer', 'enableLegacyMetrics', 'prepareDataPlugins']);

// ---------------------------------------------------------------------------------------------
// Suggestions

export function levenshtein(a: string, b: string): number {
  const prev = new Array<number>(b.length + 1);
  for (let j = 0; j <= b.length; j++) prev[j] = j;
  for (let i = 1; i <= a.length; i++) {
    let diag = prev[0]!;
    prev[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const up = prev[j]!;
      prev[j] = Math.min(up + 1, prev[j - 1]! + 1, diag + (a[i - 1] === b[j - 1] ? 0 : 1));
      diag = up;
    }
  }
  return prev[b.length]!;
}

/** Lower-case words of a name: `kv-cache-scorer` → kv, cache, scorer; `metricsPort` → metrics, port. */
function words(name: string): string[] {
  return name
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter((w) => w !== '');
}

/**
 * The candidate `word` plausibly stands for, if any: the same name in another case; else the one
 * candidate closest by edit distance, within max(2, a quarter of the word's length) edits (a typo;
 * more would let "prefix-cache-scorer" suggest "kv-cache-scorer"); else the one candidate that starts
 * with `word` or has all its words (a shortened name: "lora-affinity" for "lora-affinity-scorer",
 * "kv-cache-scorer" for "kv-cache-utilization-scorer").
 */
export function closestMatch(word: string, allCandidates: readonly string[]): string | undefined {
  const lower = word.toLowerCase();
  const sameName = allCandidates.find((c) => c.toLowerCase() === lower);
  if (sameName !== undefined) return sameName;
  // "encode-filter" is one letter from "decode-filter" but the opposite of it: never suggest a name
  // with another word of the same group (another stage; approximate for precise).
  let candidates = allCandidates;
  for (const group of EXCLUSIVE_WORDS) {
    const own = group.find((w) => lower.includes(w));
    if (own !== undefined) candidates = candidates.filter((c) => !group.some((w) => w !== own && c.toLowerCase().includes(w)));
  }
  if (candidates.length === 0) return undefined;

  const limit = Math.max(2, Math.floor(word.length / 4));
  const distances = candidates.map((c) => levenshtein(lower, c.toLowerCase()));
  const best = Math.min(...distances);
  const closest = candidates.filter((_, i) => distances[i] === best);
  if (best <= limit && closest.length === 1) return closest[0];

  // Two letters could start almost anything.
  if (word.length < 3) return undefined;
  const own = words(word);
  const longer = candidates.filter((c) => c.toLowerCase().startsWith(lower) || own.every((w) => words(c).includes(w)));
  return longer.length === 1 ? longer[0] : undefined;
}

const EXCLUSIVE_WORDS = [
  ['encode', 'decode', 'prefill'],
  ['precise', 'approx'],
];

/** Keys llm-d replaced: what to write instead (where the valid keys include `among`, when given). */
const REPLACED_KEYS: Readonly<Record<string, { hint: string; among?: string }>> = {
  hashBlockSize: {
    hint: 'llm-d replaced it by blockSizeTokens on prefix-cache-scorer: tokens per block, a quarter of hashBlockSize, which counted characters; on a P/D profile handler it has no use: delete it',
  },
  // The prefix-cache-scorer's length term, under llm-d's earlier names.
  prefixLengthWeight: { hint: 'llm-d renamed it matchLengthWeight', among: 'matchLengthWeight' },
  prefillSaturationTokens: { hint: 'llm-d renamed it matchLengthScaleTokens', among: 'matchLengthScaleTokens' },
  maxModelLen: {
    hint: 'llm-d replaced it by matchLengthScaleTokens: the matched tokens at which the length term saturates (default 8192), not the context length',
    among: 'matchLengthScaleTokens',
  },
  threshold: {
    hint: 'llm-d replaced it by a decider named in deciders.prefill: threshold 0 (always disaggregate) is always-disagg-pd-decider, any other a prefix-based-pd-decider with nonCachedTokens: <threshold>',
    among: 'deciders',
  },
};

/**
 * llm-d plugin types Sluice does not implement, with what comes nearest here: an error that says so
 * reads better than "unknown", and no suggestion of a near name that means something else
 * (`ed-profile-handler` is not `pd-profile-handler`).
 */
const PRECISE = 'the precise prefix cache (KV events from vLLM) is not implemented; prefix-cache-scorer keeps an approximate index';
const AGENTIC = 'the agentic-serving plugins are not implemented';
const EPD = 'encode/prefill/decode (E/PD) disaggregation is not implemented; prefill/decode is (disagg-profile-handler)';
const MODELS = 'Sluice answers /v1/models itself, from the endpoints';
const TOKENS = 'Sluice does not tokenize: it counts 4 characters a token';
const DCGM = "GPU (DCGM) metrics are not read; Sluice reads the model servers' own metrics";
const LLMD_UNIMPLEMENTED: Readonly<Record<string, string>> = {
  'precise-prefix-cache-scorer': PRECISE,
  'precise-prefix-cache-producer': PRECISE,
  'kvcache-aware-scorer': PRECISE,
  'burst-prefix-cache-producer': 'prefix-cache-scorer keeps the prefix index itself (approx-prefix-cache-producer lends it its parameters)',
  'token-producer': TOKENS,
  tokenizer: TOKENS,
  'passthrough-parser': 'Sluice parses the OpenAI request bodies itself',
  'data-parallel-profile-handler': 'data-parallel routing is not supported: list each rank that serves its own port as an endpoint',
  'context-length-aware': 'not implemented; a label-selector-filter can split endpoints by labels you give them',
  'agent-identity': AGENTIC,
  'program-aware-fairness': `${AGENTIC}; the fairness policies are global-strict-fairness-policy and round-robin-fairness-policy`,
  'thunder-agent': AGENTIC,
  'probabilistic-admitter': 'admission is flow control here (featureGates: flowControl)',
  'encoder-header-handler': EPD,
  'always-encode-decider': EPD,
  'ed-profile-handler': EPD,
  'models-data-source': MODELS,
  'models-data-extractor': MODELS,
  'dcgm-data-source': DCGM,
  'dcgm-extractor': DCGM,
  'endpoint-attribute-filter': 'not implemented; label-selector-filter selects endpoints by their labels',
  'endpoint-attribute-scorer': 'not implemented',
  'lmetric-scorer': 'not implemented',
  'decode-progress-scorer': 'not implemented; active-request-scorer reads the requests in flight on each endpoint',
};

/** The error for a plugin type the registry does not know. */
export function unknownPluginTypeMessage(type: string, known: readonly string[]): string {
  const nearest = Object.hasOwn(LLMD_UNIMPLEMENTED, type) ? LLMD_UNIMPLEMENTED[type] : undefined;
  if (nearest !== undefined) return `plugin type "${type}" is llm-d's and Sluice does not implement it: ${nearest}`;
  return `unknown plugin type "${type}"${didYouMean(type, known)}`;
}

/** ` (did you mean "x"?)` or '' when nothing is close. */
export function didYouMean(word: string, candidates: readonly string[]): string {
  const replaced = Object.hasOwn(REPLACED_KEYS, word) ? REPLACED_KEYS[word] : undefined;
  if (replaced !== undefined && (replaced.among === undefined || candidates.includes(replaced.among))) return ` (${replaced.hint})`;
  const match = closestMatch(word, candidates);
  return match === undefined ? '' : ` (did you mean "${match}"?)`;
}

/** Short human description of a value for error messages. */
export function describeValue(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (typeof v === 'string') return `string ${JSON.stringify(v)}`;
  if (typeof v === 'number') {
    if (Number.isNaN(v)) return '.nan';
    if (!Number.isFinite(v)) return v > 0 ? '.inf' : '-.inf';
    return `number ${v}`;
  }
  if (typeof v === 'boolean') return `boolean ${v}`;
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  return typeof v;
}

// ---------------------------------------------------------------------------------------------
// Unit fields

const REQUIRED = 'required key is missing';

/**
 * A duration string ("200ms", "1.5s"); `0` is accepted as a number too, and with `msNumbers` any
 * number, read as milliseconds (a plugin parameter llm-d also takes as a number). Output: milliseconds.
 */
export function durationField(opts: { positive?: boolean; msNumbers?: boolean } = {}) {
  return z.unknown().transform((v, ctx): number => {
    if (v === undefined) {
      ctx.addIssue({ code: 'custom', message: REQUIRED, input: v });
      return z.NEVER;
    }
    let ms: number;
    if (v === 0 || (opts.msNumbers && typeof v === 'number')) ms = v as number;
    else if (typeof v !== 'string') {
      const alternative = opts.msNumbers ? ' or a number of milliseconds' : '';
      ctx.addIssue({
        code: 'custom',
        message: `expected a duration string with a unit, e.g. "200ms", "1.5s", "5m"${alternative}; got ${describeValue(v)}`,
        input: v,
      });
      return z.NEVER;
    } else {
      try {
        ms = parseDuration(v);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message, input: v });
        return z.NEVER;
      }
    }
    if (opts.positive && !(ms > 0)) {
      ctx.addIssue({ code: 'custom', message: 'must be greater than 0s', input: v });
      return z.NEVER;
    }
    // Durations end up in timers, and a longer timer would fire at once: ~596 h is "never".
    return Math.min(ms, MAX_TIMER_DELAY_MS);
  });
}

/** A Kubernetes quantity ("16Mi", "1G", "5000" or a number). Output: a non-negative integer. */
export function quantityField(opts: { positive?: boolean } = {}) {
  return z.unknown().transform((v, ctx): number => {
    if (v === undefined) {
      ctx.addIssue({ code: 'custom', message: REQUIRED, input: v });
      return z.NEVER;
    }
    if (typeof v !== 'string' && typeof v !== 'number') {
      ctx.addIssue({
        code: 'custom',
        message: `expected a quantity such as 5000, "500M" or "16Mi"; got ${describeValue(v)}`,
        input: v,
      });
      return z.NEVER;
    }
    let n: number;
    try {
      n = parseQuantity(v);
    } catch (err) {
      ctx.addIssue({ code: 'custom', message: (err as Error).message, input: v });
      return z.NEVER;
    }
    if (opts.positive && n <= 0) {
      ctx.addIssue({ code: 'custom', message: 'must be greater than 0', input: v });
      return z.NEVER;
    }
    return n;
  });
}

/** Listening ports: 0 means "any free port" (tests use ephemeral ports). */
const listenPort = z.number().int().min(0).max(65535);
/** Ports we connect to. */
const targetPort = z.number().int().min(1).max(65535);

const HOSTNAME = /^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$/;

/** Endpoint address: a host name, IPv4 or IPv6 address (brackets optional), without port or scheme. */
const addressField = z.string().superRefine((v, ctx) => {
  if (v.includes('://')) {
    ctx.addIssue({ code: 'custom', message: `must be a host name or IP address, not a URL (got "${v}")` });
    return;
  }
  const unbracketed = v.startsWith('[') && v.endsWith(']') ? v.slice(1, -1) : v;
  if (isIP(unbracketed) === 6) {
    // A zone (`fe80::1%eth0`) has no place in an http:// URL that Node's URL parser takes.
    if (unbracketed.includes('%')) ctx.addIssue({ code: 'custom', message: `an IPv6 zone ("%${unbracketed.split('%')[1]}") is not supported; use an address without one (got "${v}")` });
    return;
  }
  if (/^[^:]+:\d+$/.test(v)) {
    ctx.addIssue({ code: 'custom', message: `must not include a port (got "${v}"); set "port" instead` });
    return;
  }
  if (!HOSTNAME.test(v)) ctx.addIssue({ code: 'custom', message: `not a valid host name or IP address: "${v}"` });
});

// ---------------------------------------------------------------------------------------------
// server

/** Passive health (datalayer/outlier.ts): an endpoint that fails request after request is set aside for a while. */
export const outlierDetectionSchema = z
  .strictObject({
    consecutiveFailures: z.number().int().min(0).default(5),
    baseEjectionTime: durationField({ positive: true }).prefault('5s'),
    maxEjectionTime: durationField({ positive: true }).prefault('5m'),
    maxEjectionPercent: z.number().int().min(0).max(100).default(50),
    stallTimeout: durationField().prefault('30s'),
    rescueInFlight: z.boolean().default(true),
  })
  .prefault({})
  .superRefine((o, ctx) => {
    if (o.maxEjectionTime < o.baseEjectionTime) {
      ctx.addIssue({
        code: 'custom',
        message: `${formatDuration(o.maxEjectionTime)} is shorter than baseEjectionTime (${formatDuration(o.baseEjectionTime)}); the longest ejection must be at least the first`,
        path: ['maxEjectionTime'],
        input: o.maxEjectionTime,
      });
    }
  });

export const upstreamSchema = z
  .strictObject({
    connectTimeout: durationField({ positive: true }).prefault('5s'),
    headersTimeout: durationField({ positive: true }).prefault('10m'),
    bodyTimeout: durationField({ positive: true }).prefault('5m'),
    retries: z.number().int().min(0).default(2),
    connections: z.number().int().min(0).default(0),
    outlierDetection: outlierDetectionSchema,
  })
  .prefault({});

export const serverSchema = z
  .strictObject({
    // Checked like an endpoint address: a URL or host:port here would only fail at listen time.
    host: addressField.transform((v) => (v.startsWith('[') && v.endsWith(']') ? v.slice(1, -1) : v)).default('0.0.0.0'),
    port: listenPort.default(8080),
    metricsPort: listenPort.default(9090),
    bodyLimit: quantityField({ positive: true }).prefault('16Mi'),
    shutdownGracePeriod: durationField().prefault('30s'),
    requestHeadersTimeout: durationField({ positive: true }).prefault('30s'),
    requestTimeout: durationField({ positive: true }).prefault('5m'),
    maxPipelinedRequests: z.number().int().min(0).default(16),
    profiling: z.boolean().default(true),
    storedResponses: z.number().int().min(0).default(100_000),
    upstream: upstreamSchema,
  })
  // Run even when another server field is invalid (on what parsed), so one run of `sluice validate` lists both.
  .superRefine(
    (server: { port?: unknown; metricsPort?: unknown }, ctx) => {
      const { port, metricsPort } = server;
      if (typeof port === 'number' && port !== 0 && port === metricsPort) {
        ctx.addIssue({ code: 'custom', message: `must differ from server.port (both are ${port})`, path: ['metricsPort'], input: metricsPort });
      }
    },
    { when: () => true },
  )
  .transform((server): ServerConfig => server)
  .prefault({});

// ---------------------------------------------------------------------------------------------
// pool

const unknownEngineMessage = (engine: string): string =>
  `unknown engine type ${JSON.stringify(engine)}${didYouMean(engine, KNOWN_ENGINE_TYPES)}; known: ${KNOWN_ENGINE_TYPES.join(', ')}`;

/**
 * Caught here, not at the first scrape: an engine type Sluice cannot read leaves the endpoint stale
 * forever (every scrape fails), so it would never get a request. Checked on the labels alone, so
 * it is reported beside any other endpoint's (or field's) error.
 */
function reportUnknownEngine(labels: Record<string, string>, ctx: z.RefinementCtx): void {
  const label = engineLabelOf(labels);
  const engine = label === undefined ? undefined : labels[label]!;
  if (engine !== undefined && !KNOWN_ENGINE_TYPES.includes(engine)) {
    ctx.addIssue({ code: 'custom', message: unknownEngineMessage(engine), path: [label!], input: engine });
  }
}

export const endpointSchema = z.strictObject({
  name: z.string().min(1),
  address: addressField,
  port: targetPort.optional(),
  labels: z.record(z.string(), z.string()).default({}).superRefine(reportUnknownEngine),
});

/** An engine type whose metric names Sluice knows. */
export const engineTypeField = z.string().refine((e) => KNOWN_ENGINE_TYPES.includes(e), {
  error: (issue) => unknownEngineMessage(String(issue.input)),
});

export const poolMetricsSchema = z
  .strictObject({
    path: z
      .string()
      .refine((p) => p.startsWith('/'), { message: 'must start with "/"' })
      .default('/metrics'),
    interval: durationField({ positive: true }).prefault('50ms'),
    timeout: durationField({ positive: true }).prefault('1s'),
    // vLLM's LoRA info family keeps a series per adapter combination ever seen: a long-running LoRA
    // server's page grows.
    maxBytes: quantityField({ positive: true }).prefault('4Mi'),
    defaultEngine: engineTypeField.default('vllm'),
  })
  .prefault({});

/** One spelling per address: lower case, IPv6 without brackets and in its canonical form (`0:0:0:0:0:0:0:1` is `::1`). */
function normalizedAddress(address: string): string {
  const unbracketed = address.startsWith('[') && address.endsWith(']') ? address.slice(1, -1) : address;
  if (unbracketed.includes(':')) {
    try {
      return new URL(`http://[${unbracketed}]/`).hostname.slice(1, -1);
    } catch {
      // not an IPv6 address: the address field reports it
    }
  }
  return unbracketed.toLowerCase();
}

/**
 * Endpoint names, and address:port pairs, are unique (SPEC §3.1). Reads the pool defensively: with
 * other issues, entries or fields may not have parsed.
 */
function reportDuplicateEndpoints(pool: { targetPort?: unknown; endpoints?: unknown } | null, ctx: z.RefinementCtx): void {
  if (typeof pool !== 'object' || pool === null || !Array.isArray(pool.endpoints)) return;
  const byName = new Map<string, number>();
  const byHostPort = new Map<string, number>();
  pool.endpoints.forEach((e: unknown, i) => {
    if (typeof e !== 'object' || e === null) return;
    const { name, address, port = pool.targetPort } = e as { name?: unknown; address?: unknown; port?: unknown };
    if (typeof name === 'string') {
      const first = byName.get(name);
      if (first !== undefined) {
        ctx.addIssue({ code: 'custom', message: `duplicate endpoint name "${name}" (first used by pool.endpoints[${first}])`, path: ['endpoints', i, 'name'], input: name });
      } else byName.set(name, i);
    }
    if (typeof address !== 'string' || typeof port !== 'number') return;
    const hostPort = `${normalizedAddress(address)}|${port}`;
    const first = byHostPort.get(hostPort);
    if (first !== undefined) {
      const firstName = (pool.endpoints as { name?: unknown }[])[first]!.name;
      ctx.addIssue({
        code: 'custom',
        message: `duplicate address ${address} port ${port} (already ${typeof firstName === 'string' ? `endpoint "${firstName}"` : `pool.endpoints[${first}]`})`,
        path: ['endpoints', i, 'address'],
        input: address,
      });
    } else byHostPort.set(hostPort, i);
  });
}

export const poolSchema = z
  .strictObject({
    name: z.string().min(1).default('default-pool'),
    targetPort: targetPort.default(8000),
    metrics: poolMetricsSchema,
    endpoints: z.array(endpointSchema).default([]),
  })
  // Duplicates are looked for even when another entry is invalid (a check runs on what parsed), so
  // one run of `sluice validate` lists both.
  .superRefine(reportDuplicateEndpoints, { when: () => true })
  .transform((pool): PoolConfig => {
    const endpoints: EndpointConfig[] = pool.endpoints.map((e) => ({ name: e.name, address: e.address, port: e.port ?? pool.targetPort, labels: e.labels }));
    return { name: pool.name, targetPort: pool.targetPort, metrics: pool.metrics, endpoints };
  })
  .prefault({});

// ---------------------------------------------------------------------------------------------
// objectives, feature gates

export const objectivesSchema = z
  .array(z.strictObject({ name: z.string().min(1), priority: z.number().int() }))
  .transform((objectives, ctx): Objective[] => {
    const seen = new Map<string, number>();
    objectives.forEach((o, i) => {
      const first = seen.get(o.name);
      if (first !== undefined) {
        ctx.addIssue({
          code: 'custom',
          message: `duplicate objective name "${o.name}" (first used by objectives[${first}])`,
          path: [i, 'name'],
          input: o.name,
        });
      } else seen.set(o.name, i);
    });
    return objectives;
  })
  .default([]);

export type FeatureGateEntry = { name: string; enabled: boolean };

/** Gate values llm-d accepts (Go's strconv.ParseBool of the lower-cased value). */
const GATE_VALUES: Readonly<Record<string, boolean>> = { true: true, t: true, '1': true, false: false, f: false, '0': false };

/** Parses `name` or `name=<bool>` (true/false, t/f, 1/0, any case, as llm-d); an Error explains a bad one. */
export function parseFeatureGate(entry: string): FeatureGateEntry | Error {
  const eq = entry.indexOf('=');
  const name = (eq === -1 ? entry : entry.slice(0, eq)).trim();
  const value = eq === -1 ? 'true' : entry.slice(eq + 1).trim().toLowerCase();
  const known = Object.keys(FEATURE_GATE_DEFAULTS);
  if (!known.includes(name)) {
    return new Error(`unknown feature gate "${name}"${didYouMean(name, known)}; known gates: ${known.join(', ')}`);
  }
  if (!Object.hasOwn(GATE_VALUES, value)) {
    return new Error(`feature gate "${name}" has value "${entry.slice(eq + 1)}"; expected true or false`);
  }
  return { name, enabled: GATE_VALUES[value]! };
}

// Element by element, so one entry of the wrong type does not hide an unknown gate next to it.
export const featureGatesSchema = z
  .array(z.unknown())
  .transform((gates, ctx): string[] => {
    gates.forEach((gate, i) => {
      if (typeof gate !== 'string') {
        ctx.addIssue({ code: 'custom', message: `expected a string, got ${describeValue(gate)}`, path: [i], input: gate });
        return;
      }
      const parsed = parseFeatureGate(gate);
      if (parsed instanceof Error) ctx.addIssue({ code: 'custom', message: parsed.message, path: [i], input: gate });
    });
    return gates as string[];
  })
  .default([]);

// ---------------------------------------------------------------------------------------------
// plugins, profiles

export const pluginSpecSchema = z.strictObject({
  type: z.string().min(1),
  name: z.string().min(1).optional(),
  parameters: z.record(z.string(), z.unknown()).optional(),
});
export type RawPluginSpec = z.output<typeof pluginSpecSchema>;

export const profilePluginRefSchema = z
  .strictObject({
    pluginRef: z.string().min(1),
    weight: z.number().min(0).optional(),
  })
  .transform((ref): ProfilePluginRef => (ref.weight === undefined ? { pluginRef: ref.pluginRef } : ref));

export const schedulingProfileSchema = z
  .strictObject({
    name: z.string().min(1),
    plugins: z.array(profilePluginRefSchema).default([]),
    saturationFilter: z.boolean().optional(),
  })
  .transform(
    (p): SchedulingProfileConfig =>
      p.saturationFilter === undefined
        ? { name: p.name, plugins: p.plugins }
        : { name: p.name, plugins: p.plugins, saturationFilter: p.saturationFilter },
  );

// ---------------------------------------------------------------------------------------------
// flowControl

type BandTemplate = Omit<PriorityBandConfig, 'priority'>;

const bandFields = {
  // "0" or omitted → the default: per-band limits are always bounded (reference §1.5).
  maxBytes: quantityField().optional(),
  maxRequests: quantityField().optional(),
  fairnessPolicyRef: z.string().min(1).default(DEFAULT_FAIRNESS_POLICY),
  orderingPolicyRef: z.string().min(1).default(DEFAULT_ORDERING_POLICY),
};

function bandTemplate(b: {
  maxBytes?: number | undefined;
  maxRequests?: number | undefined;
  fairnessPolicyRef: string;
  orderingPolicyRef: string;
}): BandTemplate {
  return {
    maxBytes: b.maxBytes || DEFAULT_BAND_MAX_BYTES,
    maxRequests: b.maxRequests || DEFAULT_BAND_MAX_REQUESTS,
    fairnessPolicyRef: b.fairnessPolicyRef,
    orderingPolicyRef: b.orderingPolicyRef,
  };
}

/** `defaultPriorityBand` / `defaultNegativePriorityBand`: a `priority` there is accepted and ignored. */
export const bandTemplateSchema = z
  .strictObject({ priority: z.number().int().optional(), ...bandFields })
  .transform((b): BandTemplate => bandTemplate(b));

export const priorityBandSchema = z
  .strictObject({ priority: z.number().int(), ...bandFields })
  .transform((b): PriorityBandConfig => ({ priority: b.priority, ...bandTemplate(b) }));

export const saturationDetectorRefSchema = z.strictObject({ pluginRef: z.string().default('') });

/** Requests a dispatch may look past when the head would rather wait for its favourite endpoint. */
export const DEFAULT_AFFINITY_LOOKAHEAD = 8;
/** Each look costs a scheduling run; more than this would be a queue scan, not a look ahead. */
const MAX_AFFINITY_LOOKAHEAD = 64;

/** The flowControl block before "ensure": the detector ref may still be unset. */
export type FlowControlSection = Omit<FlowControlConfig, 'saturationDetector'> & {
  saturationDetector?: { pluginRef: string };
};

export const flowControlSchema = z
  .strictObject({
    maxBytes: quantityField().prefault(0),
    maxRequests: quantityField().prefault(0),
    defaultRequestTTL: durationField().optional(),
    noEndpointRequestTTL: durationField().optional(),
    defaultPriorityBand: bandTemplateSchema.prefault({}),
    defaultNegativePriorityBand: bandTemplateSchema.optional(),
    priorityBands: z.array(priorityBandSchema).default([]),
    usageLimitPolicyPluginRef: z.string().default(''),
    saturationDetector: saturationDetectorRefSchema.optional(),
    /** llm-d's in-flight eviction (alpha); accepted for compatibility, not implemented (warning). */
    enableEviction: z.boolean().optional(),
    affinityLookahead: z.number().int().min(0).max(MAX_AFFINITY_LOOKAHEAD).default(DEFAULT_AFFINITY_LOOKAHEAD),
  })
  .transform((fc, ctx): FlowControlSection => {
    const seen = new Map<number, number>();
    fc.priorityBands.forEach((band, i) => {
      const first = seen.get(band.priority);
      if (first !== undefined) {
        ctx.addIssue({
          code: 'custom',
          message: `duplicate band priority ${band.priority} (first used by flowControl.priorityBands[${first}])`,
          path: ['priorityBands', i, 'priority'],
          input: band.priority,
        });
      } else seen.set(band.priority, i);
    });
    const defaultRequestTTL = fc.defaultRequestTTL ?? DEFAULT_REQUEST_TTL_MS;
    const section: FlowControlSection = {
      maxBytes: fc.maxBytes,
      maxRequests: fc.maxRequests,
      defaultRequestTTL,
      // Follows defaultRequestTTL when only that is set (reference §1.5).
      noEndpointRequestTTL: fc.noEndpointRequestTTL ?? defaultRequestTTL,
      defaultPriorityBand: fc.defaultPriorityBand,
      priorityBands: fc.priorityBands,
      usageLimitPolicyPluginRef: fc.usageLimitPolicyPluginRef || DEFAULT_USAGE_LIMIT_POLICY,
      affinityLookahead: fc.affinityLookahead,
    };
    if (fc.defaultNegativePriorityBand) section.defaultNegativePriorityBand = fc.defaultNegativePriorityBand;
    if (fc.saturationDetector) section.saturationDetector = fc.saturationDetector;
    return section;
  })
  .prefault({});

// ---------------------------------------------------------------------------------------------
// The whole file

/** llm-d blocks Sluice accepts for compatibility but does not use (a warning says so). */
const opaqueBlock = z.record(z.string(), z.unknown());

export const rawConfigSchema = z.strictObject({
  apiVersion: z.enum([API_VERSION, API_VERSION_V1, DEPRECATED_API_VERSION]).default(API_VERSION),
  kind: z.literal(CONFIG_KIND).default(CONFIG_KIND),
  server: serverSchema,
  pool: poolSchema,
  objectives: objectivesSchema,
  featureGates: featureGatesSchema,
  plugins: z.array(pluginSpecSchema).default([]),
  schedulingProfiles: z.array(schedulingProfileSchema).default([]),
  flowControl: flowControlSchema,
  /** Deprecated location of flowControl.saturationDetector (llm-d-router #1247). */
  saturationDetector: saturationDetectorRefSchema.optional(),
  dataLayer: opaqueBlock.optional(),
  requestHandler: opaqueBlock.optional(),
  parser: opaqueBlock.optional(),
});

export type RawConfig = z.output<typeof rawConfigSchema>;
export type RawConfigKey = keyof typeof rawConfigSchema.shape;

// ---------------------------------------------------------------------------------------------
// Messages

const TYPE_NAMES: Record<string, string> = {
  string: 'a string',
  number: 'a number',
  int: 'an integer',
  boolean: 'true or false',
  array: 'a list',
  object: 'a mapping',
  record: 'a mapping',
};

interface IssueLike {
  code?: string;
  expected?: string;
  input?: unknown;
  origin?: string;
  minimum?: number | bigint;
  maximum?: number | bigint;
  inclusive?: boolean;
  values?: readonly unknown[];
  message?: string;
}

/**
 * zod error map giving config-style messages ("expected an integer, got string \"8080\"").
 * Pass it as `safeParse(v, { error: configIssueMessage, reportInput: true })`; messages a schema
 * sets itself still win, so plugin authors can phrase their own.
 */
export function configIssueMessage(issue: IssueLike): string | undefined {
  switch (issue.code) {
    case 'invalid_type': {
      if (issue.input === undefined) return REQUIRED;
      const expected = TYPE_NAMES[issue.expected ?? ''] ?? issue.expected ?? 'another type';
      if (typeof issue.input === 'number' && !Number.isFinite(issue.input) && issue.expected === 'number') {
        return `expected a finite number, got ${describeValue(issue.input)}`;
      }
      return `expected ${expected}, got ${describeValue(issue.input)}`;
    }
    case 'too_small': {
      const min = Number(issue.minimum);
      if (issue.origin === 'string') return min <= 1 ? 'must not be empty' : `must be at least ${min} characters`;
      if (issue.origin === 'array') return `must have at least ${min} item${min === 1 ? '' : 's'}`;
      if (issue.inclusive === false) return `must be greater than ${min}`;
      return `must be >= ${min}, got ${describeValue(issue.input)}`;
    }
    case 'too_big': {
      const max = Number(issue.maximum);
      if (issue.origin === 'string') return `must be at most ${max} characters`;
      if (issue.origin === 'array') return `must have at most ${max} items`;
      if (issue.inclusive === false) return `must be less than ${max}`;
      return `must be <= ${max}, got ${describeValue(issue.input)}`;
    }
    case 'invalid_value': {
      const values = (issue.values ?? []).map((v) => JSON.stringify(v));
      if (issue.input === undefined) return `${REQUIRED} (one of ${values.join(', ')})`;
      return values.length === 1
        ? `must be ${values[0]}, got ${describeValue(issue.input)}`
        : `must be one of ${values.join(', ')}; got ${describeValue(issue.input)}`;
    }
    case 'invalid_union':
      return `has an unsupported form (${describeValue(issue.input)})`;
    default:
      return undefined;
  }
}
