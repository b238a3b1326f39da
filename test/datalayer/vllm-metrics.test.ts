import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { PromParseError } from '../../src/datalayer/prom-text.js';
import { extractVllmMetrics, KNOWN_ENGINE_TYPES, MetricsExtractError } from '../../src/datalayer/vllm-metrics.js';

const referencePage = readFileSync(new URL('../fixtures/vllm-metrics.txt', import.meta.url), 'utf8');

/** What a Node simulator built on prom-client prints (hand-written in that style). */
const promClientPage = `# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="sim-model"} 7

# HELP vllm:num_requests_waiting Prometheus metric for the number of queued requests.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="sim-model"} 2

# HELP vllm:kv_cache_usage_perc Prometheus metric for the fraction of KV-cache blocks currently in use (from 0 to 1).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="sim-model"} 0.8125

# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="64",num_gpu_blocks="2048"} 1

# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="sim-model"} 0
vllm:time_to_first_token_seconds_bucket{le="0.005",model_name="sim-model"} 0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="sim-model"} 12
vllm:time_to_first_token_seconds_sum{model_name="sim-model"} 1.9000000000000001
vllm:time_to_first_token_seconds_count{model_name="sim-model"} 12

# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="sim-model"} 4096

# HELP nodejs_eventloop_lag_seconds Lag of event loop in seconds.
# TYPE nodejs_eventloop_lag_seconds gauge
nodejs_eventloop_lag_seconds 0.003114
`;

/** Real vLLM V1 with data parallel 2, Python prometheus_client formatting, CRLF to be awkward. */
const pythonDataParallelPage = [
  '# HELP python_gc_objects_collected_total Objects collected during gc',
  '# TYPE python_gc_objects_collected_total counter',
  'python_gc_objects_collected_total{generation="0"} 15384.0',
  '# HELP vllm:num_requests_running Number of requests in model execution batches.',
  '# TYPE vllm:num_requests_running gauge',
  'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0',
  'vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6.0',
  '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
  '# TYPE vllm:num_requests_waiting gauge',
  'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0',
  'vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0',
  '# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.',
  '# TYPE vllm:gpu_cache_usage_perc gauge',
  'vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.9',
  'vllm:gpu_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.9',
  '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
  '# TYPE vllm:kv_cache_usage_perc gauge',
  'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25',
  'vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.75',
  '# HELP vllm:prompt_tokens_total Number of prefill tokens processed.',
  '# TYPE vllm:prompt_tokens_total counter',
  'vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0',
  'vllm:prompt_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7234567891234567e+09',
  '# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.',
  '# TYPE vllm:time_to_first_token_seconds histogram',
  'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0',
  'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0',
  'vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0',
  'vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.14',
  'vllm:time_to_first_token_seconds_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7234567891234567e+09',
  '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig',
  '# TYPE vllm:cache_config_info gauge',
  'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000",sliding_window="None"} 1.0',
  'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000",sliding_window="None"} 1.0',
  '',
].join('\r\n');

const minimal = (waiting: string, running: string, kv: string, extra = ''): string =>
  `vllm:num_requests_waiting ${waiting}\nvllm:num_requests_running ${running}\nvllm:kv_cache_usage_perc ${kv}\n${extra}`;

describe('extractVllmMetrics: pages', () => {
  test('the reference page (Go-client format, as the llm-d simulator prints it)', () => {
    assert.deepEqual(extractVllmMetrics(referencePage), {
      waiting: 3,
      running: 5,
      kvUsage: 0.4,
      // Two series: the one with the larger timestamp value is the current state.
      lora: { running: ['lora4', 'lora3'], waiting: [], maxLora: 1 },
      cacheConfig: { blockSize: 16, numGpuBlocks: 1024 },
      // vllm:prompt_tokens_total + vllm:generation_tokens_total
      progress: 12345 + 67890,
      model: 'Qwen/Qwen2.5-0.5B-Instruct',
    });
  });

  test('a prom-client (Node) page', () => {
    assert.deepEqual(extractVllmMetrics(promClientPage), {
      waiting: 2,
      running: 7,
      kvUsage: 0.8125,
      cacheConfig: { blockSize: 64, numGpuBlocks: 2048 },
      progress: 4096,
      model: 'sim-model',
    });
  });

  test('a Python-client data-parallel page: waiting/running summed, KV averaged, kv_ preferred over gpu_', () => {
    assert.deepEqual(extractVllmMetrics(pythonDataParallelPage), {
      waiting: 3,
      running: 10,
      kvUsage: 0.5,
      cacheConfig: { blockSize: 16, numGpuBlocks: 27000 },
      progress: 123456,
      model: 'meta-llama/Llama-3.1-8B-Instruct',
    });
  });

  test('progress: the sum of the work counters present (engine steps, prompt and generated tokens, every series); none → undefined', () => {
    const page = (extra: string) => `${minimal('0', '2', '0.5')}${extra}`;
    assert.equal(extractVllmMetrics(page('')).progress, undefined);
    assert.equal(
      extractVllmMetrics(
        page(
          [
            'vllm:generation_tokens_total{engine="0"} 100',
            'vllm:generation_tokens_total{engine="1"} 50',
            'vllm:prompt_tokens_total{engine="0"} 7',
            'vllm:iteration_tokens_total_bucket{le="+Inf"} 3',
            'vllm:iteration_tokens_total_count 3',
            'vllm:iteration_tokens_total_sum 157',
            'vllm:request_success_total 9',
            '',
          ].join('\n'),
        ),
      ).progress,
      100 + 50 + 7 + 3,
    );
    assert.equal(extractVllmMetrics(page('vllm:generation_tokens_total NaN\nvllm:prompt_tokens_total 4\n')).progress, 4, 'a value that is no count is left out');
    // sglang's token counters move only when a request finishes; realtime_tokens_total every log interval.
    const sglang = (realtime: number) =>
      'sglang:num_queue_reqs 0\nsglang:num_running_reqs 1\nsglang:token_usage 0.1\nsglang:generation_tokens_total 11\nsglang:prompt_tokens_total 5\n' +
      `sglang:realtime_tokens_total{mode="decode"} ${realtime}\nsglang:realtime_tokens_total{mode="prefill_compute"} 100\n`;
    assert.equal(extractVllmMetrics(sglang(400), 'sglang').progress, 11 + 5 + 400 + 100);
    assert.notEqual(extractVllmMetrics(sglang(400), 'sglang').progress, extractVllmMetrics(sglang(401), 'sglang').progress);
  });

  test('the engine type defaults to vllm', () => {
    assert.deepEqual(extractVllmMetrics(minimal('1', '2', '0.5')), extractVllmMetrics(minimal('1', '2', '0.5'), 'vllm'));
    assert.deepEqual(KNOWN_ENGINE_TYPES.includes('vllm') && KNOWN_ENGINE_TYPES.includes('sglang'), true);
  });
});

test('the served model: model_name of the first running series; none without the label (or with an empty one)', () => {
  assert.equal(extractVllmMetrics(minimal('0', '1', '0.5')).model, undefined);
  const page = (running: string) => `vllm:num_requests_waiting 0\n${running}vllm:kv_cache_usage_perc 0.1\n`;
  assert.equal(extractVllmMetrics(page('vllm:num_requests_running{engine="0",model_name=""} 1\nvllm:num_requests_running{engine="1",model_name="b"} 1\n')).model, 'b');
  assert.equal(extractVllmMetrics(page('vllm:num_requests_running{engine="0",model_name="a"} 1\nvllm:num_requests_running{engine="1",model_name="b"} 1\n')).model, 'a');
  // Only the running family names it: a model_name on another family is not read.
  assert.equal(extractVllmMetrics('vllm:num_requests_waiting{model_name="w"} 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n').model, undefined);
});

describe('extractVllmMetrics: the queue of requests waiting for capacity', () => {
  // vLLM V1: a decode request pulling its KV from a prefill server waits as "deferred", not for room.
  const pd =
    'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0\n' +
    'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 1.0\n' +
    'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 6.0\n' +
    'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n' +
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n';

  test('reason="capacity" is the queue where the page has it; KV pulls in flight are not', () => {
    assert.deepEqual(extractVllmMetrics(pd), { waiting: 1, running: 3, kvUsage: 0.4, model: 'm' });
  });

  test('summed over data-parallel engines, each series once; without the family, num_requests_waiting', () => {
    const dp = pd + pd.replaceAll('engine="0"', 'engine="1"').replace('reason="capacity"} 1.0', 'reason="capacity"} 2.0');
    assert.equal(extractVllmMetrics(dp + dp).waiting, 3);
    assert.equal(extractVllmMetrics(minimal('7', '3', '0.4')).waiting, 7);
    assert.throws(() => extractVllmMetrics(pd.replace('reason="capacity"} 1.0', 'reason="capacity"} -1')), /num_requests_waiting_by_reason has an invalid value/);
  });
});

describe('extractVllmMetrics: a series printed twice', () => {
  test('counts once (a sidecar concatenating pages): Prometheus keeps one sample of a duplicate too', () => {
    const once = 'vllm:num_requests_waiting{engine="0"} 4\nvllm:num_requests_running{engine="0"} 8\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n';
    assert.deepEqual(extractVllmMetrics(once + once, 'vllm'), { waiting: 4, running: 8, kvUsage: 0.5 });
  });
});

describe('extractVllmMetrics: KV fallback', () => {
  test('gpu_cache_usage_perc is used when kv_cache_usage_perc is absent, averaged over series', () => {
    const page = [
      'vllm:num_requests_waiting{engine="0"} 0',
      'vllm:num_requests_running{engine="0"} 1',
      'vllm:gpu_cache_usage_perc{engine="0"} 0.2',
      'vllm:gpu_cache_usage_perc{engine="1"} 0.4',
      '',
    ].join('\n');
    const m = extractVllmMetrics(page);
    assert.ok(Math.abs(m.kvUsage - 0.3) < 1e-12);
  });

  test('kv_cache_usage_perc wins even when gpu_cache_usage_perc comes first on the page', () => {
    const page = 'vllm:gpu_cache_usage_perc 0.9\n' + minimal('0', '0', '0.1');
    assert.equal(extractVllmMetrics(page).kvUsage, 0.1);
  });
});

describe('extractVllmMetrics: LoRA info', () => {
  test('the series with the largest value wins regardless of order; adapter lists are trimmed', () => {
    const lora = [
      'vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 100',
      'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a, b",waiting_lora_adapters="c"} 300',
      'vllm:lora_requests_info{max_lora="4",running_lora_adapters="mid",waiting_lora_adapters=""} 200',
    ].join('\n');
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', lora)).lora, { running: ['a', 'b'], waiting: ['c'], maxLora: 4 });
  });

  test('empty adapter lists become empty arrays; a NaN series never wins', () => {
    const lora = [
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 5',
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="x",waiting_lora_adapters=""} NaN',
    ].join('\n');
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', lora)).lora, { running: [], waiting: [], maxLora: 2 });
  });

  test('an empty name in an adapter list (a trailing comma) is no adapter', () => {
    const lora = 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,",waiting_lora_adapters=" ,b"} 1\n';
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', lora)).lora, { running: ['a'], waiting: ['b'], maxLora: 2 });
  });

  test('two series with the same value: the first on the page wins', () => {
    const lora = [
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 5',
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 5',
    ].join('\n');
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', lora)).lora?.running, ['a']);
  });

  test('absent family → no lora; unparseable max_lora → lora omitted, core metrics still read', () => {
    assert.equal(extractVllmMetrics(minimal('0', '0', '0')).lora, undefined);
    const bad = 'vllm:lora_requests_info{max_lora="many",running_lora_adapters="a"} 1\n';
    const m = extractVllmMetrics(minimal('1', '0', '0', bad));
    assert.equal(m.lora, undefined);
    assert.equal(m.waiting, 1);
  });
});

describe('extractVllmMetrics: cache config', () => {
  test('block_size and num_gpu_blocks label values parsed as integers', () => {
    const extra = 'vllm:cache_config_info{block_size="32",cache_dtype="auto",num_gpu_blocks="500"} 1\n';
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', extra)).cacheConfig, { blockSize: 32, numGpuBlocks: 500 });
  });

  test('num_gpu_blocks="None" (vLLM before profiling) → no cacheConfig, no error', () => {
    const extra = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n';
    assert.equal(extractVllmMetrics(minimal('0', '0', '0', extra)).cacheConfig, undefined);
  });

  test('the first series with both labels valid is used', () => {
    const extra = [
      'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None"} 1',
      'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="77"} 1',
      '',
    ].join('\n');
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', extra)).cacheConfig, { blockSize: 16, numGpuBlocks: 77 });
  });

  test('two valid series: the first is kept, not the last', () => {
    const extra = [
      'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1',
      'vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="200"} 1',
      '',
    ].join('\n');
    assert.deepEqual(extractVllmMetrics(minimal('0', '0', '0', extra)).cacheConfig, { blockSize: 16, numGpuBlocks: 100 });
  });
});

describe('extractVllmMetrics: sglang mapping', () => {
  const page = [
    '# TYPE sglang:num_queue_reqs gauge',
    'sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 4.0',
    'sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 9.0',
    'sglang:token_usage{model_name="qwen",tp_rank="0"} 0.62',
    'sglang:cache_config_info{page_size="1",num_pages="180000"} 1.0',
    // vLLM names on an sglang page are not read.
    'vllm:num_requests_waiting 100',
    '',
  ].join('\n');

  test('num_queue_reqs → waiting, num_running_reqs → running, token_usage → kvUsage, page_size/num_pages → cacheConfig', () => {
    assert.deepEqual(extractVllmMetrics(page, 'sglang'), {
      waiting: 4,
      running: 9,
      kvUsage: 0.62,
      cacheConfig: { blockSize: 1, numGpuBlocks: 180000 },
      model: 'qwen',
    });
  });

  test('every TP/PP rank of one scheduler repeats its queue (--enable-metrics-for-all-schedulers): rank 0 counts; data-parallel ranks add up', () => {
    const ranks = (dp: number, tp: number) =>
      [
        `sglang:num_queue_reqs{dp_rank="${dp}",pp_rank="0",tp_rank="${tp}"} ${6 + dp}`,
        `sglang:num_running_reqs{dp_rank="${dp}",pp_rank="0",tp_rank="${tp}"} ${8 + dp}`,
        `sglang:token_usage{dp_rank="${dp}",pp_rank="0",tp_rank="${tp}"} ${0.5 + dp / 10}`,
      ].join('\n');
    const all = [0, 1].flatMap((dp) => [0, 1, 2, 3].map((tp) => ranks(dp, tp))).join('\n') + '\n';
    assert.deepEqual(extractVllmMetrics(all, 'sglang'), { waiting: 13, running: 17, kvUsage: 0.55 });
  });

  test('KV usage is read from tensor-parallel rank 0 only: a rank that prints another value is not averaged in', () => {
    const page = [
      'sglang:num_queue_reqs{tp_rank="0"} 1',
      'sglang:num_running_reqs{tp_rank="0"} 1',
      'sglang:token_usage{tp_rank="0"} 0.2',
      'sglang:token_usage{tp_rank="1"} 0.6',
      '',
    ].join('\n');
    assert.equal(extractVllmMetrics(page, 'sglang').kvUsage, 0.2);
  });

  test('a vLLM page read as sglang is missing metrics', () => {
    assert.throws(() => extractVllmMetrics(referencePage, 'sglang'), /sglang:num_queue_reqs is missing/);
  });

  test('trtllm-serve names', () => {
    const trt = 'trtllm_num_requests_waiting 1\ntrtllm_num_requests_running 2\ntrtllm_kv_cache_utilization 0.5\n';
    assert.deepEqual(extractVllmMetrics(trt, 'trtllm-serve'), { waiting: 1, running: 2, kvUsage: 0.5 });
  });
});

describe('extractVllmMetrics: pages we must not trust', () => {
  test('each missing core family is named', () => {
    assert.throws(
      () => extractVllmMetrics('vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n'),
      (err: unknown) => err instanceof MetricsExtractError && /vllm:num_requests_waiting is missing/.test(err.message),
    );
    assert.throws(() => extractVllmMetrics('vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0\n'), /vllm:num_requests_running is missing/);
    assert.throws(
      () => extractVllmMetrics('vllm:num_requests_waiting 1\nvllm:num_requests_running 1\n'),
      /vllm:kv_cache_usage_perc \(or vllm:gpu_cache_usage_perc\) is missing/,
    );
  });

  test('an empty page, a comments-only page, and a plain-text error page fail', () => {
    assert.throws(() => extractVllmMetrics(''), MetricsExtractError);
    assert.throws(() => extractVllmMetrics('# HELP x y\n# TYPE x gauge\n'), MetricsExtractError);
    assert.throws(() => extractVllmMetrics('Internal Server Error\n'), /missing/);
    assert.throws(() => extractVllmMetrics('<html><body>502 Bad Gateway</body></html>'), PromParseError);
  });

  test('negative, NaN and infinite core values are rejected', () => {
    assert.throws(() => extractVllmMetrics(minimal('-1', '0', '0')), /vllm:num_requests_waiting has an invalid value -1/);
    assert.throws(() => extractVllmMetrics(minimal('0', 'NaN', '0')), /vllm:num_requests_running has an invalid value NaN/);
    assert.throws(() => extractVllmMetrics(minimal('0', '0', '+Inf')), /vllm:kv_cache_usage_perc has an invalid value Infinity/);
    assert.throws(() => extractVllmMetrics('vllm:gpu_cache_usage_perc -0.5\n' + minimal('0', '0', '0.1')), /gpu_cache_usage_perc has an invalid value/);
  });

  test('a malformed line inside a family we read fails with its line number', () => {
    assert.throws(() => extractVllmMetrics(minimal('1', '2', '0.1', 'vllm:num_requests_waiting{engine="1} 3\n')), /line 4/);
  });

  test('an unknown engine type is an error naming the known ones', () => {
    assert.throws(() => extractVllmMetrics(referencePage, 'tgi'), /unknown engine type 'tgi' \(known: vllm, sglang/);
  });
});

test('sglang: pipeline-parallel ranks repeat rank 0, counted once', () => {
  const page = [
    'sglang:num_queue_reqs{tp_rank="0",pp_rank="0"} 3', 'sglang:num_queue_reqs{tp_rank="0",pp_rank="1"} 3',
    'sglang:num_running_reqs{tp_rank="0",pp_rank="0"} 5', 'sglang:num_running_reqs{tp_rank="0",pp_rank="1"} 5',
    'sglang:token_usage{tp_rank="0",pp_rank="0"} 0.5', '',
  ].join('\n');
  const m = extractVllmMetrics(page, 'sglang');
  assert.deepEqual([m.waiting, m.running], [3, 5]);
});
