/** Connector rules as pure functions (SPEC §7.4): bodies, prefill outcomes, cached_tokens rewriting. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../src/datalayer/endpoint.js';
import { sidecarConnector, sidecarHeaders } from '../../src/proxy/connectors/sidecar.js';
import {
  nixlDecodeBody,
  nixlPrefillBody,
  nixlv2Connector,
  PREFILL_KV_TRANSFER_PARAMS,
  readPrefillAnswer,
} from '../../src/proxy/connectors/nixlv2.js';
import { sharedStorageConnector, sharedStoragePrefillBody } from '../../src/proxy/connectors/shared-storage.js';
import { rewriteJsonCachedTokens, setCachedTokens, SseCachedTokensRewriter } from '../../src/proxy/connectors/cached-tokens.js';
import { connectorFor } from '../../src/proxy/connectors/index.js';
import type { Connector, PdInput, PdStep, PrefillLegResult } from '../../src/proxy/connectors/types.js';

const prefillEp = new Endpoint({ name: 'prefill-0', address: '10.0.0.7', port: 8200, labels: {} });

function input(body: Record<string, unknown>, raw: Buffer = Buffer.from(JSON.stringify(body))): PdInput {
  return { raw, body, api: 'chat', prefill: prefillEp };
}

const CHAT = {
  model: 'm',
  messages: [{ role: 'user', content: 'hello' }],
  stream: true,
  stream_options: { include_usage: true },
  max_tokens: 50,
  temperature: 0.2,
};

const KV_FROM_PREFILL = {
  do_remote_decode: false,
  do_remote_prefill: true,
  remote_block_ids: [1, 2, 3],
  remote_engine_id: 'engine-p0',
  remote_host: '10.0.0.7',
  remote_port: 5600,
  tp_size: 1,
};

const prefillAnswer = (extra: Record<string, unknown> = {}) =>
  Buffer.from(
    JSON.stringify({
      id: 'x',
      object: 'chat.completion',
      choices: [{ index: 0, message: { role: 'assistant', content: 'a' }, finish_reason: 'remote_decode' }],
      usage: { prompt_tokens: 100, completion_tokens: 1, total_tokens: 101, prompt_tokens_details: { cached_tokens: 32 } },
      kv_transfer_params: KV_FROM_PREFILL,
      ...extra,
    }),
  );

/** Runs a connector against a scripted prefill leg; records the bodies it sent. */
async function carry(connector: Connector, body: Record<string, unknown>, leg: PrefillLegResult, raw?: Buffer) {
  const sent: Buffer[] = [];
  const step: PdStep = await connector.carryOut(input(body, raw), async (b) => {
    sent.push(b);
    return leg;
  });
  return { step, sent: sent.map((b) => JSON.parse(b.toString()) as Record<string, unknown>) };
}

const answer = (status: number, body: Buffer | string = prefillAnswer()): PrefillLegResult => ({
  kind: 'answer',
  status,
  headers: { 'content-type': 'application/json' },
  body: Buffer.isBuffer(body) ? body : Buffer.from(body),
});

describe('sidecar connector', () => {
  test('x-prefiller-host-port is host:port, IPv6 bracketed; the body is untouched', async () => {
    assert.deepEqual(sidecarHeaders(prefillEp), { 'x-prefiller-host-port': '10.0.0.7:8200' });
    const v6 = new Endpoint({ name: 'p6', address: 'fd00::7', port: 8000, labels: {} });
    assert.deepEqual(sidecarHeaders(v6), { 'x-prefiller-host-port': '[fd00::7]:8000' });
    const raw = Buffer.from(JSON.stringify(CHAT));
    const step = sidecarConnector.carryOut(input(CHAT, raw), () => assert.fail('the sidecar runs no leg'));
    assert.ok(!(step instanceof Promise), 'no extra turn of the event loop');
    assert.equal(step.kind, 'decode');
    if (step.kind === 'decode') {
      assert.equal(step.leg.body, raw);
      assert.deepEqual(step.leg.headers, { 'x-prefiller-host-port': '10.0.0.7:8200' });
      assert.equal(step.leg.cachedTokens, undefined);
    }
    assert.equal(connectorFor('sidecar'), sidecarConnector);
    assert.equal(connectorFor('nixlv2'), nixlv2Connector);
    assert.equal(connectorFor('shared-storage'), sharedStorageConnector);
  });
});

describe('nixlv2 bodies', () => {
  test('prefill leg: original + kv_transfer_params, stream false, no stream_options, both token limits 1', () => {
    const body = JSON.parse(nixlPrefillBody(CHAT).toString());
    assert.deepEqual(body, {
      model: 'm',
      messages: [{ role: 'user', content: 'hello' }],
      stream: false,
      max_tokens: 1,
      temperature: 0.2,
      max_completion_tokens: 1,
      kv_transfer_params: {
        do_remote_decode: true,
        do_remote_prefill: false,
        remote_engine_id: null,
        remote_block_ids: null,
        remote_host: null,
        remote_port: null,
      },
    });
    // The client's own kv_transfer_params never reach the prefill leg; min_tokens would exceed the limit.
    const withOwn = JSON.parse(nixlPrefillBody({ ...CHAT, kv_transfer_params: { x: 1 }, min_tokens: 5, min_completion_tokens: 5 }).toString());
    assert.deepEqual(withOwn.kv_transfer_params, PREFILL_KV_TRANSFER_PARAMS);
    assert.equal('min_tokens' in withOwn, false);
    assert.equal('min_completion_tokens' in withOwn, false);
    assert.deepEqual(CHAT.stream_options, { include_usage: true }, 'the client body object is not modified');
  });

  test('decode leg: the original bytes plus exactly the prefiller\'s kv_transfer_params', () => {
    const raw = Buffer.from(JSON.stringify(CHAT, null, 2) + '\n');
    const kv = JSON.stringify(KV_FROM_PREFILL);
    const out = nixlDecodeBody(raw, CHAT, kv);
    const text = out.toString();
    const end = raw.toString().trimEnd().length - 1; // index of the final "}"
    assert.ok(text.startsWith(raw.toString().slice(0, end)), 'client bytes kept as they were');
    assert.deepEqual(JSON.parse(text), { ...CHAT, kv_transfer_params: KV_FROM_PREFILL });
    // Absent in the prefill answer → null; a client kv_transfer_params is replaced, not duplicated.
    assert.equal(JSON.parse(nixlDecodeBody(raw, CHAT, 'null').toString()).kv_transfer_params, null);
    const own = { ...CHAT, kv_transfer_params: { mine: true } };
    const replaced = nixlDecodeBody(Buffer.from(JSON.stringify(own)), own, kv).toString();
    assert.deepEqual(JSON.parse(replaced), { ...CHAT, kv_transfer_params: KV_FROM_PREFILL });
    assert.equal(replaced.split('kv_transfer_params').length, 2);
    // Degenerate: an empty object, and one with only the client's kv_transfer_params.
    assert.deepEqual(JSON.parse(nixlDecodeBody(Buffer.from('{}'), {}, '{"a":1}').toString()), { kv_transfer_params: { a: 1 } });
    assert.deepEqual(JSON.parse(nixlDecodeBody(Buffer.from('{"kv_transfer_params":1}'), { kv_transfer_params: 1 }, '2').toString()), { kv_transfer_params: 2 });
  });

  test('the prefiller\'s kv_transfer_params reach the decode leg as its text: ids past 2^53 and 1.0 unchanged', () => {
    const kv = '{"remote_engine_id":"e","remote_block_ids":[12345678901234567890, 1.0, 1e2],"remote_port":8000}';
    const answer = Buffer.from(`{"id":"p","usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":0}},"kv_transfer_params":${kv}}`);
    const out = readPrefillAnswer(answer)!;
    assert.equal(out.kvTransferParams, kv);
    assert.ok(nixlDecodeBody(Buffer.from(JSON.stringify(CHAT)), CHAT, out.kvTransferParams).toString().endsWith(`"kv_transfer_params":${kv}}`));
  });

  test('prefill answer: kv_transfer_params as returned, cached_tokens (absent/null → 0), not JSON → undefined', () => {
    assert.deepEqual(readPrefillAnswer(prefillAnswer()), { kvTransferParams: JSON.stringify(KV_FROM_PREFILL), cachedTokens: 32, missingParams: false });
    const noDetails = prefillAnswer({ usage: { prompt_tokens: 1, prompt_tokens_details: null }, kv_transfer_params: undefined });
    assert.deepEqual(readPrefillAnswer(noDetails), { kvTransferParams: 'null', cachedTokens: 0, missingParams: true });
    assert.equal(readPrefillAnswer(Buffer.from('not json')), undefined);
    assert.equal(readPrefillAnswer(Buffer.from('[1]')), undefined);
  });
});

describe('nixlv2 connector outcomes', () => {
  const raw = Buffer.from(JSON.stringify(CHAT));

  test('2xx → decode leg with the prefill\'s kv_transfer_params and cached_tokens', async () => {
    const { step, sent } = await carry(nixlv2Connector, CHAT, answer(200), raw);
    assert.equal(sent.length, 1);
    assert.deepEqual(sent[0]!.kv_transfer_params, PREFILL_KV_TRANSFER_PARAMS);
    assert.equal(step.kind, 'decode');
    if (step.kind !== 'decode') return;
    assert.deepEqual(JSON.parse(step.leg.body.toString()), { ...CHAT, kv_transfer_params: KV_FROM_PREFILL });
    assert.equal(step.leg.cachedTokens, 32);
    assert.equal(step.leg.headers, undefined);
    assert.equal(step.warning, undefined);
  });

  test('4xx but 404 → the prefill answer goes to the client', async () => {
    for (const status of [400, 413, 429]) {
      const { step } = await carry(nixlv2Connector, CHAT, answer(status, '{"error":{"message":"bad"}}'), raw);
      assert.equal(step.kind, 'reply', String(status));
      if (step.kind === 'reply') {
        assert.equal(step.status, status);
        assert.equal(step.body.toString(), '{"error":{"message":"bad"}}');
      }
    }
  });

  test('5xx, 404 (the prefill server lacks the model), connection failure or an unreadable 2xx → decode-only with the original body', async () => {
    for (const leg of [answer(500), answer(503), answer(404), answer(200, 'garbage'), { kind: 'failed', error: 'ECONNREFUSED' } as const]) {
      const { step } = await carry(nixlv2Connector, CHAT, leg, raw);
      assert.equal(step.kind, 'decode');
      if (step.kind !== 'decode') continue;
      assert.equal(step.leg.body, raw, 'byte for byte the client body');
      assert.equal(step.leg.cachedTokens, undefined);
      assert.ok(step.warning, 'the fallback is logged');
    }
  });

  for (const [what, kv] of [['without kv_transfer_params', undefined], ['with kv_transfer_params: null (a prefill server with no KV connector)', null]] as const) {
    test(`a 2xx ${what} → decode gets null, a warning, and the decoder counts the prompt`, async () => {
      const { step } = await carry(nixlv2Connector, CHAT, answer(200, prefillAnswer({ kv_transfer_params: kv })), raw);
      assert.equal(step.kind, 'decode');
      if (step.kind !== 'decode') return;
      assert.equal(JSON.parse(step.leg.body.toString()).kv_transfer_params, null);
      assert.equal(step.leg.recomputesPrompt, true);
      // The decoder computed the prompt: its own cached_tokens stands, not the prefill leg's.
      assert.equal(step.leg.cachedTokens, undefined);
      assert.match(step.warning ?? '', /no kv_transfer_params/);
    });
  }

  test('several sequences (n > 1) or a prompt batch → decode-only, no prefill leg: one kv_transfer_params serves one', async () => {
    const completion = { model: 'm', prompt: 'one prompt', max_tokens: 5 };
    for (const body of [{ ...CHAT, n: 2 }, { ...completion, prompt: ['a', 'b'] }, { ...completion, prompt: [[1, 2], [3, 4]] }]) {
      const bytes = Buffer.from(JSON.stringify(body));
      const { step, sent } = await carry(nixlv2Connector, body, answer(200), bytes);
      assert.equal(sent.length, 0, JSON.stringify(body));
      assert.equal(step.kind, 'decode');
      if (step.kind === 'decode') assert.equal(step.leg.body, bytes);
    }
    // One prompt given as token ids, or n = 1, is one sequence.
    for (const body of [{ ...completion, prompt: [1, 2, 3] }, { ...CHAT, n: 1 }]) {
      const { sent } = await carry(nixlv2Connector, body, answer(200), Buffer.from(JSON.stringify(body)));
      assert.equal(sent.length, 1, JSON.stringify(body));
    }
  });

  test('client gone during the prefill leg → aborted, nothing else', async () => {
    const { step } = await carry(nixlv2Connector, CHAT, { kind: 'aborted' }, raw);
    assert.deepEqual(step, { kind: 'aborted' });
  });
});

describe('shared-storage connector', () => {
  const raw = Buffer.from(JSON.stringify(CHAT));

  test('prefill leg: token limits 1, stream and everything else as sent; then the original body to decode', async () => {
    assert.deepEqual(JSON.parse(sharedStoragePrefillBody(CHAT).toString()), { ...CHAT, max_tokens: 1, max_completion_tokens: 1 });
    const { step, sent } = await carry(sharedStorageConnector, CHAT, answer(200, 'data: [DONE]\n\n'), raw);
    assert.deepEqual(sent, [{ ...CHAT, max_tokens: 1, max_completion_tokens: 1 }]);
    assert.equal(step.kind, 'decode');
    if (step.kind === 'decode') {
      assert.equal(step.leg.body, raw);
      assert.equal(step.leg.cachedTokens, undefined);
    }
  });

  test('4xx → client; 5xx / connection failure → decode-only; aborted → nothing', async () => {
    assert.equal((await carry(sharedStorageConnector, CHAT, answer(422, '{}'), raw)).step.kind, 'reply');
    for (const leg of [answer(502, '{}'), { kind: 'failed', error: 'ECONNRESET' } as const]) {
      const { step } = await carry(sharedStorageConnector, CHAT, leg, raw);
      assert.equal(step.kind, 'decode');
      if (step.kind === 'decode') assert.equal(step.leg.body, raw);
    }
    assert.equal((await carry(sharedStorageConnector, CHAT, { kind: 'aborted' }, raw)).step.kind, 'aborted');
  });
});

describe('cached_tokens rewrite', () => {
  test('setCachedTokens: details object set; null/absent details filled only for > 0; no usage untouched', () => {
    const a = { usage: { prompt_tokens: 10, prompt_tokens_details: { cached_tokens: 10, other: 1 } } };
    assert.equal(setCachedTokens(a, 3), true);
    assert.deepEqual(a.usage.prompt_tokens_details, { cached_tokens: 3, other: 1 });
    const b: Record<string, any> = { usage: { prompt_tokens: 10, prompt_tokens_details: null } };
    assert.equal(setCachedTokens(b, 0), false);
    assert.equal(b.usage.prompt_tokens_details, null);
    assert.equal(setCachedTokens(b, 4), true);
    assert.deepEqual(b.usage.prompt_tokens_details, { cached_tokens: 4 });
    assert.equal(setCachedTokens({ choices: [] }, 4), false);
    assert.equal(setCachedTokens({ usage: null }, 4), false);
  });

  test('JSON answer: value replaced, everything else equal; no usage or not JSON → the same buffer', () => {
    const body = Buffer.from(JSON.stringify({ id: 'a', choices: [{ text: 'é' }], usage: { prompt_tokens: 100, prompt_tokens_details: { cached_tokens: 100 } } }));
    const out = JSON.parse(rewriteJsonCachedTokens(body, 16).toString());
    assert.deepEqual(out, { id: 'a', choices: [{ text: 'é' }], usage: { prompt_tokens: 100, prompt_tokens_details: { cached_tokens: 16 } } });
    const plain = Buffer.from('{"id":"a","choices":[]}');
    assert.equal(rewriteJsonCachedTokens(plain, 16), plain);
    const bad = Buffer.from('{"usage": oops');
    assert.equal(rewriteJsonCachedTokens(bad, 16), bad);
  });

  test('only the value\'s bytes change: numbers, escapes, spacing and key order stay as the server wrote them', () => {
    const rw = (text: string, n = 16) => rewriteJsonCachedTokens(Buffer.from(text), n).toString();
    const keep = '{"id": "x\\u00e9", "big": 12345678901234567890, "f": 1.0, "z": -0.0, ';
    // A details object: its cached_tokens replaced, or added first.
    assert.equal(rw(`${keep}"usage": {"prompt_tokens": 90, "prompt_tokens_details": {"cached_tokens": 90 }}}`), `${keep}"usage": {"prompt_tokens": 90, "prompt_tokens_details": {"cached_tokens": 16 }}}`);
    assert.equal(rw(`${keep}"usage": {"prompt_tokens_details": {"audio_tokens": 0}}}`), `${keep}"usage": {"prompt_tokens_details": {"cached_tokens":16,"audio_tokens": 0}}}`);
    assert.equal(rw(`${keep}"usage": {"prompt_tokens_details": { }}}`), `${keep}"usage": {"prompt_tokens_details": {"cached_tokens":16 }}}`);
    // vLLM's null for 0, or no details at all: filled in when there is something to say.
    assert.equal(rw(`${keep}"usage": {"prompt_tokens": 9, "prompt_tokens_details": null}}`), `${keep}"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens":16}}}`);
    assert.equal(rw(`${keep}"usage": {"prompt_tokens": 9}}`), `${keep}"usage": {"prompt_tokens": 9,"prompt_tokens_details":{"cached_tokens":16}}}`);
    assert.equal(rw(`${keep}"usage": {}}`), `${keep}"usage": {"prompt_tokens_details":{"cached_tokens":16}}}`);
    assert.equal(rw(`${keep}"usage": {"prompt_tokens_details": null}}`, 0), `${keep}"usage": {"prompt_tokens_details": null}}`);
    // A "usage" inside a string or a nested object is not the answer's usage; JSON.parse's last duplicate wins.
    assert.equal(rw('{"text": "{\\"usage\\": 1}", "usage": {"prompt_tokens_details": {"cached_tokens": 3}}}'), '{"text": "{\\"usage\\": 1}", "usage": {"prompt_tokens_details": {"cached_tokens": 16}}}');
    assert.equal(rw('{"usage": {"prompt_tokens_details": {"cached_tokens": 1}}, "usage": {"prompt_tokens_details": {"cached_tokens": 2}}}'), '{"usage": {"prompt_tokens_details": {"cached_tokens": 1}}, "usage": {"prompt_tokens_details": {"cached_tokens": 16}}}');
    // An escaped key the member scan does not read ("us\u0061ge" is the last "usage" for JSON.parse):
    // re-serialised, so the value JSON.parse sees is the one changed.
    assert.equal(
      rw('{"usage": {"prompt_tokens_details": {"cached_tokens": 1}}, "us\\u0061ge": {"x": 1.0}}'),
      '{"usage":{"x":1,"prompt_tokens_details":{"cached_tokens":16}}}',
    );
    // A stream's usage line, CRLF kept.
    const sse = new SseCachedTokensRewriter(16);
    const line = 'data: {"choices": [], "big": 12345678901234567890, "usage": {"prompt_tokens_details": {"cached_tokens": 90}}}\r\n\r\n';
    assert.equal(sse.push(Buffer.from(line)).toString(), line.replace('"cached_tokens": 90', '"cached_tokens": 16'));
  });

  const event = (obj: unknown) => `data: ${JSON.stringify(obj)}\n\n`;
  const STREAM =
    event({ id: 'c', choices: [{ index: 0, delta: { content: 'héllo — ünïcode' }, finish_reason: null }] }) +
    event({ id: 'c', choices: [{ index: 0, delta: { content: ' "usage" in text' }, finish_reason: 'length' }] }) +
    event({ id: 'c', choices: [], usage: { prompt_tokens: 90, completion_tokens: 2, total_tokens: 92, prompt_tokens_details: { cached_tokens: 90 } } }) +
    'data: [DONE]\n\n';
  const EXPECTED = STREAM.replace('"cached_tokens":90', '"cached_tokens":7');

  function runSse(chunks: Buffer[], cached = 7): string {
    const rw = new SseCachedTokensRewriter(cached);
    const out: Buffer[] = [];
    for (const c of chunks) out.push(rw.push(c));
    out.push(rw.end());
    return Buffer.concat(out).toString('utf8');
  }

  test('SSE: only the usage event changes; every byte split point (inside multi-byte characters too)', () => {
    const bytes = Buffer.from(STREAM, 'utf8');
    assert.equal(runSse([bytes]), EXPECTED);
    for (let i = 1; i < bytes.length; i++) {
      assert.equal(runSse([bytes.subarray(0, i), bytes.subarray(i)]), EXPECTED, `split at ${i}`);
    }
    // Three-way splits around the usage event.
    const at = bytes.indexOf('"usage"');
    for (let i = at - 20; i < at + 40; i += 3) {
      for (let j = i + 1; j < i + 30; j += 7) {
        const parts = [bytes.subarray(0, i), bytes.subarray(i, j), bytes.subarray(j)];
        assert.equal(runSse(parts), EXPECTED, `split at ${i}/${j}`);
      }
    }
    // One byte at a time.
    assert.equal(runSse([...bytes].map((b) => Buffer.from([b]))), EXPECTED);
  });

  test('SSE: complete lines go out at once; only an unfinished line is held back', () => {
    const rw = new SseCachedTokensRewriter(1);
    const first = Buffer.from(event({ choices: [{ delta: { content: 'a' } }] }));
    assert.equal(rw.push(first), first, 'a chunk of whole events without usage passes as the same buffer');
    assert.equal(rw.push(Buffer.from('data: {"choices":[],"usage":{"prompt_tokens":3,')).length, 0);
    const rest = rw.push(Buffer.from('"prompt_tokens_details":{"cached_tokens":3}}}\n\n'));
    assert.equal(rest.toString(), 'data: {"choices":[],"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}}\n\n');
    assert.equal(rw.end().length, 0);
  });

  test('SSE: CRLF lines, `data:` without a space, a final line without newline, error events', () => {
    const crlf = 'data:{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":5}}}\r\n\r\ndata: [DONE]\r\n\r\n';
    assert.equal(runSse([Buffer.from(crlf)], 2), crlf.replace('"cached_tokens":5', '"cached_tokens":2'));
    const noNl = 'data: {"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":5}}}';
    assert.equal(runSse([Buffer.from(noNl)], 2), noNl.replace('"cached_tokens":5', '"cached_tokens":2'));
    const err = 'data: {"error":{"message":"usage exceeded"}}\n\n';
    assert.equal(runSse([Buffer.from(err)], 2), err);
    const notJson = 'data: {"usage": broken\n\n: comment "usage"\n\n';
    assert.equal(runSse([Buffer.from(notJson)], 2), notJson);
  });
});
