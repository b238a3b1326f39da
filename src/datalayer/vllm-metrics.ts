/**
 * Turns a model server's /metrics page into EndpointMetrics (SPEC §7.1), per engine type (the
 * `llm-d.ai/engine-type` label), after llm-d's core-metrics-extractor:
 *
 * | engine        | waiting                      | running                      | KV usage (0..1)                                        | LoRA                      | cache config (block size, blocks)            |
 * |---------------|------------------------------|------------------------------|--------------------------------------------------------|---------------------------|----------------------------------------------|
 * | vllm          | vllm:num_requests_waiting    | vllm:num_requests_running    | vllm:kv_cache_usage_perc, else vllm:gpu_cache_usage_perc | vllm:lora_requests_info   | vllm:cache_config_info{block_size,num_gpu_blocks} |
 * | sglang        | sglang:num_queue_reqs        | sglang:num_running_reqs      | sglang:token_usage                                     | —                         | sglang:cache_config_info{page_size,num_pages} |
 * | trtllm-serve  | trtllm_num_requests_waiting  | trtllm_num_requests_running  | trtllm_kv_cache_utilization                            | —                         | —                                            |
 *
 * Progress (Sluice: a hung engine's page stops changing, its work counters first): the sum of
 * `vllm:iteration_tokens_total_count`, `vllm:generation_tokens_total` and `vllm:prompt_tokens_total`
 * (sglang: `sglang:realtime_tokens_total`, updated every log interval, and its token counters, which
 * move only when a request ends; trtllm-serve: none), over every series present; undefined when the
 * page has none of them (Pool.recordScrape, outlier.ts stallTimeout).
 *
 * vLLM's waiting queue counts requests that wait for something else than room on the server: a
 * decode request pulling its KV from a prefill server (P/D), one waiting for a LoRA slot. Where the
 * page has `vllm:num_requests_waiting_by_reason` (vLLM V1), its `reason="capacity"` series is read
 * as the queue instead, so a decode server busy pulling KV does not read as saturated (llm-d reads
 * `vllm:num_requests_waiting`, and such a decode tier throttles itself under P/D load).
 *
 * The served model: the `model_name` label of the first running-requests series (vLLM and sglang
 * label their series with it; vLLM with its first `--served-model-name`). Pool.eligibleFor sends a
 * request only to the servers of its model when the pool's servers name several.
 *
 * Several series of one family (vLLM data parallel: `engine="0"`, `engine="1"`, ...) are summed for
 * waiting/running and averaged for KV usage — llm-d takes only the first series, which under-counts a
 * DP server's load (GIE #2950).
 *
 * Strictness: a page without the waiting, running or KV family is not a model server we can route to,
 * and a negative/NaN/infinite value is a lying metric; both throw, so the scrape counts as failed and
 * the endpoint's previous values go stale rather than being trusted. The optional LoRA and cache
 * families are best effort: a series whose labels do not parse is skipped (vLLM has been seen to print
 * `num_gpu_blocks="None"`), the rest of the page still counts.
 */
import type { CacheConfigInfo, EndpointMetrics, LoraInfo } from './endpoint.js';
import { forEachSample, labelsAt, type LazySamples } from './prom-text.js';

export interface EngineMetricNames {
  waiting: string;
  /** A family that counts the waiting requests by reason: when present, its series with `label` = `value` are the queue. */
  waitingForCapacity?: { metric: string; label: string; value: string };
  running: string;
  /** KV-usage families in order of preference; the first one present on the page is used. */
  kvUsage: readonly string[];
  /** Info gauge whose value is a timestamp; the newest series wins. */
  lora?: string;
  cacheConfig?: { metric: string; blockSizeLabel: string; numBlocksLabel: string };
  /**
   * Counters that advance while the engine works (tokens computed, engine steps): their sum is the
   * endpoint's progress, which stops when its engine hangs (outlier.ts).
   */
  progress?: readonly string[];
  /**
   * Labels of ranks that repeat rank 0's queue and KV numbers (tensor or pipeline parallel ranks of
   * one scheduler): only series where each is absent or "0" count. Data-parallel ranks, each with a
   * queue of its own, are summed.
   */
  replicaLabels?: readonly string[];
}

export const ENGINE_METRIC_NAMES: Readonly<Record<string, EngineMetricNames>> = {
  vllm: {
    waiting: 'vllm:num_requests_waiting',
    waitingForCapacity: { metric: 'vllm:num_requests_waiting_by_reason', label: 'reason', value: 'capacity' },
    running: 'vllm:num_requests_running',
    kvUsage: ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'],
    lora: 'vllm:lora_requests_info',
    cacheConfig: { metric: 'vllm:cache_config_info', blockSizeLabel: 'block_size', numBlocksLabel: 'num_gpu_blocks' },
    // Token counters move every step that outputs a token; a long chunked prefill moves the KV usage instead.
    progress: ['vllm:iteration_tokens_total_count', 'vllm:generation_tokens_total', 'vllm:prompt_tokens_total'],
  },
  sglang: {
    waiting: 'sglang:num_queue_reqs',
    running: 'sglang:num_running_reqs',
    kvUsage: ['sglang:token_usage'],
    cacheConfig: { metric: 'sglang:cache_config_info', blockSizeLabel: 'page_size', numBlocksLabel: 'num_pages' },
    progress: ['sglang:realtime_tokens_total', 'sglang:generation_tokens_total', 'sglang:prompt_tokens_total'],
    // --enable-metrics-for-all-schedulers: every TP (and PP) rank exports its scheduler group's queue.
    replicaLabels: ['tp_rank', 'pp_rank'],
  },
  'trtllm-serve': {
    waiting: 'trtllm_num_requests_waiting',
    running: 'trtllm_num_requests_running',
    kvUsage: ['trtllm_kv_cache_utilization'],
  },
};

export const KNOWN_ENGINE_TYPES: readonly string[] = Object.keys(ENGINE_METRIC_NAMES);

/** Thrown when a page parses but cannot be trusted as a model server's metrics. */
export class MetricsExtractError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MetricsExtractError';
  }
}

/** Per engine: the set of family names read in full, built once (the filter runs on every page line). The LoRA family is read lazily. */
const wantedSets = new Map<string, Set<string>>();

function wantedSetFor(engineType: string, names: EngineMetricNames): Set<string> {
  let set = wantedSets.get(engineType);
  if (set === undefined) {
    set = new Set([names.waiting, names.running, ...names.kvUsage]);
    if (names.cacheConfig !== undefined) set.add(names.cacheConfig.metric);
    if (names.waitingForCapacity !== undefined) set.add(names.waitingForCapacity.metric);
    for (const name of names.progress ?? []) set.add(name);
    wantedSets.set(engineType, set);
  }
  return set;
}

function parseCount(label: string | undefined): number | undefined {
  if (label === undefined || label.length === 0 || label.length > 15) return undefined;
  for (let k = 0; k < label.length; k++) {
    const c = label.charCodeAt(k);
    if (c < 48 || c > 57) return undefined;
  }
  return Number(label);
}

function splitAdapterList(label: string | undefined): string[] {
  if (label === undefined || label.length === 0) return [];
  const out: string[] = [];
  for (const part of label.split(',')) {
    const name = part.trim();
    if (name.length > 0) out.push(name);
  }
  return out;
}

function checkGauge(name: string, value: number): void {
  // `!(value >= 0)` also catches NaN.
  if (!(value >= 0) || value === Infinity) {
    throw new MetricsExtractError(`${name} has an invalid value ${value} (must be a finite number >= 0)`);
  }
}

/**
 * Reads EndpointMetrics from a /metrics page. Throws PromParseError on malformed text and
 * MetricsExtractError on a missing core family, an invalid core value or an unknown engine type.
 */
export function extractVllmMetrics(text: string, engineType = 'vllm'): EndpointMetrics {
  const names = ENGINE_METRIC_NAMES[engineType];
  if (names === undefined) {
    throw new MetricsExtractError(`unknown engine type '${engineType}' (known: ${KNOWN_ENGINE_TYPES.join(', ')})`);
  }
  const wanted = wantedSetFor(engineType, names);

  let waiting = 0;
  let waitingSeries = 0;
  const byReason = names.waitingForCapacity;
  let forCapacity = 0;
  let forCapacitySeries = 0;
  let running = 0;
  let runningSeries = 0;
  const kvSum = new Array<number>(names.kvUsage.length).fill(0);
  const kvSeries = new Array<number>(names.kvUsage.length).fill(0);
  // The value is the series' creation time: the newest series describes the current state. Only its
  // labels are built (a long-running LoRA server prints tens of thousands of these series).
  let loraValue = -Infinity;
  let loraAt = -1;
  let loraLine = 0;
  const loraName = names.lora;
  const lazyLora: LazySamples | undefined =
    loraName === undefined
      ? undefined
      : {
          names: (name) => name === loraName,
          onSample: (_name, value, at, line) => {
            if (value > loraValue) {
              loraValue = value;
              loraAt = at;
              loraLine = line;
            }
          },
        };
  let cacheConfig: CacheConfigInfo | undefined;
  const progressNames = names.progress;
  let progress: number | undefined;
  let model: string | undefined;
  const replicaLabels = names.replicaLabels;
  /** Series of the summed families seen so far: a page that prints one twice counts it once. */
  let seen: Set<string> | undefined;
  const countsOnce = (name: string, labels: Record<string, string>): boolean => {
    if (replicaLabels !== undefined) {
      for (const l of replicaLabels) {
        const rank = labels[l];
        if (rank !== undefined && rank !== '0') return false;
      }
    }
    const key = name + JSON.stringify(labels);
    if ((seen ??= new Set()).has(key)) return false;
    seen.add(key);
    return true;
  };

  forEachSample(
    text,
    (name) => wanted.has(name),
    (name, labels, value) => {
      if ((name === names.waiting || name === names.running || names.kvUsage.includes(name)) && !countsOnce(name, labels)) return;
      if (name === names.waiting) {
        checkGauge(name, value);
        waiting += value;
        waitingSeries++;
      } else if (name === names.running) {
        checkGauge(name, value);
        running += value;
        runningSeries++;
        if (model === undefined) {
          const served = labels.model_name;
          if (served !== undefined && served.length > 0) model = served;
        }
      } else if (byReason !== undefined && name === byReason.metric) {
        if (labels[byReason.label] !== byReason.value || !countsOnce(name, labels)) return;
        checkGauge(name, value);
        forCapacity += value;
        forCapacitySeries++;
      } else if (progressNames !== undefined && progressNames.includes(name)) {
        // Any change says the engine moved; a value that cannot be a count is left out.
        if (value >= 0 && value !== Infinity) progress = (progress ?? 0) + value;
      } else if (names.cacheConfig !== undefined && name === names.cacheConfig.metric) {
        if (cacheConfig === undefined) {
          const blockSize = parseCount(labels[names.cacheConfig.blockSizeLabel]);
          const numGpuBlocks = parseCount(labels[names.cacheConfig.numBlocksLabel]);
          if (blockSize !== undefined && numGpuBlocks !== undefined) cacheConfig = { blockSize, numGpuBlocks };
        }
      } else {
        const k = names.kvUsage.indexOf(name);
        if (k >= 0) {
          checkGauge(name, value);
          kvSum[k]! += value;
          kvSeries[k]!++;
        }
      }
    },
    lazyLora,
  );

  if (waitingSeries === 0) throw new MetricsExtractError(`metric ${names.waiting} is missing`);
  if (runningSeries === 0) throw new MetricsExtractError(`metric ${names.running} is missing`);
  const kvIndex = kvSeries.findIndex((count) => count > 0);
  if (kvIndex < 0) throw new MetricsExtractError(`metric ${names.kvUsage.join(' (or ')}${names.kvUsage.length > 1 ? ')' : ''} is missing`);

  const metrics: EndpointMetrics = { waiting: forCapacitySeries > 0 ? forCapacity : waiting, running, kvUsage: kvSum[kvIndex]! / kvSeries[kvIndex]! };
  if (loraAt >= 0) {
    const loraLabels = labelsAt(text, loraAt, loraLine);
    const maxLora = parseCount(loraLabels['max_lora']);
    if (maxLora !== undefined) {
      const lora: LoraInfo = {
        running: splitAdapterList(loraLabels['running_lora_adapters']),
        waiting: splitAdapterList(loraLabels['waiting_lora_adapters']),
        maxLora,
      };
      metrics.lora = lora;
    }
  }
  if (cacheConfig !== undefined) metrics.cacheConfig = cacheConfig;
  if (progress !== undefined) metrics.progress = progress;
  if (model !== undefined) metrics.model = model;
  return metrics;
}
