import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request } from 'undici';
import OpenAI from 'openai';
import { seededRandom } from '../../src/util/clock.js';
import { startSimulator, type RunningSimulator, type SimOptions } from '../../src/sim/server.js';

const agent = new Agent({ keepAliveTimeout: 1000 });
after(() => agent.close());

type Json = Record<string, unknown>;

async function post(sim: RunningSimulator, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await request(sim.url + path, {
    method: 'POST',
    dispatcher: agent,
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, headers: res.headers, text };
}

async function postJson(sim: RunningSimulator, path: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await post(sim, path, body, headers);
  return { ...r, json: JSON.parse(r.text) as Json };
}

async function get(sim: RunningSimulator, path: string) {
  const res = await request(sim.url + path, { dispatcher: agent });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Strict line-by-line parse of the Prometheus text format (throws on any malformed line). */
function parseMetrics(text: string): Sample[] {
  const samples: Sample[] = [];
  assert.ok(text.endsWith('\n'), 'exposition ends with a newline');
  for (const line of text.slice(0, -1).split('\n')) {
    if (line.startsWith('# HELP ') || line.startsWith('# TYPE ')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `malformed metrics line: ${JSON.stringify(line)}`);
    const labels: Record<string, string> = {};
    if (m[2]) {
      for (const pair of m[2].match(/[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"/g) ?? []) {
        const eq = pair.indexOf('=');
        labels[pair.slice(0, eq)] = pair.slice(eq + 2, -1);
      }
    }
    const value = Number(m[3]);
    assert.ok(!Number.isNaN(value), `bad value in ${line}`);
    samples.push({ name: m[1]!, labels, value });
  }
  return samples;
}

function metricValue(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  const s = samples.find((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v));
  assert.ok(s, `metric ${name} ${JSON.stringify(labels)} present`);
  return s.value;
}

async function scrape(sim: RunningSimulator): Promise<Sample[]> {
  const r = await get(sim, '/metrics');
  assert.equal(r.status, 200);
  return parseMetrics(r.text);
}

/** Opens a streaming request and records each network read with its arrival time. */
async function openStream(sim: RunningSimulator, body: Json, signal?: AbortSignal) {
  const res = await request(sim.url + '/v1/chat/completions', {
    method: 'POST',
    dispatcher: agent,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-model', messages: [{ role: 'user', content: 'hello' }], stream: true, ...body }),
    ...(signal ? { signal } : {}),
  });
  return res;
}

async function waitFor(check: () => boolean, timeoutMs = 2000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not reached in time');
    await sleep(5);
  }
}

async function withSim(opts: SimOptions, fn: (sim: RunningSimulator) => Promise<void>): Promise<void> {
  const sim = await startSimulator({ ttftOverheadMs: 2, prefillMsPerToken: 0, itlMs: 1, ...opts });
  try {
    await fn(sim);
  } finally {
    await sim.close();
  }
}

describe('sim server: answers', () => {
  let sim: RunningSimulator;
  before(async () => {
    sim = await startSimulator({ name: 'pod-a', ttftOverheadMs: 2, prefillMsPerToken: 0, itlMs: 1 });
  });
  after(() => sim.close());

  test('chat JSON answer with usage, pod header and request id echo', async () => {
    const r = await postJson(
      sim, '/v1/chat/completions',
      { model: 'sim-model', messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 5 },
      { 'x-request-id': 'req-123' },
    );
    assert.equal(r.status, 200);
    assert.equal(r.headers['x-inference-pod'], 'pod-a');
    assert.equal(r.headers['x-request-id'], 'req-123');
    assert.match(String(r.headers['content-type']), /application\/json/);
    const body = r.json as {
      id: string; object: string; model: string;
      choices: { index: number; message: { role: string; content: string }; finish_reason: string }[];
      usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number; prompt_tokens_details: { cached_tokens: number } };
    };
    assert.equal(body.object, 'chat.completion');
    assert.equal(body.model, 'sim-model');
    assert.match(body.id, /^chatcmpl-/);
    assert.equal(body.choices[0]!.message.role, 'assistant');
    assert.equal(body.choices[0]!.message.content.split(' ').length, 5);
    assert.equal(body.choices[0]!.finish_reason, 'length');
    const promptTokens = Math.ceil(JSON.stringify([{ role: 'user', content: 'Hi there' }]).length / 4);
    assert.deepEqual(body.usage, {
      prompt_tokens: promptTokens, completion_tokens: 5, total_tokens: promptTokens + 5,
      prompt_tokens_details: { cached_tokens: 0 },
    });
  });

  test('completions JSON answer; max_completion_tokens is not a completions field', async () => {
    const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'Once upon a time', max_tokens: 3 });
    assert.equal(r.status, 200);
    const body = r.json as { object: string; choices: { text: string; finish_reason: string }[]; usage: Json };
    assert.equal(body.object, 'text_completion');
    assert.equal(body.choices[0]!.text.split(' ').length, 3);
    assert.equal(body.usage.prompt_tokens, 4);
    assert.equal(body.usage.completion_tokens, 3);
  });

  test('a repeated long prompt reports cached tokens', async () => {
    const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(30);
    const first = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt, max_tokens: 1 });
    const second = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt, max_tokens: 1 });
    const cached = (r: { json: Json }) => (r.json.usage as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens;
    assert.equal(cached(first), 0);
    assert.ok(cached(second) > 300, `cached ${cached(second)}`);
  });

  test('SSE stream: a role-only first chunk (as vLLM), one event per token, finish reason, usage chunk, [DONE]', async () => {
    const res = await openStream(sim, { max_tokens: 4, stream_options: { include_usage: true } });
    assert.equal(res.statusCode, 200);
    assert.match(String(res.headers['content-type']), /text\/event-stream/);
    assert.equal(res.headers['x-inference-pod'], 'pod-a');
    const text = await res.body.text();
    assert.ok(text.endsWith('data: [DONE]\n\n'));
    const events = text.split('\n\n').filter((e) => e !== '');
    assert.ok(events.every((e) => e.startsWith('data: ')));
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)) as {
      object: string; choices: { delta: { role?: string; content?: string }; finish_reason: string | null }[]; usage?: Json;
    });
    assert.equal(chunks.length, 6, 'role chunk + 4 token chunks + usage chunk');
    assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk'));
    assert.deepEqual(chunks[0]!.choices, [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]);
    for (const c of chunks.slice(1, 5)) {
      assert.deepEqual(Object.keys(c.choices[0]!.delta), ['content'], 'token chunks carry the content only');
      assert.ok(c.choices[0]!.delta.content!.length > 0);
    }
    assert.deepEqual(chunks.slice(0, 5).map((c) => c.choices[0]!.finish_reason), [null, null, null, null, 'length']);
    assert.deepEqual(chunks[5]!.choices, []);
    assert.equal((chunks[5]!.usage as { completion_tokens: number }).completion_tokens, 4);
    assert.equal(typeof (chunks[5]!.usage as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens, 'number');
  });

  test('SSE stream without include_usage has no usage chunk; completions chunks carry text', async () => {
    const res = await request(sim.url + '/v1/completions', {
      method: 'POST', dispatcher: agent, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sim-model', prompt: 'abc', max_tokens: 2, stream: true }),
    });
    const events = (await res.body.text()).split('\n\n').filter((e) => e !== '');
    assert.equal(events.length, 3);
    assert.equal(events[2], 'data: [DONE]');
    const chunk = JSON.parse(events[0]!.slice(6)) as { object: string; choices: { text: string }[]; usage?: unknown };
    assert.equal(chunk.object, 'text_completion');
    assert.equal(typeof chunk.choices[0]!.text, 'string');
    assert.ok(!events.some((e) => e.includes('"usage"')));
  });

  test('the OpenAI SDK reads both answers', async () => {
    const client = new OpenAI({ baseURL: sim.url + '/v1', apiKey: 'none', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal(answer.usage?.completion_tokens, 3);
    const stream = await client.chat.completions.create({
      model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, stream: true,
      stream_options: { include_usage: true },
    });
    let content = '';
    let usageTokens = 0;
    for await (const chunk of stream) {
      content += chunk.choices[0]?.delta.content ?? '';
      usageTokens = chunk.usage?.completion_tokens ?? usageTokens;
    }
    assert.equal(content, answer.choices[0]!.message.content);
    assert.equal(usageTokens, 3);
  });

  test('GET /v1/models lists the model; /health is 200', async () => {
    const models = await get(sim, '/v1/models');
    assert.equal(models.status, 200);
    const body = JSON.parse(models.text) as { object: string; data: { id: string; object: string }[] };
    assert.equal(body.object, 'list');
    assert.deepEqual(body.data.map((m) => [m.id, m.object]), [['sim-model', 'model']]);
    const health = await get(sim, '/health');
    assert.equal(health.status, 200);
    assert.equal(health.headers['x-inference-pod'], 'pod-a');
  });

  test('responses keep the connection alive for pooling gateways', async () => {
    const r = await get(sim, '/health');
    assert.match(String(r.headers['keep-alive']), /timeout=(6[5-9]|[7-9]\d|\d{3,})/);
  });
});

describe('sim server: errors', () => {
  let sim: RunningSimulator;
  before(async () => {
    sim = await startSimulator({ name: 'pod-e', ttftOverheadMs: 1, prefillMsPerToken: 0, itlMs: 0 });
  });
  after(() => sim.close());

  const cases: [string, string, unknown, number, RegExp, string | null][] = [
    ['invalid JSON', '/v1/chat/completions', '{"model": ', 400, /Invalid JSON/, null],
    ['non-object body', '/v1/chat/completions', '[1,2]', 400, /JSON object/, null],
    ['a model that is no string', '/v1/chat/completions', { model: 5, messages: [{ role: 'user', content: 'x' }] }, 400, /model/, 'model'],
    ['a message without a role', '/v1/chat/completions', { model: 'sim-model', messages: [{}] }, 400, /role/, 'messages'],
    ['stream_options without stream (vLLM refuses it: a P/D prefill leg must strip it)', '/v1/chat/completions', { model: 'sim-model', stream: false, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'x' }] }, 400, /^Stream options can only be defined when `stream=True`\.$/, 'stream_options'],
    ['stream that is no boolean, even as vLLM reads one (pydantic lax: "true", 1 … pass)', '/v1/completions', { model: 'sim-model', prompt: 'x', stream: 'maybe' }, 400, /stream/, 'stream'],
    ['cache_salt that is no string', '/v1/completions', { model: 'sim-model', prompt: 'x', cache_salt: 5 }, 400, /cache_salt/, 'cache_salt'],
    ['missing messages', '/v1/chat/completions', { model: 'sim-model' }, 400, /messages/, 'messages'],
    ['empty messages', '/v1/chat/completions', { model: 'sim-model', messages: [] }, 400, /messages/, 'messages'],
    ['missing prompt', '/v1/completions', { model: 'sim-model' }, 400, /prompt/, 'prompt'],
    ['bad max_tokens', '/v1/completions', { model: 'sim-model', prompt: 'x', max_tokens: 0 }, 400, /max_tokens/, 'max_tokens'],
    ['n = 0 (vLLM: n must be at least 1)', '/v1/chat/completions', { model: 'sim-model', n: 0, messages: [{ role: 'user', content: 'x' }] }, 400, /^n must be an integer ≥ 1$/, 'n'],
    ['n that is no integer', '/v1/completions', { model: 'sim-model', prompt: 'x', n: 1.5 }, 400, /^n must be an integer ≥ 1$/, 'n'],
    ['n that is a string', '/v1/completions', { model: 'sim-model', prompt: 'x', n: '2' }, 400, /^n must be an integer ≥ 1$/, 'n'],
    ['a prompt batch mixing strings and token ids', '/v1/completions', { model: 'sim-model', prompt: ['a', [1, 2]] }, 400, /prompt/, 'prompt'],
    ['unknown model', '/v1/completions', { model: 'gpt-9', prompt: 'x' }, 404, /^The model `gpt-9` does not exist\.$/, 'model'],
  ];
  for (const [title, path, body, status, message, param] of cases) {
    test(`${title} → ${status} in the OpenAI error shape`, async () => {
      const r = await postJson(sim, path, body);
      assert.equal(r.status, status);
      assert.equal(r.headers['x-inference-pod'], 'pod-e');
      const err = (r.json as { error: { message: string; type: string; param: string | null; code: number } }).error;
      assert.match(err.message, message);
      assert.equal(err.type, status === 404 ? 'NotFoundError' : 'BadRequestError');
      assert.equal(err.param, param);
      assert.equal(err.code, status);
    });
  }

  test('without max_tokens the output stops at the end of the context window, as vLLM: finish_reason length', async () => {
    await withSim({ maxModelLen: 100, defaultOutputTokens: 16 }, async (small) => {
      const r = await postJson(small, '/v1/completions', { model: 'sim-model', prompt: 'x'.repeat(99 * 4) });
      assert.equal(r.status, 200);
      const body = r.json as { usage: { completion_tokens: number }; choices: { finish_reason: string }[] };
      assert.deepEqual([body.usage.completion_tokens, body.choices[0]!.finish_reason], [1, 'length']);
    });
  });

  test('no model: the served one answers, as vLLM', async () => {
    const r = await postJson(sim, '/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 1 });
    assert.equal(r.status, 200);
    assert.equal(r.json.model, 'sim-model');
  });

  test('messages nested too deeply to serialise → 400, not a 500', async () => {
    const depth = 100_000; // JSON.parse takes it; JSON.stringify runs out of stack
    const body = `{"model":"sim-model","messages":[{"role":"user","content":${'['.repeat(depth)}"x"${']'.repeat(depth)}}]}`;
    const r = await postJson(sim, '/v1/chat/completions', body);
    assert.equal(r.status, 400);
  });

  test('token-id prompts are accepted', async () => {
    const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: [1, 2, 3], max_tokens: 1 });
    assert.equal(r.status, 200);
  });

  test('x-return-error answers that status at once', async () => {
    const r = await postJson(sim, '/v1/chat/completions', { model: 'sim-model', messages: [{ role: 'user', content: 'x' }] }, { 'x-return-error': '503' });
    assert.equal(r.status, 503);
    assert.deepEqual(Object.keys(r.json.error as Json).sort(), ['code', 'message', 'param', 'type']);
    assert.equal((r.json.error as Json).type, 'InternalServerError');
    const rl = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'x' }, { 'x-return-error': '429' });
    assert.equal(rl.status, 429);
    assert.equal((rl.json.error as Json).type, 'RateLimitError');
  });

  test('unknown paths and methods → 404 JSON', async () => {
    for (const r of [await get(sim, '/v2/nothing'), await get(sim, '/v1/chat/completions')]) {
      assert.equal(r.status, 404);
      assert.equal(r.headers['x-inference-pod'], 'pod-e');
      assert.equal((JSON.parse(r.text) as { error: { code: number } }).error.code, 404);
    }
  });

  test('POST /v1/embeddings → 404 saying the simulator does not implement it', async () => {
    const r = await postJson(sim, '/v1/embeddings', { model: 'sim-model', input: 'hi' });
    assert.equal(r.status, 404);
    assert.equal(r.headers['x-inference-pod'], 'pod-e');
    assert.deepEqual(r.json.error, {
      message: 'sluice sim does not implement POST /v1/embeddings (chat completions, completions and responses only)',
      type: 'NotFoundError',
      param: null,
      code: 404,
    });
  });

  test('a prompt over the default max-model-len (131072) → 400 at once, not a held prefill', async () => {
    // 131072+ tokens at 0.1 ms each would hold the answer for 13 s (the user's 12 MB: past the gateway's time-out).
    await withSim({ prefillMsPerToken: 0.1 }, async (s) => {
      const started = Date.now();
      const content = 'x'.repeat(4 * 131_072);
      const chat = await postJson(s, '/v1/chat/completions', { model: 'sim-model', messages: [{ role: 'user', content }] });
      const completion = await postJson(s, '/v1/completions', { model: 'sim-model', prompt: content });
      assert.ok(Date.now() - started < 2000, `answered after ${Date.now() - started} ms`);
      for (const [r, param] of [[chat, 'messages'], [completion, 'prompt']] as const) {
        assert.equal(r.status, 400, r.text);
        const err = r.json.error as Json;
        assert.match(String(err.message), /^This model's maximum context length is 131072 tokens\. However, your request has \d+ input tokens\./);
        assert.deepEqual([err.type, err.param, err.code], ['BadRequestError', param, 400]);
      }
      assert.equal(s.engine.counters.prefixCacheQueries, 0, 'never reached the engine');
    });
  });

  test('maxModelLen: the prompt leaves room for one token, prompt + max_tokens must fit; 0 = no limit', async () => {
    await withSim({ maxModelLen: 100 }, async (s) => {
      const complete = (prompt: string, extra: Json = {}) => postJson(s, '/v1/completions', { model: 'sim-model', prompt, ...extra });
      assert.equal((await complete('x'.repeat(396), { max_tokens: 1 })).status, 200); // 99 + 1 tokens
      const full = await complete('x'.repeat(400)); // 100 tokens
      assert.equal(full.status, 400);
      assert.equal((full.json.error as Json).param, 'prompt');
      const tooLong = await complete('x'.repeat(396), { max_tokens: 2 });
      assert.equal(tooLong.status, 400);
      assert.equal((tooLong.json.error as Json).param, 'max_tokens');
      assert.equal(
        (tooLong.json.error as Json).message,
        "'max_tokens' or 'max_completion_tokens' is too large: 2. This model's maximum context length is 100 tokens and your request has 99 input tokens (2 > 100 - 99).",
      );
    });
    await withSim({ maxModelLen: 0 }, async (s) => {
      const r = await postJson(s, '/v1/completions', { model: 'sim-model', prompt: 'x'.repeat(4 * 140_000), max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
    });
  });

  test('failureRate injects failureStatus', async () => {
    await withSim({ failureRate: 1, failureStatus: 502, random: seededRandom(1) }, async (s) => {
      const r = await postJson(s, '/v1/completions', { model: 'sim-model', prompt: 'x' });
      assert.equal(r.status, 502);
      assert.equal((r.json.error as Json).code, 502);
    });
  });

  test('a full waiting queue → 429 RateLimitError', async () => {
    await withSim({ maxNumSeqs: 1, maxWaiting: 0, itlMs: 20 }, async (s) => {
      const held = await openStream(s, { max_tokens: 50 });
      const r = await postJson(s, '/v1/completions', { model: 'sim-model', prompt: 'x' });
      assert.equal(r.status, 429);
      assert.equal((r.json.error as Json).type, 'RateLimitError');
      held.body.destroy();
    });
  });
});

describe('sim server: streaming, load and admin', () => {
  test('SSE events arrive incrementally: the first before the last token is produced', async () => {
    await withSim({ itlMs: 25 }, async (sim) => {
      const res = await openStream(sim, { max_tokens: 6 });
      const arrivals: { at: number; events: number; finishedInEngine: number }[] = [];
      for await (const chunk of res.body) {
        arrivals.push({
          at: Date.now(),
          events: (String(chunk).match(/^data: /gm) ?? []).length,
          finishedInEngine: sim.engine.counters.requestSuccess.length,
        });
      }
      assert.ok(arrivals.length >= 3, `expected several reads, got ${arrivals.length}`);
      assert.equal(arrivals[0]!.events, 2, 'the first read holds just the role chunk and the first token');
      assert.equal(arrivals[0]!.finishedInEngine, 0, 'the engine had not produced the last token yet');
      const spread = arrivals.at(-1)!.at - arrivals[0]!.at;
      assert.ok(spread >= 80, `first and last events are ~125 ms apart, got ${spread}`);
    });
  });

  test('/metrics reflects running and waiting requests while streams are held', async () => {
    await withSim({ maxNumSeqs: 2, itlMs: 20, numGpuBlocks: 1000 }, async (sim) => {
      const controller = new AbortController();
      const streams = await Promise.all([0, 1].map(() => openStream(sim, { max_tokens: 100 }, controller.signal)));
      // The third is queued: its headers only come with its first token, so don't await it.
      const third = openStream(sim, { max_tokens: 100 }, controller.signal).catch(() => undefined);
      await waitFor(() => sim.engine.actualGauges().waiting === 1);

      const samples = await scrape(sim);
      const model = { model_name: 'sim-model' };
      assert.equal(metricValue(samples, 'vllm:num_requests_running', model), 2);
      assert.equal(metricValue(samples, 'vllm:num_requests_waiting', model), 1);
      assert.ok(metricValue(samples, 'vllm:kv_cache_usage_perc', model) > 0);
      assert.equal(metricValue(samples, 'vllm:cache_config_info', { block_size: '16', num_gpu_blocks: '1000' }), 1);

      controller.abort();
      for (const s of streams) s.body.destroy();
      await third;
      await waitFor(() => sim.engine.actualGauges().running === 0 && sim.engine.actualGauges().waiting === 0);
      const afterAbort = await scrape(sim);
      assert.equal(metricValue(afterAbort, 'vllm:num_requests_running', model), 0);
      assert.equal(metricValue(afterAbort, 'vllm:kv_cache_usage_perc', model), 0);
    });
  });

  test('/metrics exposes every vLLM family with the expected labels and counters', async () => {
    await withSim({ model: 'org/Model "q"' }, async (sim) => {
      const body = { model: 'org/Model "q"', prompt: 'x'.repeat(200), max_tokens: 3 };
      await postJson(sim, '/v1/completions', body);
      await postJson(sim, '/v1/completions', body);
      const r = await get(sim, '/metrics');
      assert.match(String(r.headers['content-type']), /^text\/plain/);
      assert.equal(r.headers['x-inference-pod'], sim.name);
      const samples = parseMetrics(r.text);
      const model = { model_name: 'org/Model \\"q\\"' };
      for (const family of ['vllm:num_requests_waiting', 'vllm:num_requests_running', 'vllm:kv_cache_usage_perc',
        'vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:prefix_cache_queries_total',
        'vllm:prefix_cache_hits_total', 'vllm:time_to_first_token_seconds_count']) {
        assert.ok(r.text.includes(`# TYPE ${family.replace(/_count$/, '')} `), `TYPE line for ${family}`);
        metricValue(samples, family, model);
      }
      assert.equal(metricValue(samples, 'vllm:prompt_tokens_total', model), 100);
      assert.equal(metricValue(samples, 'vllm:generation_tokens_total', model), 6);
      assert.equal(metricValue(samples, 'vllm:prefix_cache_queries_total', model), 100);
      assert.equal(metricValue(samples, 'vllm:prefix_cache_hits_total', model), 48); // 50-token prompt: 3 full blocks may hit
      assert.equal(metricValue(samples, 'vllm:request_success_total', { ...model, finish_reason: 'length' }), 2);
      assert.equal(metricValue(samples, 'vllm:time_to_first_token_seconds_count', model), 2);
      assert.equal(metricValue(samples, 'vllm:time_to_first_token_seconds_bucket', { ...model, le: '+Inf' }), 2);
      const lora = metricValue(samples, 'vllm:lora_requests_info', { running_lora_adapters: '', waiting_lora_adapters: '', max_lora: '0' });
      assert.ok(Math.abs(lora - Date.now() / 1000) < 60, 'lora info value is the start time in seconds');
      // Histogram buckets are cumulative.
      const buckets = samples.filter((s) => s.name === 'vllm:time_to_first_token_seconds_bucket').map((s) => s.value);
      assert.deepEqual(buckets, [...buckets].sort((a, b) => a - b));
    });
  });

  test('a client that disconnects frees its slot', async () => {
    await withSim({ maxNumSeqs: 1, itlMs: 20 }, async (sim) => {
      const controller = new AbortController();
      const res = await openStream(sim, { max_tokens: 200 }, controller.signal);
      const iterator = res.body[Symbol.asyncIterator]();
      await iterator.next(); // first token arrived: the request is running
      assert.equal(sim.engine.actualGauges().running, 1);
      controller.abort();
      await waitFor(() => sim.engine.actualGauges().running === 0);
      assert.equal(sim.engine.counters.requestSuccess.abort, 1);

      // A non-streaming request aborted while queued leaves the queue too.
      const holder = new AbortController();
      const held = openStream(sim, { max_tokens: 200 }, holder.signal);
      await waitFor(() => sim.engine.actualGauges().running === 1);
      const queued = new AbortController();
      const pending = request(sim.url + '/v1/completions', {
        method: 'POST', dispatcher: agent, signal: queued.signal,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sim-model', prompt: 'x' }),
      }).catch(() => undefined);
      await waitFor(() => sim.engine.actualGauges().waiting === 1);
      queued.abort();
      await pending;
      await waitFor(() => sim.engine.actualGauges().waiting === 0);
      holder.abort();
      await held.catch(() => undefined);
      await waitFor(() => sim.engine.actualGauges().running === 0);
    });
  });

  test('/admin/config changes settings and pins metric values', async () => {
    await withSim({}, async (sim) => {
      const r = await postJson(sim, '/admin/config', { itlMs: 7, maxNumSeqs: 3, failureRate: 0, pin: { waiting: 5, kvUsage: 0.25 } });
      assert.equal(r.status, 200);
      assert.equal(r.json.itlMs, 7);
      assert.equal(r.json.maxNumSeqs, 3);
      assert.deepEqual(r.json.pin, { waiting: 5, running: null, kvUsage: 0.25 });
      assert.equal(sim.engine.settings.itlMs, 7);

      let samples = await scrape(sim);
      assert.equal(metricValue(samples, 'vllm:num_requests_waiting'), 5);
      assert.equal(metricValue(samples, 'vllm:kv_cache_usage_perc'), 0.25);
      assert.equal(metricValue(samples, 'vllm:num_requests_running'), 0);

      await postJson(sim, '/admin/config', { pin: { waiting: null } });
      samples = await scrape(sim);
      assert.equal(metricValue(samples, 'vllm:num_requests_waiting'), 0);
      assert.equal(metricValue(samples, 'vllm:kv_cache_usage_perc'), 0.25);

      const current = JSON.parse((await get(sim, '/admin/config')).text) as Json;
      assert.equal(current.itlMs, 7);
    });
  });

  test('maxModelLen set through /admin/config takes effect', async () => {
    await withSim({}, async (sim) => {
      assert.equal(JSON.parse((await get(sim, '/admin/config')).text).maxModelLen, 131_072);
      const r = await postJson(sim, '/admin/config', { maxModelLen: 10 });
      assert.equal(r.status, 200);
      assert.equal(r.json.maxModelLen, 10);
      const refused = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'x'.repeat(40) });
      assert.equal(refused.status, 400);
      assert.match(String((refused.json.error as Json).message), /maximum context length is 10 tokens/);
      await postJson(sim, '/admin/config', { maxModelLen: 0 });
      assert.equal((await post(sim, '/v1/completions', { model: 'sim-model', prompt: 'x'.repeat(40) })).status, 200);
    });
  });

  test('/admin/config rejects bad bodies without applying any part', async () => {
    await withSim({ itlMs: 1 }, async (sim) => {
      for (const body of ['nope', { itlMs: -1 }, { bogus: 1 }, { maxNumSeqs: 1.5 }, { failureRate: 2 },
        { pin: { kvUsage: 2 } }, { pin: { other: 1 } }, { itlMs: 9, pin: 3 }, { maxModelLen: -1 }, { itlMs: 9, maxModelLen: 2.5 }]) {
        const r = await post(sim, '/admin/config', body);
        assert.equal(r.status, 400, JSON.stringify(body));
        assert.equal((JSON.parse(r.text) as { error: { code: number } }).error.code, 400);
      }
      assert.equal(sim.engine.settings.itlMs, 1);
    });
  });

  test('failureRate set through /admin/config takes effect', async () => {
    await withSim({ random: seededRandom(7) }, async (sim) => {
      await postJson(sim, '/admin/config', { failureRate: 1 });
      const r = await post(sim, '/v1/completions', { model: 'sim-model', prompt: 'x' });
      assert.equal(r.status, 500);
    });
  });
});

describe('sim server: as vLLM and safe with what an operator gives it', () => {
  test("a stream's status line and headers go out once it is accepted, before its queue wait and prefill", async () => {
    await withSim({ ttftOverheadMs: 10_000 }, async (sim) => {
      const ac = new AbortController();
      const headers = openStream(sim, {}, ac.signal);
      headers.then((r) => r.body.on('error', () => undefined)).catch(() => undefined);
      try {
        const res = await Promise.race([headers, sleep(3000, 'late', { ref: false })]);
        assert.notEqual(res, 'late', 'headers before the first token, 10 s away');
        assert.equal((res as Awaited<typeof headers>).statusCode, 200);
      } finally {
        ac.abort();
      }
    });
  });

  test('a name with a quote still gives valid JSON in every streamed chunk (the id carries it)', async () => {
    await withSim({ name: 'pod-"a"' }, async (sim) => {
      const r = await openStream(sim, { max_tokens: 3, stream_options: { include_usage: true } });
      const events = (await r.body.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
      assert.equal(events.length, 5); // role chunk, 3 tokens, usage
      for (const e of events) assert.match((JSON.parse(e.slice(6)) as { id: string }).id, /pod-"a"/);
    });
  });

  test('a name that cannot be sent as a header is refused at start (it crashed the process at its first request)', async () => {
    await assert.rejects(startSimulator({ name: 'pod-日本' }), /cannot be sent as the x-inference-pod header/);
  });

  test('a waiting delay past Node\'s longest timer waits (setTimeout would fire after 1 ms)', async () => {
    await withSim({ ttftOverheadMs: 3e9 }, async (sim) => {
      const ac = new AbortController();
      try {
        const r = await openStream(sim, {}, ac.signal);
        let first = false;
        r.body.on('data', () => (first = true)).on('error', () => undefined);
        await sleep(100);
        assert.equal(first, false, 'no token within 100 ms of a 3e9 ms TTFT');
      } finally {
        ac.abort();
      }
    });
  });
});

interface ChunkChoice {
  index: number;
  delta?: { role?: string; content?: string };
  text?: string;
  logprobs: null;
  finish_reason: string | null;
}
interface Chunk {
  id: string;
  object: string;
  choices: ChunkChoice[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number; prompt_tokens_details: { cached_tokens: number } };
}

/** The JSON chunks of a whole SSE answer, after checking it ends with one `[DONE]`. */
function sseChunks(text: string): Chunk[] {
  assert.ok(text.endsWith('data: [DONE]\n\n'), 'ends with [DONE]');
  const events = text.split('\n\n').filter((e) => e !== '');
  assert.ok(events.every((e) => e.startsWith('data: ')));
  assert.equal(events.filter((e) => e === 'data: [DONE]').length, 1);
  return events.slice(0, -1).map((e) => JSON.parse(e.slice(6)) as Chunk);
}

async function postStream(sim: RunningSimulator, path: string, body: Json): Promise<string> {
  const res = await request(sim.url + path, {
    method: 'POST', dispatcher: agent, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-model', stream: true, ...body }),
  });
  assert.equal(res.statusCode, 200);
  return res.body.text();
}

type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number; prompt_tokens_details: { cached_tokens: number } };

describe('sim server: n > 1, prompt batches, token-id prompts (as vLLM)', () => {
  const chatBody = (extra: Json = {}) => ({ model: 'sim-model', messages: [{ role: 'user', content: 'Tell me a story' }], ...extra });

  test('n = 2 chat, not streamed: two choices indexed 0 and 1, completion tokens summed, the prompt counted once', async () => {
    await withSim({}, async (sim) => {
      const one = await postJson(sim, '/v1/chat/completions', chatBody({ max_tokens: 4 }));
      const r = await postJson(sim, '/v1/chat/completions', chatBody({ max_tokens: 4, n: 2 }));
      assert.equal(r.status, 200, r.text);
      const body = r.json as { choices: { index: number; message: { role: string; content: string }; finish_reason: string }[]; usage: Usage };
      assert.deepEqual(body.choices.map((c) => c.index), [0, 1]);
      assert.ok(body.choices.every((c) => c.message.role === 'assistant' && c.message.content.split(' ').length === 4 && c.finish_reason === 'length'));
      const single = one.json as { choices: { message: { content: string } }[]; usage: Usage };
      assert.equal(body.choices[0]!.message.content, single.choices[0]!.message.content, 'choice 0 is what n = 1 answers');
      assert.notEqual(body.choices[1]!.message.content, body.choices[0]!.message.content, 'each child generates its own tokens');
      assert.equal(body.usage.prompt_tokens, single.usage.prompt_tokens);
      assert.equal(body.usage.completion_tokens, 8);
      assert.equal(body.usage.total_tokens, single.usage.prompt_tokens + 8);
      assert.equal(sim.engine.counters.requestSuccess.length, 3, 'two engine requests for n = 2');
    });
  });

  test('n = 3 completions, not streamed; the 2nd and 3rd child hit the 1st one\'s prompt blocks', async () => {
    await withSim({}, async (sim) => {
      const prompt = 'z'.repeat(4 * 100); // 100 tokens: 6 full blocks may hit
      const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt, max_tokens: 2, n: 3 });
      assert.equal(r.status, 200, r.text);
      const body = r.json as { choices: { index: number; text: string; finish_reason: string }[]; usage: Usage };
      assert.deepEqual(body.choices.map((c) => c.index), [0, 1, 2]);
      assert.deepEqual(body.usage, { prompt_tokens: 100, completion_tokens: 6, total_tokens: 106, prompt_tokens_details: { cached_tokens: 0 } });
      const samples = await scrape(sim);
      // vLLM counts the prompt per child in its metrics (n × prompt), while usage counts it once.
      assert.equal(metricValue(samples, 'vllm:prompt_tokens_total'), 300);
      assert.equal(metricValue(samples, 'vllm:prefix_cache_queries_total'), 300);
      assert.equal(metricValue(samples, 'vllm:prefix_cache_hits_total'), 2 * 96);
      assert.equal(metricValue(samples, 'vllm:generation_tokens_total'), 6);
    });
  });

  test('n = 2 chat streamed (raw SSE): a role-only chunk per choice, interleaved token chunks with their index, a finish per choice, then usage once and [DONE]', async () => {
    await withSim({ itlMs: 5 }, async (sim) => {
      const chunks = sseChunks(await postStream(sim, '/v1/chat/completions', chatBody({ max_tokens: 5, n: 2, stream_options: { include_usage: true } })));
      const ids = new Set(chunks.map((c) => c.id));
      assert.equal(ids.size, 1, 'one id for the whole answer');
      const roles = chunks.filter((c) => c.choices[0]?.delta?.role !== undefined);
      assert.deepEqual(roles.map((c) => c.choices), [0, 1].map((index) => [{ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]));
      for (const index of [0, 1]) {
        const mine = chunks.filter((c) => c.choices.length === 1 && c.choices[0]!.index === index);
        assert.equal(mine.length, 6, `choice ${index}: role chunk + 5 token chunks`);
        assert.deepEqual(mine[0]!.choices[0]!.delta, { role: 'assistant', content: '' }, 'the role chunk comes first');
        assert.ok(mine.slice(1).every((c) => Object.keys(c.choices[0]!.delta!).join() === 'content'));
        assert.deepEqual(mine.map((c) => c.choices[0]!.finish_reason), [null, null, null, null, null, 'length']);
      }
      // Interleaved as generated: choice 1 has tokens before choice 0's last one.
      const tokenOrder = chunks.filter((c) => c.choices[0]?.delta?.role === undefined && c.choices.length === 1).map((c) => c.choices[0]!.index);
      assert.ok(tokenOrder.indexOf(1) < tokenOrder.lastIndexOf(0), `interleaved: ${tokenOrder.join(',')}`);
      const last = chunks.at(-1)!;
      assert.deepEqual(last.choices, []);
      assert.equal(chunks.filter((c) => c.usage !== undefined).length, 1, 'usage once, at the end');
      assert.equal(last.usage!.completion_tokens, 10);
      assert.equal(last.usage!.prompt_tokens, Math.ceil(JSON.stringify([{ role: 'user', content: 'Tell me a story' }]).length / 4));
    });
  });

  test('n = 2 chat streamed through the OpenAI SDK: both choices, each with its finish reason, usage summed', async () => {
    await withSim({}, async (sim) => {
      const client = new OpenAI({ baseURL: sim.url + '/v1', apiKey: 'none', maxRetries: 0 });
      const whole = await client.chat.completions.create({ model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, n: 2 });
      const stream = await client.chat.completions.create({
        model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, n: 2, stream: true,
        stream_options: { include_usage: true },
      });
      const content = ['', ''];
      const roles: string[][] = [[], []];
      const finish: (string | null)[] = [null, null];
      let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
      for await (const chunk of stream) {
        for (const c of chunk.choices) {
          content[c.index] += c.delta.content ?? '';
          if (c.delta.role) roles[c.index]!.push(c.delta.role);
          if (c.finish_reason) finish[c.index] = c.finish_reason;
        }
        if (chunk.usage) usage = chunk.usage;
      }
      assert.deepEqual(content, whole.choices.map((c) => c.message.content));
      assert.deepEqual(roles, [['assistant'], ['assistant']]);
      assert.deepEqual(finish, ['length', 'length']);
      assert.equal(usage?.completion_tokens, 6);
      assert.equal(usage?.prompt_tokens, whole.usage?.prompt_tokens);
    });
  });

  test('n counts per child against max-num-seqs: one child waits, all answer; too many for the queue → 429 and nothing enqueued; a disconnect frees every child', async () => {
    await withSim({ maxNumSeqs: 2, maxWaiting: 1, itlMs: 20 }, async (sim) => {
      const ac = new AbortController();
      const held = await openStream(sim, { max_tokens: 100, n: 3 }, ac.signal);
      held.body.on('error', () => undefined);
      await waitFor(() => sim.engine.actualGauges().running === 2 && sim.engine.actualGauges().waiting === 1);
      const refused = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'x', n: 2 });
      assert.equal(refused.status, 429);
      assert.deepEqual([sim.engine.actualGauges().running, sim.engine.actualGauges().waiting], [2, 1], 'no child of the refused request enqueued');
      ac.abort();
      await waitFor(() => sim.engine.actualGauges().running === 0 && sim.engine.actualGauges().waiting === 0);

      await postJson(sim, '/admin/config', { itlMs: 1, maxWaiting: 5 });
      const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'x', n: 3, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
      assert.equal((r.json.choices as unknown[]).length, 3);
    });
  });

  test('the context window applies per request, not × n', async () => {
    await withSim({ maxModelLen: 100 }, async (sim) => {
      const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'x'.repeat(396), max_tokens: 1, n: 4 });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.json.usage, { prompt_tokens: 99, completion_tokens: 4, total_tokens: 103, prompt_tokens_details: { cached_tokens: 0 } });
      const tooLong = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: 'x'.repeat(396), max_tokens: 2, n: 4 });
      assert.equal(tooLong.status, 400);
      assert.equal((tooLong.json.error as Json).param, 'max_tokens');
    });
  });

  test('a P/D prefill leg with n > 1 → 400 (one kv_transfer_params per answer)', async () => {
    await withSim({}, async (sim) => {
      const kv = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
      const r = await postJson(sim, '/v1/chat/completions', chatBody({ max_tokens: 1, n: 2, kv_transfer_params: kv }));
      assert.equal(r.status, 400);
      assert.equal((r.json.error as Json).param, 'n');
      assert.equal(sim.engine.counters.prefixCacheQueries, 0);
    });
  });

  test('a completions prompt batch (strings): one choice per prompt and n, index = promptIndex × n + i, prompt tokens summed', async () => {
    await withSim({}, async (sim) => {
      const a = 'a'.repeat(40); // 10 tokens
      const b = 'Once upon a time there was a canal'.padEnd(80, '.'); // 20 tokens
      const alone = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: b, max_tokens: 3 });
      const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: [a, b], max_tokens: 3, n: 2 });
      assert.equal(r.status, 200, r.text);
      const body = r.json as { choices: { index: number; text: string; finish_reason: string }[]; usage: Usage };
      assert.deepEqual(body.choices.map((c) => c.index), [0, 1, 2, 3]);
      assert.equal(body.choices[2]!.text, (alone.json.choices as { text: string }[])[0]!.text, 'index 2 = prompt 1, choice 0: its own prompt, not the joined text');
      // cached: prompt b's first block, warmed by the request alone (each prompt counted once, as its prompt tokens).
      assert.deepEqual(body.usage, { prompt_tokens: 30, completion_tokens: 12, total_tokens: 42, prompt_tokens_details: { cached_tokens: 16 } });
      assert.equal(metricValue(await scrape(sim), 'vllm:request_success_total', { finish_reason: 'length' }), 5, 'four engine requests for two prompts × n = 2 (+1 alone)');
    });
  });

  test('a prompt batch streamed: chunks carry index promptIndex × n + i, each choice finishes, usage sums the prompts, then [DONE]', async () => {
    await withSim({}, async (sim) => {
      const chunks = sseChunks(await postStream(sim, '/v1/completions', {
        prompt: ['a'.repeat(40), 'b'.repeat(80)], max_tokens: 2, n: 2, stream_options: { include_usage: true },
      }));
      for (const index of [0, 1, 2, 3]) {
        const mine = chunks.filter((c) => c.choices[0]?.index === index);
        assert.equal(mine.length, 2, `choice ${index}: two token chunks (completions have no role chunk)`);
        assert.ok(mine.every((c) => c.object === 'text_completion' && typeof c.choices[0]!.text === 'string'));
        assert.deepEqual(mine.map((c) => c.choices[0]!.finish_reason), [null, 'length']);
      }
      assert.equal(chunks.length, 9);
      assert.deepEqual(chunks[8]!.choices, []);
      assert.deepEqual(chunks[8]!.usage, { prompt_tokens: 30, completion_tokens: 8, total_tokens: 38, prompt_tokens_details: { cached_tokens: 0 } });
    });
  });

  test('a batch of token-id arrays is one prompt each; the context window is checked per prompt', async () => {
    await withSim({ maxModelLen: 100 }, async (sim) => {
      const ids = (len: number, from = 1) => Array.from({ length: len }, (_, i) => from + i);
      const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: [ids(3), ids(60), ids(90)], max_tokens: 10 });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual((r.json.choices as { index: number }[]).map((c) => c.index), [0, 1, 2]);
      assert.deepEqual(r.json.usage, { prompt_tokens: 153, completion_tokens: 30, total_tokens: 183, prompt_tokens_details: { cached_tokens: 0 } });
      const strings = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: ['x'.repeat(240), 'y'.repeat(240)], max_tokens: 10 });
      assert.equal(strings.status, 200, 'two 60-token prompts fit a 100-token window each (joined they would not)');
      const tooLong = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: [ids(3), ids(95)], max_tokens: 10 });
      assert.equal(tooLong.status, 400);
      assert.match(String((tooLong.json.error as Json).message), /your request has 95 input tokens/);
    });
  });

  test('a token-id prompt has one prompt token per id: usage, metrics and the context window', async () => {
    await withSim({ maxModelLen: 50 }, async (sim) => {
      const ids = Array.from({ length: 49 }, (_, i) => 1000 + i * 37);
      const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: ids, max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      assert.equal((r.json.choices as unknown[]).length, 1, 'one token-id array is ONE prompt');
      assert.equal((r.json.usage as Usage).prompt_tokens, 49);
      assert.equal(metricValue(await scrape(sim), 'vllm:prompt_tokens_total'), 49);
      const full = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: [...ids, 7] });
      assert.equal(full.status, 400);
      assert.match(String((full.json.error as Json).message), /maximum context length is 50 tokens\. However, your request has 50 input tokens/);
      const over = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt: ids, max_tokens: 2 });
      assert.equal(over.status, 400);
      assert.equal((over.json.error as Json).param, 'max_tokens');
    });
  });

  test('token-id prompts sharing leading ids share cached blocks (16 ids a block); different leading ids do not', async () => {
    await withSim({}, async (sim) => {
      const head = Array.from({ length: 64 }, (_, i) => 5000 + i);
      const cached = async (prompt: number[]) => {
        const r = await postJson(sim, '/v1/completions', { model: 'sim-model', prompt, max_tokens: 1 });
        assert.equal(r.status, 200, r.text);
        const usage = r.json.usage as Usage;
        return [usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens];
      };
      assert.deepEqual(await cached([...head, ...Array.from({ length: 64 }, (_, i) => 9000 + i)]), [128, 0]);
      assert.deepEqual(await cached([...head, ...Array.from({ length: 40 }, (_, i) => 7000 + i)]), [104, 64], 'the 4 shared blocks hit');
      assert.deepEqual(await cached([1, ...head.slice(1), 3, 4]), [66, 0], 'the first block differs: nothing hits');
      assert.equal(metricValue(await scrape(sim), 'vllm:prefix_cache_hits_total'), 64);
    });
  });
});
