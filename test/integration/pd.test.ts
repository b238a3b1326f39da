/**
 * Prefill/decode disaggregation end to end (SPEC §7.3, §7.4): the gateway in front of recording fake
 * backends (exact bodies and headers each server saw) and of simulators (the real protocol).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import net from 'node:net';
import { request } from 'undici';
import OpenAI from 'openai';
import type { Gateway } from '../../src/app.js';
import { startSimulator } from '../../src/sim/server.js';
import type { Logger } from 'pino';
import type { DecisionTrace } from '../../src/scheduling/scheduler.js';
import { captureLogger, fleetConfig, gatewayFor, nothingInFlight, waitForMetrics } from '../helpers/fleet.js';
import { startFakeBackend, vllmPage, type Behaviour, type FakeBackend, type Received } from '../helpers/fake-backend.js';
import { until } from '../helpers/wait.js';

const MODEL = 'm';
/** ≈ 110 tokens: above the nonCachedTokens threshold (32) used below. */
const longPrompt = (tag: string) => `${tag}: ${'Describe the lock, the gates and the water levels. '.repeat(8)}`;

const KV_FROM_PREFILL = {
  do_remote_decode: false,
  do_remote_prefill: true,
  remote_block_ids: [4, 5, 6],
  remote_engine_id: 'engine-prefill',
  remote_host: '10.1.2.3',
  remote_port: 5601,
  tp_size: 1,
};
const PREFILL_CACHED = 12;
const DECODE_CACHED = 110;

/** A prefill answer as llm-d-inference-sim and Sluice's sim give it (vLLM says "length"; Sluice reads neither): one token, remote_decode, kv_transfer_params, 12 cached prompt tokens. */
const prefillOk: Behaviour = (_r, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(
    JSON.stringify({
      id: 'cmpl-p',
      object: 'chat.completion',
      model: MODEL,
      choices: [{ index: 0, message: { role: 'assistant', content: 'x' }, finish_reason: 'remote_decode' }],
      usage: { prompt_tokens: 110, completion_tokens: 1, total_tokens: 111, prompt_tokens_details: { cached_tokens: PREFILL_CACHED } },
      kv_transfer_params: KV_FROM_PREFILL,
    }),
  );
};

const usage = { prompt_tokens: 110, completion_tokens: 2, total_tokens: 112, prompt_tokens_details: { cached_tokens: DECODE_CACHED } };

/**
 * A decoder: JSON, or SSE when the body says stream — the usage event is written in two pieces with a
 * pause between them (split mid-JSON), as a network can deliver it. Reports every prompt token cached.
 */
const decodeOk: Behaviour = (r, res) => {
  const body = JSON.parse(r.body) as { stream?: boolean };
  if (body.stream !== true) {
    res.writeHead(200, { 'content-type': 'application/json', 'x-inference-pod': 'decoder' });
    res.end(
      JSON.stringify({
        id: 'cmpl-d',
        object: 'chat.completion',
        model: MODEL,
        choices: [{ index: 0, message: { role: 'assistant', content: 'hello there' }, finish_reason: 'stop' }],
        usage,
      }),
    );
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'x-inference-pod': 'decoder' });
  const chunk = (delta: object, finish: string | null) =>
    `data: ${JSON.stringify({ id: 'cmpl-d', object: 'chat.completion.chunk', model: MODEL, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
  res.write(chunk({ role: 'assistant', content: 'hello' }, null));
  res.write(chunk({ content: ' there' }, 'stop'));
  const usageEvent = `data: ${JSON.stringify({ id: 'cmpl-d', object: 'chat.completion.chunk', model: MODEL, choices: [], usage })}\n\n`;
  const cut = usageEvent.indexOf('cached_tokens') + 5;
  res.write(usageEvent.slice(0, cut));
  setTimeout(() => {
    res.write(usageEvent.slice(cut));
    res.end('data: [DONE]\n\n');
  }, 20);
};

const errorWith =
  (status: number): Behaviour =>
  (_r, res: ServerResponse) => {
    res.writeHead(status, { 'content-type': 'application/json', 'x-from': 'prefill' });
    res.end(JSON.stringify({ error: { message: `prefill says ${status}`, type: 'BadRequestError', param: 'messages', code: status } }));
  };

const hold: Behaviour = () => undefined;

interface PdFleet {
  gw: Gateway;
  prefill: FakeBackend[];
  decode: FakeBackend[];
  close(): Promise<void>;
}

interface PdOptions {
  connector?: 'sidecar' | 'nixlv2' | 'shared-storage';
  decider?: 'prefix-based-pd-decider' | 'always-disagg-pd-decider';
  prefill?: Behaviour;
  decode?: Behaviour;
  decodeCount?: number;
  extra?: string;
  logger?: Logger;
  /** llm-d's P/D session pattern: a session-affinity-scorer per profile, the prefill one with its own header and profileName. */
  sessions?: boolean;
}

/** One prefill and N decode fake backends, labelled, behind a gateway with the disagg handler. */
async function pdFleet(opts: PdOptions = {}): Promise<PdFleet> {
  const prefill = [await startFakeBackend(opts.prefill ?? prefillOk)];
  const decode = await Promise.all(Array.from({ length: opts.decodeCount ?? 1 }, () => startFakeBackend(opts.decode ?? decodeOk)));
  const extra = `plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: prefix-cache-scorer
  parameters: { autoTune: false }
- type: prefix-based-pd-decider
  parameters: { nonCachedTokens: 32 }
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders: { prefill: ${opts.decider ?? 'prefix-based-pd-decider'} }
    connector: ${opts.connector ?? 'nixlv2'}
- type: utilization-detector
  parameters: { queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 10s }
${
  opts.sessions
    ? `- name: session-affinity-decode
  type: session-affinity-scorer
  parameters: { headerName: x-session-token }
- name: session-affinity-prefill
  type: session-affinity-scorer
  parameters: { headerName: X-Session-Token-Prefill, profileName: prefill }
`
    : ''
}schedulingProfiles:
- name: decode
  plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer }, { pluginRef: prefix-cache-scorer, weight: 3 }${opts.sessions ? ', { pluginRef: session-affinity-decode, weight: 10 }' : ''} ]
- name: prefill
  plugins: [ { pluginRef: prefill-filter }, { pluginRef: queue-scorer }, { pluginRef: prefix-cache-scorer, weight: 3 }${opts.sessions ? ', { pluginRef: session-affinity-prefill, weight: 10 }' : ''} ]
${opts.extra ?? ''}`;
  const gw = await gatewayFor(
    fleetConfig(
      [
        ...prefill.map((b, i) => ({ name: `prefill-${i}`, port: b.port, labels: { 'llm-d.ai/role': 'prefill' } })),
        ...decode.map((b, i) => ({ name: `decode-${i}`, port: b.port, labels: { 'llm-d.ai/role': 'decode' } })),
      ],
      extra,
    ),
    { logger: opts.logger },
  );
  await waitForMetrics(gw);
  return {
    gw,
    prefill,
    decode,
    async close() {
      await gw.close();
      await Promise.all([...prefill, ...decode].map((b) => b.close()));
    },
  };
}

async function post(gw: Gateway, body: Record<string, unknown> | string, headers: Record<string, string> = {}, signal?: AbortSignal) {
  const r = await request(`${gw.apiUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
  const text = await r.body.text();
  return { status: r.statusCode, headers: r.headers, text };
}

const chatBody = (content: string, extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [{ role: 'user', content }],
  max_tokens: 20,
  temperature: 0.5,
  ...extra,
});

async function metricsText(gw: Gateway): Promise<string> {
  return (await request(`${gw.metricsUrl}/metrics`)).body.text();
}

function sample(text: string, name: string, labels: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && labels.split(',').every((kv) => l.includes(kv)));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}


const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const json = (r: Received) => JSON.parse(r.body) as Record<string, unknown>;
describe('P/D with the nixlv2 connector (the gateway runs both legs)', () => {
  test('long uncached prompt: prefill leg then decode leg with the exact bodies; cached_tokens from the prefill', async () => {
    const f = await pdFleet();
    try {
      const body = chatBody(longPrompt('json'), { stream_options: { include_usage: true }, min_tokens: 3 });
      const raw = JSON.stringify(body);
      const r = await post(f.gw, raw, { 'x-request-id': 'req-pd-1' });
      assert.equal(r.status, 200, r.text);
      assert.equal(f.prefill[0]!.received.length, 1);
      assert.equal(f.decode[0]!.received.length, 1);

      const p = f.prefill[0]!.received[0]!;
      assert.equal(p.url, '/v1/chat/completions');
      assert.deepEqual(json(p), {
        model: MODEL,
        messages: body.messages,
        max_tokens: 1,
        temperature: 0.5,
        max_completion_tokens: 1,
        kv_transfer_params: {
          do_remote_decode: true,
          do_remote_prefill: false,
          remote_engine_id: null,
          remote_block_ids: null,
          remote_host: null,
          remote_port: null,
        },
        stream: false,
      });
      assert.equal(p.headers['x-request-id'], 'req-pd-1');
      assert.equal(p.headers['content-type'], 'application/json');

      const d = f.decode[0]!.received[0]!;
      assert.equal(d.url, '/v1/chat/completions');
      assert.equal(d.body, raw.slice(0, -1) + `,"kv_transfer_params":${JSON.stringify(KV_FROM_PREFILL)}}`, 'client bytes + the prefiller\'s params');
      assert.deepEqual(json(d), { ...body, kv_transfer_params: KV_FROM_PREFILL });
      assert.equal(d.headers['x-request-id'], 'req-pd-1');
      assert.equal(d.headers['x-prefiller-host-port'], undefined, 'no sidecar header with nixlv2');

      const answer = JSON.parse(r.text);
      assert.equal(answer.choices[0].message.content, 'hello there');
      assert.deepEqual(answer.usage, { ...usage, prompt_tokens_details: { cached_tokens: PREFILL_CACHED } });
      assert.equal(Number(r.headers['content-length']), Buffer.byteLength(r.text));
      assert.equal(r.headers['x-request-id'], 'req-pd-1');
      assert.equal(r.headers['x-inference-pod'], 'decoder');
      await nothingInFlight(f.gw);
    } finally {
      await f.close();
    }
  });

  test('short prompt, or a long one the decode endpoint has cached: decode only, body untouched', async () => {
    const f = await pdFleet();
    try {
      const first = await post(f.gw, chatBody(longPrompt('cached')));
      assert.equal(first.status, 200);
      assert.equal(f.prefill[0]!.received.length, 1);
      const again = JSON.stringify(chatBody(longPrompt('cached')));
      assert.equal((await post(f.gw, again)).status, 200);
      const short = JSON.stringify(chatBody('hi'));
      const r = await post(f.gw, short);
      assert.equal(r.status, 200);
      assert.equal(f.prefill[0]!.received.length, 1, 'no more prefill legs');
      assert.deepEqual(f.decode[0]!.received.slice(1).map((x) => x.body), [again, short], 'byte for byte');
      assert.equal(JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens, DECODE_CACHED, 'decode-only answers are not rewritten');

      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="prefill-decode"'), 1);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="decode-only"'), 2);
      assert.equal(sample(m, 'llm_d_epp_request_total', `model_name="${MODEL}"`), 3, 'a P/D request is one request');
      assert.equal(sample(m, 'llm_d_epp_flow_control_requests_total', 'outcome="Dispatched"'), 3);
    } finally {
      await f.close();
    }
  });

  test('streamed: the prefill leg is not streamed, the decode leg streams to the client, usage rewritten across a split', async () => {
    const f = await pdFleet();
    try {
      const client = new OpenAI({ baseURL: `${f.gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
      const stream = await client.chat.completions.create({
        model: MODEL,
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 20,
        messages: [{ role: 'user', content: longPrompt('stream') }],
      });
      let text = '';
      let chunks = 0;
      let cached: number | undefined;
      for await (const c of stream) {
        chunks++;
        text += c.choices[0]?.delta?.content ?? '';
        if (c.usage) cached = c.usage.prompt_tokens_details?.cached_tokens;
      }
      assert.equal(text, 'hello there');
      assert.equal(chunks, 3);
      assert.equal(cached, PREFILL_CACHED);
      const p = json(f.prefill[0]!.received[0]!);
      assert.equal(p.stream, false);
      assert.equal('stream_options' in p, false);
      const d = json(f.decode[0]!.received[0]!);
      assert.equal(d.stream, true);
      assert.deepEqual(d.stream_options, { include_usage: true });
      assert.deepEqual(d.kv_transfer_params, KV_FROM_PREFILL);
    } finally {
      await f.close();
    }
  });

  test('a JSON decode answer over 1 MiB is relayed as it comes (not held whole to rewrite cached_tokens): a client that stops reading holds the model server back', async () => {
    const big = 'x'.repeat(48 << 20);
    let sent = 0;
    const f = await pdFleet({
      decode: (_r, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        const body = Buffer.from(JSON.stringify({ id: 'cmpl-d', choices: [{ index: 0, message: { role: 'assistant', content: big } }], usage: { prompt_tokens: 9, prompt_tokens_details: { cached_tokens: DECODE_CACHED } } }));
        const write = (): void => {
          while (sent < body.length) {
            const part = body.subarray(sent, sent + 65536);
            sent += part.length;
            if (!res.write(part)) return void res.once('drain', write);
          }
          res.end();
        };
        write();
      },
    });
    try {
      const socket = net.connect(f.gw.apiPort, '127.0.0.1');
      const raw = JSON.stringify(chatBody(longPrompt('big-json')));
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(raw)}\r\n\r\n${raw}`);
      await until(() => sent > 0);
      socket.pause(); // reads nothing: the gateway must stop reading the model server too
      await sleep(500);
      const stalledAt = sent;
      // What the sockets' kernel buffers take (about 7 MB on loopback here) and 1 MiB held; it was 16 MiB held, then the rest.
      assert.ok(stalledAt < 16 << 20, `the model server sent ${stalledAt} of ${big.length} bytes to a client reading nothing`);
      const chunks: Buffer[] = [];
      socket.on('data', (c: Buffer) => chunks.push(c));
      socket.resume();
      await until(() => Buffer.concat(chunks).includes('"cached_tokens":'));
      const text = Buffer.concat(chunks).toString();
      // Relayed as the decoder wrote it: its own count, not the prefill leg's.
      assert.match(text, new RegExp(`"cached_tokens":${DECODE_CACHED}\\}`));
      socket.destroy();
      await nothingInFlight(f.gw);
    } finally {
      await f.close();
    }
  });

  test('prefill 500 → served decode-only with the original body', async () => {
    const f = await pdFleet({ prefill: errorWith(500) });
    try {
      // Counted from 0 before the first fallback, so rate() sees it.
      assert.equal(sample(await metricsText(f.gw), 'sluice_pd_degraded_total', 'connector="nixlv2"'), 0);
      const raw = JSON.stringify(chatBody(longPrompt('p500')));
      const r = await post(f.gw, raw);
      assert.equal(r.status, 200);
      assert.equal(f.prefill[0]!.received.length, 1);
      assert.equal(f.decode[0]!.received[0]!.body, raw);
      assert.equal(JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens, DECODE_CACHED);
      // The failing prefill server shows in its own endpoint metrics, though the client got a 200.
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'sluice_endpoint_upstream_errors_total', 'endpoint_name="prefill-0",error="http_5xx"'), 1);
      assert.equal(sample(m, 'sluice_endpoint_first_byte_seconds_count', 'endpoint_name="prefill-0"'), 1);
      assert.equal(sample(m, 'sluice_endpoint_first_byte_seconds_count', 'endpoint_name="decode-0"'), 1);
      // Decided prefill-decode, served decode-only: both are said.
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="prefill-decode"'), 1);
      assert.equal(sample(m, 'sluice_pd_degraded_total', 'connector="nixlv2"'), 1);
    } finally {
      await f.close();
    }
  });

  test('prefill answering 200 with a body that is no JSON → served decode-only, counted as the prefill server\'s failure (it can be ejected)', async () => {
    const f = await pdFleet({ prefill: (_r, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('<html>proxy error</html>') });
    try {
      const raw = JSON.stringify(chatBody(longPrompt('notjson')));
      const r = await post(f.gw, raw);
      assert.equal(r.status, 200);
      assert.equal(f.decode[0]!.received[0]!.body, raw);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'sluice_endpoint_upstream_errors_total', 'endpoint_name="prefill-0",error="failed"'), 1);
      assert.equal(sample(m, 'sluice_pd_degraded_total', 'connector="nixlv2"'), 1);
      assert.equal(f.gw.pool.byName('prefill-0')!.failureStreak, 1);
    } finally {
      await f.close();
    }
  });

  test('a prefill tier failing one way, then another: the "P/D degraded" warning says each kind of reason once, not only the first', async () => {
    let n = 0;
    const log = captureLogger('warn');
    const f = await pdFleet({
      prefill: (_r, res) => (n++ % 2 === 0 ? res.writeHead(500).end('{"error":"boom"}') : res.writeHead(200, { 'content-type': 'application/json' }).end('not json')),
      logger: log.logger,
    });
    try {
      for (const i of [1, 2, 3, 4]) assert.equal((await post(f.gw, chatBody(longPrompt(`kinds-${i}`)))).status, 200);
      const reasons = log.lines().filter((l) => l.msg === 'P/D degraded').map((l) => String(l.reason));
      assert.deepEqual(reasons, ['prefill prefill-0 answered HTTP 500', 'prefill prefill-0 answered a body that is not a JSON object']);
    } finally {
      await f.close();
    }
  });

  test('prefill refusing connections → served decode-only', async () => {
    const f = await pdFleet();
    try {
      await f.prefill[0]!.close(); // its last metrics stay fresh (10 s), so it is still chosen
      const raw = JSON.stringify(chatBody(longPrompt('refused')));
      const r = await post(f.gw, raw);
      assert.equal(r.status, 200, r.text);
      assert.equal(f.decode[0]!.received[0]!.body, raw);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="prefill-decode"'), 1);
      assert.equal(sample(m, 'llm_d_epp_upstream_retries_total', 'endpoint_name="prefill-0"'), 0, 'a failed prefill leg is not a retry');
      assert.equal(sample(m, 'sluice_endpoint_upstream_errors_total', 'endpoint_name="prefill-0",error="connect"'), 1);
      assert.equal(f.gw.pool.byName('prefill-0')!.inFlight, 0);
      assert.equal(sample(m, 'sluice_pd_degraded_total', 'connector="nixlv2"'), 1);
    } finally {
      await f.close();
    }
  });

  test('prefill 400 → the client gets that 400; the decode endpoint gets nothing', async () => {
    const f = await pdFleet({ prefill: errorWith(400) });
    try {
      const r = await post(f.gw, chatBody(longPrompt('p400')), { 'x-request-id': 'req-400' });
      assert.equal(r.status, 400);
      assert.deepEqual(JSON.parse(r.text), { error: { message: 'prefill says 400', type: 'BadRequestError', param: 'messages', code: 400 } });
      assert.equal(r.headers['x-from'], 'prefill');
      assert.equal(r.headers['x-request-id'], 'req-400');
      assert.equal(f.decode[0]!.received.length, 0);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_request_error_total', 'error_code="400"'), 1);
      // Timed like the same 400 from a decode endpoint: the answer the client got came from a model server.
      assert.equal(sample(m, 'llm_d_epp_request_ttft_seconds_count', 'streaming="false"'), 1);
      assert.equal(sample(m, 'llm_d_epp_request_duration_seconds_count', ''), 1);
    } finally {
      await f.close();
    }
  });

  test('prefill 404 (it lacks the model: a server being replaced by another model\'s) → served decode-only, counted degraded', async () => {
    const f = await pdFleet({ prefill: errorWith(404) });
    try {
      const raw = JSON.stringify(chatBody(longPrompt('p404')));
      const r = await post(f.gw, raw);
      assert.equal(r.status, 200, r.text);
      assert.equal(f.decode[0]!.received[0]!.body, raw);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'sluice_pd_degraded_total', 'connector="nixlv2"'), 1);
      assert.equal(sample(m, 'llm_d_epp_request_error_total', 'error_code="404"'), undefined);
    } finally {
      await f.close();
    }
  });

  test('in-flight: the prefill endpoint counts only its leg, the decode endpoint the whole request', async () => {
    let releasePrefill: (() => void) | undefined;
    let releaseDecode: (() => void) | undefined;
    const f = await pdFleet({
      prefill: (r, res) => (releasePrefill = () => prefillOk(r, res)),
      decode: (r, res) => (releaseDecode = () => decodeOk(r, res)),
    });
    try {
      const body = chatBody(longPrompt('inflight'));
      const pending = post(f.gw, body);
      await until(() => releasePrefill !== undefined);
      const [p, d] = [f.gw.pool.byName('prefill-0')!, f.gw.pool.byName('decode-0')!];
      assert.deepEqual([p.inFlight, d.inFlight], [1, 1], 'during the prefill leg');
      // The prompt's tokens are the prefill endpoint's work (chat: the messages JSON, 4 characters a token).
      const promptTokens = Math.floor(JSON.stringify(body.messages).length / 4);
      assert.deepEqual([p.inFlightTokens, d.inFlightTokens], [promptTokens, 0], 'prompt tokens during the prefill leg');
      releasePrefill!();
      await until(() => releaseDecode !== undefined);
      assert.deepEqual([p.inFlight, d.inFlight], [0, 1], 'during the decode leg');
      assert.deepEqual([p.inFlightTokens, d.inFlightTokens], [0, 0], 'the decode endpoint receives the prompt computed');
      releaseDecode!();
      assert.equal((await pending).status, 200);
      await until(() => d.inFlight === 0);
    } finally {
      await f.close();
    }
  });

  test("when P/D falls back to decode-only the decode endpoint's prompt work is counted", async () => {
    let releaseDecode: (() => void) | undefined;
    const f = await pdFleet({ prefill: errorWith(503), decode: (r, res) => (releaseDecode = () => decodeOk(r, res)) });
    try {
      const body = chatBody(longPrompt('fallback'));
      const pending = post(f.gw, body);
      await until(() => releaseDecode !== undefined);
      const [p, d] = [f.gw.pool.byName('prefill-0')!, f.gw.pool.byName('decode-0')!];
      assert.deepEqual([p.inFlightTokens, d.inFlightTokens], [0, Math.floor(JSON.stringify(body.messages).length / 4)], 'the decoder recomputes the prompt');
      releaseDecode!();
      assert.equal((await pending).status, 200);
      await nothingInFlight(f.gw);
    } finally {
      await f.close();
    }
  });

  test('client disconnect during the prefill leg aborts it; the decode leg never starts', async () => {
    const f = await pdFleet({ prefill: hold });
    try {
      const ac = new AbortController();
      const pending = post(f.gw, chatBody(longPrompt('gone')), {}, ac.signal).catch((e: Error) => e);
      await until(() => f.prefill[0]!.received.length === 1 && f.prefill[0]!.active === 1);
      ac.abort();
      assert.ok((await pending) instanceof Error);
      await until(() => f.prefill[0]!.active === 0, 2000, 'prefill request aborted upstream');
      await nothingInFlight(f.gw);
      await sleep(100);
      assert.equal(f.decode[0]!.received.length, 0);
    } finally {
      await f.close();
    }
  });

  test('a fallback decode leg retried on another decode endpoint counts its prompt work there', async () => {
    let releaseDecode: (() => void) | undefined;
    const f = await pdFleet({ decodeCount: 2, prefill: errorWith(503), decode: (r, res) => (releaseDecode = () => decodeOk(r, res)) });
    try {
      f.decode[1]!.metrics = vllmPage(3); // decode-0 looks idle and is picked first, but refuses connections
      await until(() => f.gw.pool.byName('decode-1')!.metrics?.waiting === 3);
      await f.decode[0]!.close();
      const body = chatBody(longPrompt('fallback-retry'));
      const pending = post(f.gw, body);
      await until(() => releaseDecode !== undefined);
      assert.equal(f.prefill[0]!.received.length, 1, 'the prefill leg ran once');
      const [d0, d1] = [f.gw.pool.byName('decode-0')!, f.gw.pool.byName('decode-1')!];
      assert.deepEqual([d0.inFlightTokens, d1.inFlightTokens], [0, Math.floor(JSON.stringify(body.messages).length / 4)]);
      releaseDecode!();
      assert.equal((await pending).status, 200);
      await nothingInFlight(f.gw);
    } finally {
      await f.close();
    }
  });

  test('the only decode endpoint losing a connection at once gets its one more try in a P/D pool too (the prefill servers are no decode target)', async () => {
    let lose = true;
    const f = await pdFleet({
      decode: (r, res) => {
        if (!lose) return decodeOk(r, res);
        lose = false;
        res.socket!.destroy(); // as a keep-alive connection closed idle just as the request went out
      },
    });
    try {
      for (const content of ['short', longPrompt('lost-at-once')]) {
        lose = true;
        const r = await post(f.gw, chatBody(content));
        assert.equal(r.status, 200, r.text);
      }
      assert.equal(sample(await metricsText(f.gw), 'llm_d_epp_upstream_retries_total', 'endpoint_name="decode-0"'), 2);
      await nothingInFlight(f.gw);
    } finally {
      await f.close();
    }
  });

  test('a refused decode endpoint is retried on another with the same decode leg; the prefill runs once', async () => {
    const debug = captureLogger('debug');
    const f = await pdFleet({ decodeCount: 2, logger: debug.logger });
    try {
      // decode-0 looks idle (preferred by the queue scorer) but refuses connections.
      f.decode[1]!.metrics = vllmPage(3);
      await until(() => f.gw.pool.byName('decode-1')!.metrics?.waiting === 3);
      await f.decode[0]!.close();
      const r = await post(f.gw, chatBody(longPrompt('retry')));
      assert.equal(r.status, 200, r.text);
      assert.equal(f.prefill[0]!.received.length, 1);
      assert.equal(f.decode[1]!.received.length, 1);
      assert.deepEqual(json(f.decode[1]!.received[0]!).kv_transfer_params, KV_FROM_PREFILL);
      assert.equal(JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens, PREFILL_CACHED);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_upstream_retries_total', 'endpoint_name="decode-0"'), 1);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="prefill-decode"'), 1, 'counted once per request');
      // The debug log has both decisions: the decode profile's pick, then the prefill profile's, per attempt.
      const decisions = debug.lines().filter((l) => l.msg === 'scheduling decision') as { attempt: number; target: string; disaggregation: string; profiles: DecisionTrace }[];
      assert.deepEqual(
        decisions.map((d) => [d.attempt, d.target, d.disaggregation, d.profiles.map((p) => [p.profile, p.picked[0]])]),
        [
          [0, 'decode-0', 'prefill-decode', [['decode', 'decode-0'], ['prefill', 'prefill-0']]],
          [1, 'decode-1', 'prefill-decode', [['decode', 'decode-1'], ['prefill', 'prefill-0']]],
        ],
      );
      // ... and its end: two attempts, where the prefill ran and how long it took.
      const done = debug.lines().find((l) => l.msg === 'request done')!;
      assert.deepEqual([done.endpoint, done.attempts, done.prefillEndpoint], ['decode-1', 2, 'prefill-0']);
      assert.ok(typeof done.prefillMs === 'number' && done.prefillMs >= 0 && done.prefillMs <= Number(done.ttftMs), JSON.stringify(done));
    } finally {
      await f.close();
    }
  });

  test('a decode endpoint that lost the connection after taking the decode leg: the retry runs a pair of legs of its own, under an id of its own', async () => {
    const f = await pdFleet({ decodeCount: 2 });
    try {
      f.decode[1]!.metrics = vllmPage(3); // decode-0 is picked first
      await until(() => f.gw.pool.byName('decode-1')!.metrics?.waiting === 3);
      // decode-0 reads the leg (it may have pulled the KV blocks it names), then its connection drops.
      f.decode[0]!.behave = (_r, res) => res.socket!.destroy();
      const r = await post(f.gw, chatBody(longPrompt('lost')), { 'x-request-id': 'req-lost' });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual([f.decode[0]!.received.length, f.decode[1]!.received.length], [1, 1]);
      assert.equal(f.prefill[0]!.received.length, 2, 'a second prefill leg: the first one\'s KV blocks may be gone');
      // vLLM takes x-request-id as its request id and may still hold the first leg under it; the two
      // legs of a pair share theirs (the decoder's notice names the blocks to free), as llm-d's sidecar sends them.
      const ids = (b: { received: { headers: Record<string, unknown> }[] }) => b.received.map((x) => x.headers['x-request-id']);
      assert.deepEqual(ids(f.prefill[0]!), ['req-lost', 'req-lost-attempt2']);
      assert.deepEqual([...ids(f.decode[0]!), ...ids(f.decode[1]!)], ['req-lost', 'req-lost-attempt2']);
      assert.equal(r.headers['x-request-id'], 'req-lost', 'the client keeps its id');
      assert.deepEqual(json(f.decode[1]!.received[0]!).kv_transfer_params, KV_FROM_PREFILL);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="prefill-decode"'), 1, 'counted once per request');
      await nothingInFlight(f.gw);
    } finally {
      await f.close();
    }
  });

  test('a retry that decides differently counts the decision it carried out, once', async () => {
    const debug = captureLogger('debug');
    const f = await pdFleet({ decodeCount: 2, logger: debug.logger });
    try {
      f.decode[1]!.metrics = vllmPage(3);
      await until(() => f.gw.pool.byName('decode-1')!.metrics?.waiting === 3);
      // P/D onto the idle decode-0, which then caches the prompt.
      assert.equal((await post(f.gw, chatBody(longPrompt('differs')))).status, 200);
      assert.equal(f.prefill[0]!.received.length, 1);
      // The same prompt again: decode-0 (cached: decode-only) refuses, the retry on decode-1 (not cached) runs P/D.
      await f.decode[0]!.close();
      const r = await post(f.gw, chatBody(longPrompt('differs')));
      assert.equal(r.status, 200, r.text);
      assert.equal(f.prefill[0]!.received.length, 2, 'the retry ran a prefill leg');
      assert.deepEqual(json(f.decode[1]!.received[0]!).kv_transfer_params, KV_FROM_PREFILL);
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="prefill-decode"'), 2);
      assert.equal(sample(m, 'llm_d_epp_disagg_decision_total', 'decision_type="decode-only"') ?? 0, 0);
      const done = debug.lines().filter((l) => l.msg === 'request done')[1]!;
      assert.deepEqual([done.endpoint, done.attempts, done.prefillEndpoint], ['decode-1', 2, 'prefill-0']);
    } finally {
      await f.close();
    }
  });
});

describe('P/D with the sidecar connector', () => {
  test('the decode endpoint gets x-prefiller-host-port of the chosen prefill endpoint; a client value never passes', async () => {
    const f = await pdFleet({ connector: 'sidecar', decider: 'always-disagg-pd-decider' });
    try {
      const raw = JSON.stringify(chatBody('any prompt'));
      const r = await post(f.gw, raw, { 'x-prefiller-host-port': '6.6.6.6:666' });
      assert.equal(r.status, 200);
      assert.equal(f.prefill[0]!.received.length, 0, 'the sidecar runs the prefill, not the gateway');
      const d = f.decode[0]!.received[0]!;
      assert.equal(d.headers['x-prefiller-host-port'], `127.0.0.1:${f.prefill[0]!.port}`);
      assert.equal(d.body, raw);
      assert.equal(JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens, DECODE_CACHED, 'the sidecar rewrites usage, not Sluice');
    } finally {
      await f.close();
    }
  });

  test("the prefill endpoint counts the request in flight, with the prompt's tokens, until the decode answer's first byte", async () => {
    let releaseDecode: (() => void) | undefined;
    const f = await pdFleet({ connector: 'sidecar', decider: 'always-disagg-pd-decider', decode: (r, res) => (releaseDecode = () => decodeOk(r, res)) });
    try {
      const body = chatBody(longPrompt('sidecar'));
      const pending = post(f.gw, body);
      await until(() => releaseDecode !== undefined);
      const [p, d] = [f.gw.pool.byName('prefill-0')!, f.gw.pool.byName('decode-0')!];
      assert.deepEqual([p.inFlightTokens, d.inFlightTokens], [Math.floor(JSON.stringify(body.messages).length / 4), 0]);
      // active-request-scorer and concurrency-detector read the prefill pod as busy, as in llm-d.
      assert.deepEqual([p.inFlight, d.inFlight], [1, 1]);
      releaseDecode!();
      assert.equal((await pending).status, 200);
      await until(() => d.inFlight === 0);
      assert.deepEqual([p.inFlight, p.inFlightTokens, d.inFlightTokens], [0, 0, 0]);
    } finally {
      await f.close();
    }
  });

  test("llm-d's P/D session pattern: each profile's scorer names its own pick in its own header and routes it back", async () => {
    const f = await pdFleet({ connector: 'sidecar', decider: 'always-disagg-pd-decider', decodeCount: 2, sessions: true });
    try {
      const first = await post(f.gw, chatBody('turn 1'));
      assert.equal(first.status, 200);
      const home = f.decode.findIndex((d) => d.received.length === 1);
      const b64 = (s: string) => Buffer.from(s).toString('base64');
      assert.equal(first.headers['x-session-token'], b64(`decode-${home}`));
      assert.equal(first.headers['x-session-token-prefill'], b64('prefill-0'));
      // The session's next turns return to the same decode endpoint, whatever the queues say.
      for (let i = 2; i <= 4; i++) {
        const r = await post(f.gw, chatBody(`turn ${i}`), {
          'x-session-token': first.headers['x-session-token'] as string,
          'x-session-token-prefill': first.headers['x-session-token-prefill'] as string,
        });
        assert.equal(r.status, 200);
        assert.equal(r.headers['x-session-token'], b64(`decode-${home}`));
      }
      assert.equal(f.decode[home]!.received.length, 4);
      assert.equal(f.decode[1 - home]!.received.length, 0);
    } finally {
      await f.close();
    }
  });

  test('the prefill session header is not set on a decode-only answer (its profile did not run)', async () => {
    const f = await pdFleet({ connector: 'sidecar', sessions: true });
    try {
      const r = await post(f.gw, chatBody('short'));
      assert.equal(r.status, 200);
      assert.equal(r.headers['x-session-token'], Buffer.from('decode-0').toString('base64'));
      assert.equal(r.headers['x-session-token-prefill'], undefined);
    } finally {
      await f.close();
    }
  });

  test('decode-only: no header at all, even when the client sent one', async () => {
    const f = await pdFleet({ connector: 'sidecar' });
    try {
      const r = await post(f.gw, chatBody('short'), { 'x-prefiller-host-port': '6.6.6.6:666' });
      assert.equal(r.status, 200);
      assert.equal(f.decode[0]!.received[0]!.headers['x-prefiller-host-port'], undefined);
      assert.equal(sample(await metricsText(f.gw), 'llm_d_epp_disagg_decision_total', 'decision_type="decode-only"'), 1);
    } finally {
      await f.close();
    }
  });
});

describe('P/D with the shared-storage connector', () => {
  test('prefill leg with token limits 1, then the original body to decode', async () => {
    const f = await pdFleet({ connector: 'shared-storage' });
    try {
      const body = chatBody(longPrompt('shared'), { max_completion_tokens: 30 });
      const raw = JSON.stringify(body);
      const r = await post(f.gw, raw);
      assert.equal(r.status, 200);
      assert.deepEqual(json(f.prefill[0]!.received[0]!), { ...body, max_tokens: 1, max_completion_tokens: 1 });
      assert.equal(f.decode[0]!.received[0]!.body, raw);
      assert.equal(JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens, DECODE_CACHED);
    } finally {
      await f.close();
    }
  });
});

describe('P/D and flow control', () => {
  test('a prefill surge holds P/D requests even while decode is idle; they run both legs once it clears', async () => {
    const f = await pdFleet({ decider: 'always-disagg-pd-decider' });
    try {
      f.prefill[0]!.metrics = vllmPage(10); // 10 waiting / threshold 5 → prefill stage at 2.0
      await until(() => f.gw.pool.byName('prefill-0')!.metrics?.waiting === 10);
      const body = chatBody('held');
      const held = post(f.gw, body);
      await until(async () => (sample(await metricsText(f.gw), 'llm_d_epp_flow_control_queue_size', 'fairness_id="default-flow"') ?? 0) === 1, 3000, 'request queued');
      const m = await metricsText(f.gw);
      assert.equal(sample(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="prefill"'), 2);
      assert.ok(sample(m, 'llm_d_epp_flow_control_pool_saturation', 'stage="decode"')! < 1, 'decode idle');
      await sleep(50);
      assert.equal(f.prefill[0]!.received.length + f.decode[0]!.received.length, 0, 'held');
      f.prefill[0]!.metrics = vllmPage(0);
      const r = await held;
      assert.equal(r.status, 200);
      assert.equal(f.prefill[0]!.received.length, 1);
      assert.equal(f.decode[0]!.received.length, 1);
      // It waited without its parsed body (see Queued.compact): both legs are built from the whole one.
      const p = json(f.prefill[0]!.received[0]!);
      assert.deepEqual([p.model, p.messages, p.max_tokens, p.temperature], [MODEL, body.messages, 1, 0.5]);
      assert.deepEqual(json(f.decode[0]!.received[0]!), { ...body, kv_transfer_params: KV_FROM_PREFILL });
    } finally {
      await f.close();
    }
  });

  test('/debug/pool shows every endpoint\'s role and stage, and per-stage saturation', async () => {
    const f = await pdFleet();
    try {
      const pool = (await (await request(`${f.gw.metricsUrl}/debug/pool`)).body.json()) as {
        endpoints: { name: string; role: string; stage: string; inFlight: number }[];
        saturation: Record<string, number | null>;
      };
      assert.deepEqual(
        pool.endpoints.map((e) => [e.name, e.role, e.stage, e.inFlight]),
        [
          ['prefill-0', 'prefill', 'prefill', 0],
          ['decode-0', 'decode', 'decode', 0],
        ],
      );
      assert.equal(typeof pool.saturation.prefill, 'number');
      assert.equal(typeof pool.saturation.decode, 'number');
      assert.equal(pool.saturation.interleaved, null);
    } finally {
      await f.close();
    }
  });
});

describe('P/D on simulators (nixlv2)', () => {
  test('a long prompt is prefilled on the prefill sim and streamed from the decode sim; a repeat is decode-only', async () => {
    const sims = await Promise.all(
      ['prefill-0', 'decode-0'].map((name) => startSimulator({ name, ttftOverheadMs: 1, itlMs: 1, prefillMsPerToken: 0, kvTransferMs: 1 })),
    );
    const extra = `plugins:
- type: prefill-filter
- type: decode-filter
- type: prefix-cache-scorer
- type: prefix-based-pd-decider
  parameters: { nonCachedTokens: 32 }
- type: disagg-profile-handler
  parameters: { deciders: { prefill: prefix-based-pd-decider }, connector: nixlv2 }
schedulingProfiles:
- name: decode
  plugins: [ { pluginRef: decode-filter }, { pluginRef: prefix-cache-scorer } ]
- name: prefill
  plugins: [ { pluginRef: prefill-filter }, { pluginRef: prefix-cache-scorer } ]
`;
    const gw = await gatewayFor(
      fleetConfig(
        sims.map((s) => ({ name: s.name, port: s.port, labels: { 'llm-d.ai/role': s.name.split('-')[0]! } })),
        extra,
      ),
    );
    try {
      await waitForMetrics(gw);
      const [prefill, decode] = sims as [(typeof sims)[0], (typeof sims)[0]];
      const client = new OpenAI({ baseURL: `${gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
      const ask = async () => {
        const stream = await client.chat.completions.create({
          model: 'sim-model',
          stream: true,
          stream_options: { include_usage: true },
          max_tokens: 5,
          messages: [{ role: 'user', content: longPrompt('sim') }],
        });
        let tokens = 0;
        let u;
        for await (const c of stream) {
          if (c.choices[0]?.delta?.content) tokens++;
          if (c.usage) u = c.usage;
        }
        return { tokens, usage: u };
      };
      const first = await ask();
      assert.equal(first.tokens, 5);
      assert.equal(prefill.engine.counters.requestSuccess.remote_decode, 1, 'one prefill leg');
      assert.equal(decode.engine.counters.requestSuccess.length, 1);
      assert.equal(first.usage?.prompt_tokens_details?.cached_tokens, 0, "the prefill leg's count, not the decoder's");
      const second = await ask();
      assert.equal(second.tokens, 5);
      assert.equal(prefill.engine.counters.requestSuccess.remote_decode, 1, 'cached on the decode sim now: decode-only');
      assert.ok((second.usage?.prompt_tokens_details?.cached_tokens ?? 0) > 0, 'a real local prefix hit');
    } finally {
      await gw.close();
      await Promise.all(sims.map((s) => s.close()));
    }
  });
});
