import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../src/datalayer/endpoint.js';
import { GatewayMetrics, LabelCap, OVERFLOW_LABEL_VALUE, poolStats, type GatewayMetricsOptions } from '../../src/metrics/metrics.js';
import { runPromtool } from '../helpers/promtool.js';
import { SPEC_METRICS } from '../helpers/spec-metrics.js';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Minimal parser of the text exposition format (enough for prom-client's output, escapes included). */
function parseSamples(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const nameEnd = line.search(/[{ ]/);
    const name = line.slice(0, nameEnd);
    const labels: Record<string, string> = {};
    let i = nameEnd;
    if (line[i] === '{') {
      i++;
      while (line[i] !== '}') {
        const eq = line.indexOf('=', i);
        const key = line.slice(i, eq);
        i = eq + 2; // skip ="
        let value = '';
        while (line[i] !== '"') {
          if (line[i] === '\\') {
            const next = line[i + 1];
            value += next === 'n' ? '\n' : next;
            i += 2;
          } else {
            value += line[i++];
          }
        }
        labels[key] = value;
        i++; // closing quote
        if (line[i] === ',') i++;
      }
      i++; // closing brace
    }
    samples.push({ name, labels, value: Number(line.slice(i).trim()) });
  }
  return samples;
}

function samplesOf(text: string, name: string): Sample[] {
  return parseSamples(text).filter((s) => s.name === name);
}

function endpoint(name: string, role?: string): Endpoint {
  return new Endpoint({ name, address: '127.0.0.1', port: 8000, labels: role === undefined ? {} : { 'llm-d.ai/role': role } });
}

function makeMetrics(endpoints: Endpoint[], extra: Partial<GatewayMetricsOptions> = {}): GatewayMetrics {
  return new GatewayMetrics({ poolName: 'test-pool', pool: () => ({ endpoints }), defaultMetrics: false, ...extra });
}

describe('LabelCap', () => {
  test('keeps the first N distinct values and folds the rest into "other"', () => {
    const cap = new LabelCap(2);
    assert.equal(cap.map('a'), 'a');
    assert.equal(cap.map('b'), 'b');
    assert.equal(cap.map('c'), OVERFLOW_LABEL_VALUE);
    assert.equal(cap.map('a'), 'a', 'an admitted value stays admitted');
    assert.equal(cap.map('d'), OVERFLOW_LABEL_VALUE);
    assert.equal(cap.size, 2);
  });

  test('a zero cap folds everything', () => {
    assert.equal(new LabelCap(0).map('a'), OVERFLOW_LABEL_VALUE);
  });

  test('truncates very long values before admission', () => {
    const cap = new LabelCap(10, 'other', 8);
    assert.equal(cap.map('x'.repeat(1000)), 'xxxxxxxx');
    assert.equal(cap.size, 1);
  });

  test('rejects a negative cap', () => {
    assert.throws(() => new LabelCap(-1), RangeError);
  });
});

describe('GatewayMetrics', () => {
  test("sluice_request_rejected_total's help names every reason it exports (the help texts are the docs' source of truth)", async () => {
    const text = await makeMetrics([]).registry.metrics();
    const help = /^# HELP sluice_request_rejected_total (.*)$/m.exec(text)![1]!;
    const reasons = [...text.matchAll(/^sluice_request_rejected_total\{reason="(\w+)",code="(\d+)"\}/gm)].map((m) => `${m[1]} ${m[2]}`);
    assert.ok(reasons.length >= 9, reasons.join());
    for (const reason of reasons) assert.ok(help.includes(reason), `${reason} in: ${help}`);
  });

  test('records request metrics with model labels', async () => {
    const metrics = makeMetrics([]);
    const series = metrics.forModel('llama', 'llama-lora');
    assert.equal(metrics.forModel('llama', 'llama-lora'), series, 'series are cached per model pair');
    series.started();
    series.ttft(0.12, true);
    series.tokens(100, 20);
    series.duration(0.5);
    series.ended();
    series.started();
    series.error(503);
    series.ttft(0.01, false);
    const text = await metrics.text();
    const labels = { model_name: 'llama', target_model_name: 'llama-lora' };

    assert.deepEqual(samplesOf(text, 'llm_d_epp_request_total'), [{ name: 'llm_d_epp_request_total', labels, value: 2 }]);
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_request_error_total').filter((s) => s.value > 0),
      [{ name: 'llm_d_epp_request_error_total', labels: { ...labels, error_code: '503' }, value: 1 }],
    );
    assert.deepEqual(samplesOf(text, 'llm_d_epp_request_running'), [
      { name: 'llm_d_epp_request_running', labels: { model_name: 'llama' }, value: 1 },
    ]);
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_request_ttft_seconds_count').map((s) => [s.labels.streaming, s.value]),
      [['true', 1], ['false', 1]],
    );
    assert.equal(samplesOf(text, 'llm_d_epp_request_duration_seconds_sum')[0]?.value, 0.5);
    assert.deepEqual(samplesOf(text, 'llm_d_epp_request_input_tokens_sum')[0]?.labels, labels);
    assert.equal(samplesOf(text, 'llm_d_epp_request_input_tokens_sum')[0]?.value, 100);
    assert.equal(samplesOf(text, 'llm_d_epp_request_output_tokens_sum')[0]?.value, 20);
    const inputBuckets = samplesOf(text, 'llm_d_epp_request_input_tokens_bucket');
    assert.equal(inputBuckets.find((s) => s.labels.le === '64')?.value, 0);
    assert.equal(inputBuckets.find((s) => s.labels.le === '128')?.value, 1);
  });

  test('token counts that are no finite number (a model server sending 1e999) are not observed: one would poison the sums for good', async () => {
    const metrics = makeMetrics([]);
    const series = metrics.forModel('m');
    series.tokens(Infinity, NaN);
    series.tokens(5, Infinity);
    const text = await metrics.text();
    const one = (name: string) => samplesOf(text, name).map((s) => s.value);
    assert.deepEqual(one('llm_d_epp_request_input_tokens_count'), [1]);
    assert.deepEqual(one('llm_d_epp_request_input_tokens_sum'), [5]);
    assert.deepEqual(one('llm_d_epp_request_output_tokens_count'), [], 'nothing observed, no series');
  });

  test('target model defaults to the requested model', async () => {
    const metrics = makeMetrics([]);
    metrics.forModel('m').started();
    const [sample] = samplesOf(await metrics.text(), 'llm_d_epp_request_total');
    assert.deepEqual(sample?.labels, { model_name: 'm', target_model_name: 'm' });
  });

  test('the counters alerts take rates of are exposed from 0 before their first event (a first burst is then visible to rate())', async () => {
    const metrics = makeMetrics([endpoint('pod-a')]);
    metrics.forModel('llama').started();
    metrics.flowControlPriorities([0, -1]);
    const text = await metrics.text();
    const zeros = (name: string, label: string) =>
      samplesOf(text, name)
        .filter((s) => s.value === 0)
        .map((s) => s.labels[label])
        .sort();
    assert.deepEqual(zeros('sluice_request_cancelled_total', 'stage'), ['queued', 'streaming', 'waiting_first_byte']);
    assert.deepEqual(zeros('llm_d_epp_request_error_total', 'error_code'), ['429', '502', '503', '504']);
    assert.deepEqual(zeros('llm_d_epp_datalayer_poll_errors_total', 'endpoint_name'), ['pod-a']);
    assert.deepEqual(zeros('llm_d_epp_upstream_retries_total', 'endpoint_name'), ['pod-a']);
    assert.deepEqual(zeros('sluice_endpoint_upstream_errors_total', 'error'), ['abandoned', 'body_timeout', 'connect', 'cut', 'failed', 'headers_timeout', 'http_5xx', 'reset', 'stream_error']);
    const outcomes = samplesOf(text, 'llm_d_epp_flow_control_requests_total').filter((s) => s.value === 0);
    assert.equal(outcomes.length, 16, 'eight outcomes × two priorities');
    assert.ok(outcomes.some((s) => s.labels.outcome === 'EvictedTTL' && s.labels.priority === '-1' && s.labels.inference_pool === 'test-pool'));
  });

  test("a band a reload removes, a renamed pool and flow control turned off leave no series that never counted", async () => {
    const metrics = makeMetrics([]);
    const series = async () =>
      samplesOf(await metrics.text(), 'llm_d_epp_flow_control_requests_total')
        .map((s) => `${s.labels.inference_pool}/${s.labels.priority}/${s.labels.outcome}=${s.value}`)
        .filter((s) => s.endsWith('=1') || s.includes('/Dispatched='));
    metrics.flowControlPriorities([0, -1]);
    metrics.flowControlOutcome('EvictedTTL', -1, 'f', 1);
    assert.deepEqual(await series(), ['test-pool/0/Dispatched=0', 'test-pool/-1/Dispatched=0', 'test-pool/-1/EvictedTTL=1']);
    metrics.flowControlPriorities([0]); // a reload removed the band of -1: what it counted stays
    assert.deepEqual(await series(), ['test-pool/0/Dispatched=0', 'test-pool/-1/EvictedTTL=1']);
    metrics.setPoolName('renamed');
    metrics.flowControlPriorities([0]);
    assert.deepEqual(await series(), ['test-pool/-1/EvictedTTL=1', 'renamed/0/Dispatched=0']);
    metrics.flowControlPriorities([]); // flow control off
    assert.deepEqual(await series(), ['test-pool/-1/EvictedTTL=1']);
  });

  test('a large page is rendered family by family with turns for the event loop between them, as prom-client renders it', async () => {
    // A slice of 0 ms: a turn after every family, whatever the machine's speed.
    const metrics = makeMetrics([endpoint('pod-a')], { renderSliceMs: 0 });
    for (let i = 0; i < 1000; i++) {
      const model = metrics.forModel(`model-${i}`);
      model.started();
      model.duration(0.5); // a histogram of its own: about 40 series per model
    }
    let turns = 0;
    let done = false;
    const tick = (): void => {
      if (done) return;
      turns++;
      setImmediate(tick);
    };
    setImmediate(tick);
    const text = await metrics.text();
    done = true;
    const families = metrics.registry.getMetricsAsArray().length;
    assert.ok(turns >= families - 1, `the event loop had ${turns} turns while ${families} families rendered`);
    assert.equal(text, await metrics.registry.metrics());
    assert.ok(text.length > 3_000_000, `${text.length} characters`);
  });

  test('P/D fallbacks count from 0 for the connector in use; a connector no longer used keeps its series only if it counted', async () => {
    const metrics = makeMetrics([]);
    const series = async () => samplesOf(await metrics.text(), 'sluice_pd_degraded_total').map((s) => `${s.labels.connector}=${s.value}`);
    assert.deepEqual(await series(), []);
    metrics.pdConnectors(['nixlv2']);
    assert.deepEqual(await series(), ['nixlv2=0']);
    metrics.pdDegraded('nixlv2');
    metrics.pdConnectors(['sidecar']); // a reload changed the connector
    assert.deepEqual(await series(), ['nixlv2=1', 'sidecar=0']);
    metrics.pdConnectors([]); // P/D off
    assert.deepEqual(await series(), ['nixlv2=1']);
  });

  test('records scheduler, datalayer, retry and disaggregation counters', async () => {
    const metrics = makeMetrics([]);
    metrics.schedulerDuration(0.00003);
    metrics.schedulerAttempt('success', 'decode-0');
    metrics.schedulerAttempt('success', 'decode-0');
    metrics.schedulerAttempt('failure');
    metrics.scrapeError('decode-1');
    metrics.upstreamRetry('decode-0');
    metrics.disaggDecision('m', 'prefill-decode');
    metrics.dispatchCycle(0.00001);
    const text = await metrics.text();
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_scheduler_attempts_total').map((s) => [s.labels.status, s.labels.endpoint_name, s.value]),
      [['failure', '', 1], ['success', 'decode-0', 2]], // the failure series exists from the start
    );
    assert.equal(samplesOf(text, 'llm_d_epp_scheduler_e2e_duration_seconds_count')[0]?.value, 1);
    const microBucket = samplesOf(text, 'llm_d_epp_scheduler_e2e_duration_seconds_bucket').find((s) => s.labels.le === '0.00005');
    assert.equal(microBucket?.value, 1, 'scheduler buckets resolve tens of microseconds');
    assert.deepEqual(samplesOf(text, 'llm_d_epp_datalayer_poll_errors_total')[0]?.labels, { endpoint_name: 'decode-1' });
    assert.deepEqual(samplesOf(text, 'llm_d_epp_upstream_retries_total')[0]?.labels, { endpoint_name: 'decode-0' });
    assert.deepEqual(samplesOf(text, 'llm_d_epp_disagg_decision_total')[0]?.labels, { model_name: 'm', decision_type: 'prefill-decode' });
    assert.equal(samplesOf(text, 'llm_d_epp_flow_control_dispatch_cycle_duration_seconds_count')[0]?.value, 1);
  });

  test('per-endpoint first-byte latency and upstream errors', async () => {
    const metrics = makeMetrics([]);
    metrics.endpointFirstByte('decode-0', 0.03);
    metrics.endpointFirstByte('decode-0', 3);
    metrics.endpointFirstByte('decode-1', 0.02);
    metrics.endpointUpstreamError('decode-1', 'http_5xx');
    metrics.endpointUpstreamError('decode-1', 'http_5xx');
    metrics.endpointUpstreamError('decode-0', 'connect');
    const text = await metrics.text();
    assert.deepEqual(
      samplesOf(text, 'sluice_endpoint_first_byte_seconds_count').map((s) => [s.labels.endpoint_name, s.value]),
      [['decode-0', 2], ['decode-1', 1]],
    );
    assert.equal(samplesOf(text, 'sluice_endpoint_first_byte_seconds_bucket').find((s) => s.labels.endpoint_name === 'decode-0' && s.labels.le === '1')?.value, 1);
    assert.deepEqual(
      samplesOf(text, 'sluice_endpoint_upstream_errors_total').map((s) => [s.labels.endpoint_name, s.labels.error, s.value]),
      [['decode-1', 'http_5xx', 2], ['decode-0', 'connect', 1]],
    );
  });

  test('caps distinct model names: 2000 models give at most 1001 series per metric', async () => {
    const metrics = makeMetrics([]);
    for (let i = 0; i < 2000; i++) {
      const series = metrics.forModel(`model-${i}`, `target-${i}`);
      series.started();
      series.duration(0.1);
      series.ended();
    }
    const text = await metrics.text();
    const totals = samplesOf(text, 'llm_d_epp_request_total');
    assert.ok(totals.length <= 1001, `request_total has ${totals.length} series`);
    assert.equal(totals.reduce((sum, s) => sum + s.value, 0), 2000, 'no request is lost by folding');
    const other = totals.find((s) => s.labels.model_name === OVERFLOW_LABEL_VALUE);
    assert.equal(other?.value, 1000);
    assert.equal(other?.labels.target_model_name, OVERFLOW_LABEL_VALUE);
    assert.ok(samplesOf(text, 'llm_d_epp_request_running').length <= 1001);
    assert.ok(samplesOf(text, 'llm_d_epp_request_duration_seconds_count').length <= 1001);
  });

  test('caps model pairs even when each name alone is under the cap', async () => {
    const metrics = makeMetrics([], { maxLabelValues: 10 });
    for (let m = 0; m < 10; m++) for (let t = 0; t < 10; t++) metrics.forModel(`m${m}`, `t${t}`).started();
    const totals = samplesOf(await metrics.text(), 'llm_d_epp_request_total');
    assert.ok(totals.length <= 11, `request_total has ${totals.length} series`);
    assert.equal(totals.reduce((sum, s) => sum + s.value, 0), 100);
  });

  test('endpoint gauges are computed at scrape time and removed endpoints disappear', async () => {
    let now = 1_000_000;
    const scraped = endpoint('prefill-0', 'prefill');
    scraped.metrics = { waiting: 4, running: 2, kvUsage: 0.3 };
    scraped.metricsAt = now - 250;
    scraped.inFlight = 3;
    scraped.inFlightTokens = 1200;
    const neverScraped = endpoint('decode-0');
    let endpoints = [scraped, neverScraped];
    const metrics = new GatewayMetrics({ poolName: 'p', pool: () => ({ endpoints }), now: () => now, defaultMetrics: false });

    let text = await metrics.text();
    assert.deepEqual(samplesOf(text, 'llm_d_epp_endpoint_metrics_age_seconds'), [
      { name: 'llm_d_epp_endpoint_metrics_age_seconds', labels: { endpoint_name: 'prefill-0', role: 'prefill' }, value: 0.25 },
      { name: 'llm_d_epp_endpoint_metrics_age_seconds', labels: { endpoint_name: 'decode-0', role: '' }, value: -1 },
    ]);
    assert.deepEqual(samplesOf(text, 'llm_d_epp_per_endpoint_queue_size'), [
      { name: 'llm_d_epp_per_endpoint_queue_size', labels: { endpoint_name: 'prefill-0', role: 'prefill' }, value: 4 },
    ]);
    // What the saturation detector reads, per endpoint: running requests and KV-cache usage.
    assert.deepEqual(samplesOf(text, 'sluice_endpoint_running_requests'), [
      { name: 'sluice_endpoint_running_requests', labels: { endpoint_name: 'prefill-0', role: 'prefill' }, value: 2 },
    ]);
    assert.deepEqual(samplesOf(text, 'sluice_endpoint_kv_cache_usage_ratio'), [
      { name: 'sluice_endpoint_kv_cache_usage_ratio', labels: { endpoint_name: 'prefill-0', role: 'prefill' }, value: 0.3 },
    ]);
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_endpoint_inflight_requests').map((s) => [s.labels.endpoint_name, s.value]),
      [['prefill-0', 3], ['decode-0', 0]],
    );
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_inflight_tokens').map((s) => [s.labels.endpoint_name, s.labels.role, s.value]),
      [['prefill-0', 'prefill', 1200], ['decode-0', '', 0]],
    );

    now += 1000;
    scraped.inFlight = 1;
    endpoints = [scraped];
    text = await metrics.text();
    for (const name of ['llm_d_epp_endpoint_metrics_age_seconds', 'llm_d_epp_per_endpoint_queue_size', 'sluice_endpoint_running_requests', 'sluice_endpoint_kv_cache_usage_ratio', 'llm_d_epp_endpoint_inflight_requests', 'llm_d_epp_inflight_tokens']) {
      const names = samplesOf(text, name).map((s) => s.labels.endpoint_name);
      assert.deepEqual(names, ['prefill-0'], `${name} after removal`);
    }
    assert.equal(samplesOf(text, 'llm_d_epp_endpoint_metrics_age_seconds')[0]?.value, 1.25);
    assert.equal(samplesOf(text, 'llm_d_epp_endpoint_inflight_requests')[0]?.value, 1);

    scraped.removed = true; // a pool may keep a removed endpoint while its requests drain
    text = await metrics.text();
    assert.equal(samplesOf(text, 'llm_d_epp_endpoint_inflight_requests').length, 0, 'endpoints flagged removed have no series');
  });

  test('two scrapes at once (two Prometheus replicas): pages are rendered one after the other, so a removed endpoint is still exposed once', async () => {
    let endpoints = [endpoint('pod-a'), endpoint('pod-b')];
    // A turn for the event loop after every family: the second scrape arrives mid-render.
    const metrics = makeMetrics([], { pool: () => ({ endpoints }), renderSliceMs: 0 });
    metrics.upstreamRetry('pod-b');
    await metrics.text();
    endpoints = [endpoints[0]!]; // a reload removed pod-b
    const first = metrics.text();
    const second = new Promise<string>((resolve) => setImmediate(() => resolve(metrics.text())));
    const has = (text: string) => samplesOf(text, 'llm_d_epp_upstream_retries_total').some((s) => s.labels.endpoint_name === 'pod-b');
    const [one, two] = await Promise.all([first, second]);
    assert.deepEqual([has(one), has(two)], [true, false]);
  });

  test('recorded series of a removed endpoint are exposed once more, then dropped; a late event shows once', async () => {
    const [kept, leaving] = [endpoint('pod-a'), endpoint('pod-b')];
    let endpoints = [kept, leaving];
    const metrics = makeMetrics([], { pool: () => ({ endpoints }) });
    const perEndpoint = [
      'llm_d_epp_scheduler_attempts_total',
      'llm_d_epp_datalayer_poll_errors_total',
      'llm_d_epp_upstream_retries_total',
      'sluice_endpoint_first_byte_seconds_count',
      'sluice_endpoint_upstream_errors_total',
    ];
    const record = (name: string): void => {
      metrics.schedulerAttempt('success', name);
      metrics.scrapeError(name);
      metrics.upstreamRetry(name);
      metrics.endpointFirstByte(name, 0.05);
      metrics.endpointUpstreamError(name, 'connect');
    };
    const namesIn = (text: string, metric: string) => [
      ...new Set(
        samplesOf(text, metric)
          .map((s) => s.labels.endpoint_name)
          .filter((n) => n !== '')
          .sort(),
      ),
    ];
    record('pod-a');
    record('pod-b');
    metrics.schedulerAttempt('failure'); // no endpoint: kept whatever the pool
    let text = await metrics.text();
    for (const m of perEndpoint) assert.deepEqual(namesIn(text, m), ['pod-a', 'pod-b'], m);

    endpoints = [kept]; // a reload removed pod-b
    text = await metrics.text();
    for (const m of perEndpoint) assert.deepEqual(namesIn(text, m), ['pod-a', 'pod-b'], `${m}: the last values are exposed once`);
    text = await metrics.text();
    for (const m of perEndpoint) assert.deepEqual(namesIn(text, m), ['pod-a'], `${m}: then dropped`);
    assert.equal(samplesOf(text, 'llm_d_epp_scheduler_attempts_total').length, 2, 'the failure series (no endpoint) stays');

    metrics.endpointUpstreamError('pod-b', 'cut'); // a stream of the removed endpoint broke after the reload
    text = await metrics.text();
    assert.deepEqual(
      samplesOf(text, 'sluice_endpoint_upstream_errors_total')
        .filter((s) => s.value > 0)
        .map((s) => [s.labels.endpoint_name, s.labels.error, s.value]),
      [['pod-a', 'connect', 1], ['pod-b', 'cut', 1]],
    );
    text = await metrics.text();
    assert.deepEqual(namesIn(text, 'sluice_endpoint_upstream_errors_total'), ['pod-a']);

    endpoints = [kept, endpoint('pod-b')]; // back again: counted afresh
    record('pod-b');
    text = await metrics.text();
    text = await metrics.text();
    for (const m of perEndpoint) assert.deepEqual(namesIn(text, m), ['pod-a', 'pod-b'], `${m}: a live endpoint is never dropped`);
    assert.equal(samplesOf(text, 'llm_d_epp_upstream_retries_total').find((s) => s.labels.endpoint_name === 'pod-b')?.value, 1);
  });

  test("llm-d's pool gauges: means, standard deviations and ready endpoints over the endpoints with fresh metrics", async () => {
    const now = 1_000_000;
    const withMetrics = (name: string, waiting: number, running: number, kvUsage: number, ageMs: number): Endpoint => {
      const ep = endpoint(name);
      ep.metrics = { waiting, running, kvUsage };
      ep.metricsAt = now - ageMs;
      return ep;
    };
    const endpoints = [withMetrics('a', 2, 4, 0.25, 10), withMetrics('b', 4, 8, 0.75, 100), withMetrics('stale', 50, 50, 1, 5000), endpoint('never')];
    const removed = withMetrics('gone', 9, 9, 0.9, 10);
    removed.removed = true;
    assert.deepEqual(poolStats([...endpoints, removed], now, 1000), {
      readyEndpoints: 2,
      kvCacheUtilization: { mean: 0.5, stdDev: 0.25 },
      queueSize: { mean: 3, stdDev: 1 },
      runningRequests: { mean: 6, stdDev: 2 },
    });
    assert.deepEqual(poolStats(endpoints, now, 1), { readyEndpoints: 0 }, 'none fresh: no averages');

    const metrics = makeMetrics([], { pool: () => ({ endpoints }), now: () => now });
    metrics.setFreshWindow(() => 1000);
    let text = await metrics.text();
    const value = (name: string) => samplesOf(text, name).map((s) => [s.labels.name, s.value]);
    assert.deepEqual(value('llm_d_epp_ready_endpoints'), [['test-pool', 2]]);
    assert.deepEqual(value('llm_d_epp_average_queue_size'), [['test-pool', 3]]);
    assert.deepEqual(value('llm_d_epp_average_running_requests'), [['test-pool', 6]]);
    assert.deepEqual(value('llm_d_epp_std_dev_running_requests'), [['test-pool', 2]]);
    assert.deepEqual(value('llm_d_epp_average_kv_cache_utilization'), [['test-pool', 0.5]]);
    metrics.setFreshWindow(() => 1);
    text = await metrics.text();
    assert.deepEqual(value('llm_d_epp_ready_endpoints'), [['test-pool', 0]]);
    assert.deepEqual(value('llm_d_epp_average_queue_size'), [], 'no fresh metrics: no average');
  });

  test('saturation gauges come from the source at scrape time; empty stages have no series', async () => {
    const metrics = makeMetrics([]);
    let text = await metrics.text();
    assert.equal(samplesOf(text, 'llm_d_epp_flow_control_pool_saturation').length, 0, 'no source, no series');
    assert.match(text, /1\.0 is the gating set point; values above 1\.0 are the magnitude of oversubscription; an empty pool and stale metrics read 1\.0 \(fail closed\)/);

    metrics.setSaturationSource(() => ({ stages: { decode: 1.5, prefill: 0.25 }, global: 1.5, stale: 2, detector: 'utilization-detector' }));
    text = await metrics.text();
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_flow_control_pool_saturation').map((s) => [s.labels.inference_pool, s.labels.stage, s.value]).sort(),
      [['test-pool', 'decode', 1.5], ['test-pool', 'global', 1.5], ['test-pool', 'prefill', 0.25]],
    );
    assert.deepEqual(samplesOf(text, 'llm_d_epp_flow_control_stale_endpoints'), [
      { name: 'llm_d_epp_flow_control_stale_endpoints', labels: { detector: 'utilization-detector' }, value: 2 },
    ]);

    metrics.setSaturationSource(() => ({ stages: { interleaved: 0.5 }, global: 0.5, stale: 0, detector: 'utilization-detector' }));
    text = await metrics.text();
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_flow_control_pool_saturation').map((s) => s.labels.stage).sort(),
      ['global', 'interleaved'],
      'stages that became empty lose their series',
    );
  });

  test('flow-control gauges come from the source; capped fairness ids are summed into "other"', async () => {
    const metrics = makeMetrics([], { maxLabelValues: 1 });
    metrics.setFlowControlSource(() => ({
      flows: [
        { fairnessId: 'tenant-a', priority: 0, requests: 2, bytes: 200 },
        { fairnessId: 'tenant-b', priority: 0, requests: 3, bytes: 300 },
        { fairnessId: 'tenant-c', priority: 0, requests: 1, bytes: 100 },
      ],
      bands: [{ priority: 0, requestsUtilization: 0.5, bytesUtilization: 0.25 }],
    }));
    metrics.flowControlOutcome('Dispatched', 0, 'tenant-a', 0.002);
    metrics.flowControlOutcome('EvictedTTL', -1, 'tenant-z', 60);
    const text = await metrics.text();
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_flow_control_queue_size').map((s) => [s.labels.fairness_id, s.value]),
      [['tenant-a', 2], [OVERFLOW_LABEL_VALUE, 4]],
    );
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_flow_control_queue_bytes').map((s) => [s.labels.fairness_id, s.value]),
      [['tenant-a', 200], [OVERFLOW_LABEL_VALUE, 400]],
    );
    assert.deepEqual(samplesOf(text, 'llm_d_epp_flow_control_capacity_utilization_requests')[0], {
      name: 'llm_d_epp_flow_control_capacity_utilization_requests',
      labels: { priority: '0', inference_pool: 'test-pool' },
      value: 0.5,
    });
    assert.equal(samplesOf(text, 'llm_d_epp_flow_control_capacity_utilization_bytes')[0]?.value, 0.25);
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_flow_control_requests_total').map((s) => [s.labels.outcome, s.labels.priority, s.value]),
      [['Dispatched', '0', 1], ['EvictedTTL', '-1', 1]],
    );
    assert.deepEqual(
      samplesOf(text, 'llm_d_epp_flow_control_request_queue_duration_seconds_count').map((s) => s.labels),
      [
        { fairness_id: 'tenant-a', priority: '0', outcome: 'Dispatched', inference_pool: 'test-pool' },
        { fairness_id: OVERFLOW_LABEL_VALUE, priority: '-1', outcome: 'EvictedTTL', inference_pool: 'test-pool' },
      ],
    );
  });

  test('every SPEC §9 metric is defined with a HELP text', async () => {
    const text = await makeMetrics([]).text();
    const expected = SPEC_METRICS.map(([name]) => name);
    for (const name of expected) assert.match(text, new RegExp(`^# HELP ${name} \\S.{20,}$`, 'm'), name);
  });
});

describe('promtool check metrics', () => {
  /** Renders every metric with at least one series, awkward label values included. */
  async function fullExposition(): Promise<string> {
    const prefill = endpoint('prefill-0', 'prefill');
    prefill.metrics = { waiting: 1, running: 2, kvUsage: 0.5 };
    prefill.metricsAt = Date.now() - 10;
    const metrics = new GatewayMetrics({ poolName: 'pool', pool: () => ({ endpoints: [prefill, endpoint('decode-0')] }) });
    const series = metrics.forModel('weird "model"\\name\nwith newline ünïcödé', 'target');
    series.started();
    series.ttft(0.05, true);
    series.duration(0.2);
    series.tokens(12, 34);
    series.error('upstream-unavailable');
    series.ended();
    metrics.schedulerDuration(0.0002);
    metrics.schedulerAttempt('success', 'prefill-0');
    metrics.scrapeError('decode-0');
    metrics.upstreamRetry('prefill-0');
    metrics.disaggDecision('m', 'decode-only');
    // A plugin type's decision counter is made once, however often asked for (a reload asks again).
    metrics.decisionCounter('prefix-cache-affinity-filter', 'Prefix cache affinity filter decisions.')('affinity', 'sticky');
    metrics.decisionCounter('prefix-cache-affinity-filter', 'Prefix cache affinity filter decisions.')('affinity', 'sticky');
    metrics.dispatchCycle(0.00002);
    metrics.flowControlOutcome('RejectedCapacity', 10, 'flow "1"', 0.5);
    metrics.setSaturationSource(() => ({ stages: { prefill: 0.4, decode: 1 }, global: 1, stale: 1, detector: 'utilization-detector' }));
    metrics.setFlowControlSource(() => ({
      flows: [{ fairnessId: 'default-flow', priority: 0, requests: 1, bytes: 42 }],
      bands: [{ priority: 0, requestsUtilization: 0.0002, bytesUtilization: 0 }],
    }));
    return metrics.text();
  }

  test('the exposition passes promtool (lint warnings tolerated, errors not)', async (t) => {
    const text = await fullExposition();
    assert.match(text, /^llm_d_epp_prefix_cache_affinity_filter_decisions_total\{plugin_name="affinity",outcome="sticky"\} 2$/m);
    const run = runPromtool(t, ['check', 'metrics'], text);
    if (run === undefined) return;
    const output = `${run.stdout}${run.stderr}`;
    // Lint lines start with the metric name, which may itself contain "error" (request_error_total).
    const metricNames = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]));
    const errorLines = output
      .split('\n')
      .filter((line) => line.trim() !== '')
      .filter((line) => /error/i.test(metricNames.has(line.split(' ')[0] ?? '') ? line.slice(line.indexOf(' ')) : line));
    assert.deepEqual(errorLines, [], `promtool reported errors:\n${output}`);
    assert.ok(run.status === 0 || run.status === 3, `promtool exit code ${run.status} (0 clean, 3 lint only):\n${output}`);
  });
});
