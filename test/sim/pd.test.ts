/** Simulator P/D (SPEC §8): prefill requests, decode requests with a KV transfer, flags and admin. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'undici';
import { SimEngine, type FinishReason, type GenerationResult } from '../../src/sim/engine.js';
import { startSimulator } from '../../src/sim/server.js';
import { parseSimArgs } from '../../src/sim/cli.js';
import { VirtualTime } from './virtual-time.js';

function engineWith(opts: ConstructorParameters<typeof SimEngine>[0] = {}) {
  const vt = new VirtualTime();
  return { vt, engine: new SimEngine({ clock: vt, timers: vt, ...opts }) };
}

describe('SimEngine P/D', () => {
  test('prefill request (remoteDecode): one token, finish remote_decode, normal prefill cost', () => {
    const { vt, engine } = engineWith({ ttftOverheadMs: 10, prefillMsPerToken: 1, itlMs: 5 });
    const results: GenerationResult[] = [];
    const start = vt.now();
    let doneAt = 0;
    const r = engine.submit({ promptText: 'x'.repeat(400), maxTokens: 50, remoteDecode: true }, {
      onFinish: (res) => {
        results.push(res);
        doneAt = vt.now();
      },
    });
    assert.ok(r.accepted);
    vt.runAll();
    assert.equal(results.length, 1);
    assert.equal(results[0]!.finishReason, 'remote_decode');
    assert.equal(results[0]!.completionTokens, 1);
    assert.equal(doneAt - start, 10 + 100, 'TTFT = overhead + 100 uncached tokens × 1 ms');
    assert.equal(engine.counters.requestSuccess.remote_decode, 1);
  });

  test('decode request (remotePrefill): transfer latency instead of prefill; reports the prompt as cached', () => {
    const { vt, engine } = engineWith({ ttftOverheadMs: 50, prefillMsPerToken: 1, itlMs: 5, kvTransferMs: 2, kvTransferMsPerToken: 0.05 });
    const tokens: { at: number; finish: FinishReason | null }[] = [];
    const results: GenerationResult[] = [];
    const start = vt.now();
    engine.submit({ promptText: 'y'.repeat(800), maxTokens: 3, remotePrefill: true }, {
      onToken: (_t, _i, finish) => tokens.push({ at: vt.now() - start, finish }),
      onFinish: (res) => results.push(res),
    });
    vt.runAll();
    assert.deepEqual(tokens.map((t) => t.at), [2 + 0.05 * 200, 2 + 10 + 5, 2 + 10 + 10]);
    assert.equal(tokens[2]!.finish, 'length');
    assert.equal(results[0]!.promptTokens, 200);
    assert.equal(results[0]!.cachedTokens, 200, 'like vLLM, transferred KV counts as cached');
    assert.equal(engine.counters.prefixCacheHits, 0, 'but it was not a local prefix-cache hit');
  });

  test('transfer settings validated and changeable at run time', () => {
    const { engine } = engineWith();
    assert.equal(engine.settings.kvTransferMs, 1);
    assert.equal(engine.settings.kvTransferMsPerToken, 0.01);
    engine.configure({ kvTransferMs: 7 });
    assert.equal(engine.settings.kvTransferMs, 7);
    assert.throws(() => engine.configure({ kvTransferMsPerToken: -1 }), /kvTransferMsPerToken/);
  });
});

describe('sim server P/D', () => {
  const post = async (url: string, body: unknown) => {
    const r = await request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const text = await r.body.text();
    return { status: r.statusCode, headers: r.headers, text, json: () => JSON.parse(text) as Record<string, any> };
  };

  test('prefill: one token, remote_decode, kv_transfer_params naming this sim; streaming prefill → 400; decode works', async () => {
    const sim = await startSimulator({ name: 'prefill-7', ttftOverheadMs: 1, prefillMsPerToken: 0, itlMs: 0, blockSizeTokens: 16 });
    try {
      const url = `${sim.url}/v1/chat/completions`;
      const messages = [{ role: 'user', content: 'z'.repeat(300) }];
      const kv = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
      const r = await post(url, { model: 'sim-model', messages, stream: false, max_tokens: 1, max_completion_tokens: 1, kv_transfer_params: kv });
      assert.equal(r.status, 200, r.text);
      const body = r.json();
      assert.equal(body.choices[0].finish_reason, 'remote_decode');
      assert.equal(body.usage.completion_tokens, 1);
      const out = body.kv_transfer_params;
      assert.equal(out.do_remote_prefill, true);
      assert.equal(out.do_remote_decode, false);
      assert.equal(out.remote_engine_id, 'prefill-7-engine');
      assert.equal(out.remote_host, '127.0.0.1');
      assert.equal(out.remote_port, sim.port);
      assert.equal(out.tp_size, 1);
      assert.equal(out.remote_block_ids.length, Math.ceil(body.usage.prompt_tokens / 16));
      assert.ok(out.remote_block_ids.every((id: unknown) => Number.isInteger(id)));

      const streamed = await post(url, { model: 'sim-model', messages, stream: true, kv_transfer_params: kv });
      assert.equal(streamed.status, 400);
      assert.match(streamed.json().error.message, /Prefill does not support streaming/);

      const bad = await post(url, { model: 'sim-model', messages, kv_transfer_params: 'yes' });
      assert.equal(bad.status, 400);
      assert.equal(bad.json().error.param, 'kv_transfer_params');

      // A decode request with the prefiller's params: a normal answer (no kv_transfer_params in it).
      const decode = await post(url, { model: 'sim-model', messages, max_tokens: 4, kv_transfer_params: out });
      assert.equal(decode.status, 200);
      assert.equal(decode.json().usage.completion_tokens, 4);
      assert.equal(decode.json().choices[0].finish_reason, 'length');
      assert.equal('kv_transfer_params' in decode.json(), false);

      // Completions API too.
      const c = await post(`${sim.url}/v1/completions`, { model: 'sim-model', prompt: 'hello', kv_transfer_params: kv });
      assert.equal(c.json().choices[0].finish_reason, 'remote_decode');
      assert.equal(c.json().kv_transfer_params.remote_port, sim.port);
    } finally {
      await sim.close();
    }
  });

  test('admin config and CLI flags for the transfer latency', async () => {
    assert.deepEqual(parseSimArgs(['--kv-transfer-ms', '3', '--kv-transfer-ms-per-token=0.5']), { kvTransferMs: 3, kvTransferMsPerToken: 0.5 });
    assert.throws(() => parseSimArgs(['--kv-transfer-ms', '-1']), /--kv-transfer-ms must be a number/);
    const sim = await startSimulator({ kvTransferMs: 4 });
    try {
      const r = await post(`${sim.url}/admin/config`, { kvTransferMs: 9, kvTransferMsPerToken: 0.2 });
      assert.equal(r.status, 200);
      assert.equal(r.json().kvTransferMs, 9);
      assert.equal(sim.engine.settings.kvTransferMsPerToken, 0.2);
    } finally {
      await sim.close();
    }
  });
});
