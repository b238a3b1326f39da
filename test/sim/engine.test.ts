import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  BlockLru,
  SimEngine,
  estimateTokens,
  promptBlockHashes,
  promptTokensOf,
  tokenIdBlockHashes,
  type FinishReason,
  type GenerationListener,
  type GenerationResult,
  type SimEngineOptions,
} from '../../src/sim/engine.js';
import { VirtualTime } from './virtual-time.js';

function setup(opts: SimEngineOptions = {}): { vt: VirtualTime; engine: SimEngine } {
  const vt = new VirtualTime();
  const engine = new SimEngine({ clock: vt, timers: vt, ...opts });
  return { vt, engine };
}

interface Recorder extends GenerationListener {
  results: GenerationResult[];
}

function collect(): Recorder {
  const results: GenerationResult[] = [];
  return { results, onFinish: (r) => results.push(r) };
}

interface StreamRecorder extends GenerationListener {
  tokens: { text: string; index: number; at: number; finishReason: FinishReason | null }[];
  results: GenerationResult[];
}

function streamCollect(vt: VirtualTime): StreamRecorder {
  const rec: StreamRecorder = {
    tokens: [],
    results: [],
    onToken: (text, index, finishReason) => rec.tokens.push({ text, index, at: vt.now(), finishReason }),
    onFinish: (r) => rec.results.push(r),
  };
  return rec;
}

/** Deterministic text of `blocks` 64-char blocks, block i drawn from `tag`+i. */
function blockText(tag: string, blocks: number): string {
  let s = '';
  for (let i = 0; i < blocks; i++) s += `${tag}-${i}-`.padEnd(64, 'x');
  return s;
}

function submitOk(engine: SimEngine, promptText: string, listener: GenerationListener, maxTokens?: number) {
  const r = engine.submit(maxTokens === undefined ? { promptText } : { promptText, maxTokens }, listener);
  assert.ok(r.accepted, 'request should be accepted');
  return r.request;
}

describe('SimEngine slots and queue', () => {
  test('the (maxNumSeqs+1)th request waits and starts when a slot frees', () => {
    const { vt, engine } = setup({ maxNumSeqs: 2, ttftOverheadMs: 10, prefillMsPerToken: 0, itlMs: 5 });
    const listeners = [collect(), collect(), collect()];
    const a = submitOk(engine, 'first', listeners[0]!, 4);
    const b = submitOk(engine, 'second', listeners[1]!, 8);
    const c = submitOk(engine, 'third', listeners[2]!, 4);
    assert.equal(a.state, 'running');
    assert.equal(b.state, 'running');
    assert.equal(c.state, 'waiting');
    assert.deepEqual(
      { running: engine.actualGauges().running, waiting: engine.actualGauges().waiting },
      { running: 2, waiting: 1 },
    );

    vt.advance(24); // a finishes at 10 + 3×5 = 25
    assert.equal(c.state, 'waiting');
    vt.advance(1);
    assert.equal(a.state, 'finished');
    assert.equal(listeners[0]!.results.length, 1);
    assert.equal(c.state, 'running');
    assert.equal(engine.actualGauges().waiting, 0);

    vt.runAll();
    assert.equal(engine.actualGauges().running, 0);
    assert.equal(listeners[2]!.results[0]!.completionTokens, 4);
  });

  test('generated tokens count as they are produced, as vLLM counts them per engine step, streamed or not', () => {
    const { vt, engine } = setup({ maxNumSeqs: 4, ttftOverheadMs: 10, prefillMsPerToken: 0, itlMs: 5 });
    submitOk(engine, 'whole', collect(), 100);
    submitOk(engine, 'streamed', streamCollect(vt), 100);
    assert.equal(engine.generationTokensNow(), 0);
    vt.advance(10 + 5 * 9); // first token at 10, then one every 5 ms: 10 tokens each
    assert.equal(engine.generationTokensNow(), 20);
    vt.runAll();
    assert.equal(engine.generationTokensNow(), 200);
  });

  test('a full waiting queue refuses the request', () => {
    const { engine } = setup({ maxNumSeqs: 1, maxWaiting: 1 });
    assert.ok(engine.submit({ promptText: 'a' }, collect()).accepted);
    assert.ok(engine.submit({ promptText: 'b' }, collect()).accepted);
    const refused = engine.submit({ promptText: 'c' }, collect());
    assert.deepEqual(refused, { accepted: false, reason: 'queue_full' });
    assert.equal(engine.actualGauges().waiting, 1);
  });

  test('maxWaiting 0 refuses as soon as every slot is busy', () => {
    const { engine } = setup({ maxNumSeqs: 1, maxWaiting: 0 });
    assert.ok(engine.submit({ promptText: 'a' }, collect()).accepted);
    assert.equal(engine.submit({ promptText: 'b' }, collect()).accepted, false);
  });

  test('abort of a running request frees its slot and admits the next waiting one', () => {
    const { vt, engine } = setup({ maxNumSeqs: 1, itlMs: 5 });
    const aListener = collect();
    const a = submitOk(engine, 'a', aListener, 100);
    const b = submitOk(engine, 'b', collect(), 2);
    vt.advance(30);
    a.abort();
    assert.equal(a.state, 'aborted');
    assert.equal(b.state, 'running');
    assert.deepEqual([engine.actualGauges().running, engine.actualGauges().waiting], [1, 0]);
    a.abort(); // idempotent
    vt.runAll();
    assert.equal(aListener.results.length, 0, 'an aborted request reports nothing');
    assert.equal(engine.counters.requestSuccess.abort, 1);
    assert.equal(engine.counters.requestSuccess.length, 1);
    assert.equal(engine.actualGauges().running, 0);
  });

  test('abort of a waiting request leaves the queue', () => {
    const { vt, engine } = setup({ maxNumSeqs: 1 });
    submitOk(engine, 'a', collect(), 2);
    const bListener = collect();
    const b = submitOk(engine, 'b', bListener, 2);
    const c = submitOk(engine, 'c', collect(), 2);
    b.abort();
    assert.equal(engine.actualGauges().waiting, 1);
    vt.runAll();
    assert.equal(bListener.results.length, 0);
    assert.equal(c.state, 'finished');
  });

  test('raising maxNumSeqs at run time admits waiting requests at once', () => {
    const { engine } = setup({ maxNumSeqs: 1 });
    submitOk(engine, 'a', collect());
    const b = submitOk(engine, 'b', collect());
    engine.configure({ maxNumSeqs: 2 });
    assert.equal(b.state, 'running');
    assert.throws(() => engine.configure({ maxNumSeqs: 0 }), /maxNumSeqs/);
  });
});

describe('SimEngine latency and output', () => {
  test('streamed tokens arrive at TTFT then every itlMs, finish reason on the last only', () => {
    const { vt, engine } = setup({ ttftOverheadMs: 20, prefillMsPerToken: 0.5, itlMs: 5 });
    const rec = streamCollect(vt);
    const start = vt.now();
    const prompt = 'x'.repeat(40); // 10 tokens → TTFT 20 + 5
    submitOk(engine, prompt, rec, 3);
    vt.runAll();
    assert.deepEqual(rec.tokens.map((t) => t.at - start), [25, 30, 35]);
    assert.deepEqual(rec.tokens.map((t) => t.finishReason), [null, null, 'length']);
    assert.equal(rec.results[0]!.finishReason, 'length');
    assert.equal(rec.results[0]!.promptTokens, 10);

    // Same prompt, same words: output is deterministic.
    const again = streamCollect(vt);
    submitOk(engine, prompt, again, 3);
    vt.runAll();
    assert.deepEqual(again.tokens.map((t) => t.text), rec.tokens.map((t) => t.text));
    assert.ok(!rec.tokens[0]!.text.startsWith(' ') && rec.tokens[1]!.text.startsWith(' '));
  });

  test('with itlMs 0 every token is emitted at TTFT in one turn', () => {
    const { vt, engine } = setup({ ttftOverheadMs: 10, prefillMsPerToken: 0, itlMs: 0 });
    const rec = streamCollect(vt);
    const start = vt.now();
    submitOk(engine, 'p', rec, 5);
    vt.runAll();
    assert.deepEqual(rec.tokens.map((t) => t.at - start), [10, 10, 10, 10, 10]);
    assert.equal(rec.results.length, 1);
  });

  test('a listener that aborts during onToken gets no further tokens', () => {
    const { vt, engine } = setup({ itlMs: 0 });
    const tokens: number[] = [];
    let finished = false;
    const handle = submitOk(engine, 'p', {
      onToken: (_text, index) => {
        tokens.push(index);
        if (index === 1) handle.abort();
      },
      onFinish: () => { finished = true; },
    }, 10);
    vt.runAll();
    assert.deepEqual(tokens, [0, 1]);
    assert.equal(finished, false);
    assert.equal(engine.counters.generationTokens, 2);
    assert.equal(engine.actualGauges().running, 0);
  });

  test('output length: default, max_tokens, capped at maxOutputTokens; finish reason', () => {
    const { vt, engine } = setup({ defaultOutputTokens: 5, maxOutputTokens: 7, itlMs: 0 });
    const d = collect();
    const m = collect();
    const capped = collect();
    const context = collect();
    submitOk(engine, 'p', d);
    submitOk(engine, 'p', m, 3);
    submitOk(engine, 'p', capped, 500);
    assert.ok(engine.submit({ promptText: 'p', contextRoom: 2 }, context).accepted);
    vt.runAll();
    // The client's max_tokens and the end of the context window are limits ('length'); the output
    // --max-output-tokens allows is a natural end ('stop'): a client asking 500 did not hit its limit.
    assert.deepEqual(
      [d, m, capped, context].map((l) => [l.results[0]!.completionTokens, l.results[0]!.finishReason]),
      [[5, 'stop'], [3, 'length'], [7, 'stop'], [2, 'length']],
    );
    assert.equal(d.results[0]!.text.split(' ').length, 5);
  });

  test('TTFT histogram and token counters', () => {
    const { vt, engine } = setup({ ttftOverheadMs: 20, prefillMsPerToken: 0, itlMs: 1 });
    submitOk(engine, 'x'.repeat(400), collect(), 4); // 100 prompt tokens
    submitOk(engine, 'y'.repeat(40), collect(), 6); // 10 prompt tokens
    vt.runAll();
    assert.equal(engine.counters.promptTokens, 110);
    assert.equal(engine.counters.generationTokens, 10);
    assert.equal(engine.counters.prefixCacheQueries, 110);
    const h = engine.ttftHistogram();
    assert.equal(h.count, 2);
    assert.ok(Math.abs(h.sum - 0.04) < 1e-9);
    assert.equal(h.counts[3], 2, 'both fall in the le=0.02 bucket');
  });
});

describe('SimEngine prefix cache', () => {
  test('a second identical long prompt hits the cache and has a lower TTFT', () => {
    const { vt, engine } = setup({ ttftOverheadMs: 20, prefillMsPerToken: 0.1, itlMs: 1 });
    const prompt = blockText('doc', 10); // 640 chars = 160 tokens = 10 blocks
    const first = streamCollect(vt);
    let t0 = vt.now();
    submitOk(engine, prompt, first, 2);
    vt.runAll();
    const ttft1 = first.tokens[0]!.at - t0;

    const second = streamCollect(vt);
    t0 = vt.now();
    submitOk(engine, prompt, second, 2);
    vt.runAll();
    const ttft2 = second.tokens[0]!.at - t0;

    assert.equal(first.results[0]!.cachedTokens, 0);
    // The last prompt token is always recomputed (as in vLLM), so 9 of 10 blocks hit.
    assert.equal(second.results[0]!.cachedTokens, 144);
    assert.ok(Math.abs(ttft1 - 36) < 1e-9, `ttft1 ${ttft1}`);
    assert.ok(Math.abs(ttft2 - 21.6) < 1e-9, `ttft2 ${ttft2}`);
    assert.equal(engine.counters.prefixCacheQueries, 320);
    assert.equal(engine.counters.prefixCacheHits, 144);
  });

  test('a partial prefix hits only the shared leading blocks; hashes are chained', () => {
    const { vt, engine } = setup({ itlMs: 0 });
    const base = blockText('shared', 5);
    submitOk(engine, base + blockText('a', 5), collect(), 1);
    vt.runAll();

    const partial = collect();
    submitOk(engine, base + blockText('b', 5), partial, 1);
    const differentStart = collect();
    // Same blocks 1..9 as the first prompt, but block 0 differs: chained hashes never match.
    submitOk(engine, blockText('other', 1) + (base + blockText('a', 5)).slice(64), differentStart, 1);
    vt.runAll();
    assert.equal(partial.results[0]!.cachedTokens, 80);
    assert.equal(differentStart.results[0]!.cachedTokens, 0);
  });

  test('cache_salt separates otherwise identical prompts', () => {
    const { vt, engine } = setup({ itlMs: 0 });
    const prompt = blockText('salted', 4);
    engine.submit({ promptText: prompt, cacheSalt: 'tenant-a' }, collect());
    vt.runAll();
    const other = collect();
    const same = collect();
    engine.submit({ promptText: prompt, cacheSalt: 'tenant-b' }, other);
    engine.submit({ promptText: prompt, cacheSalt: 'tenant-a' }, same);
    vt.runAll();
    assert.equal(other.results[0]!.cachedTokens, 0);
    assert.equal(same.results[0]!.cachedTokens, 48);
  });

  /** An engine of `numGpuBlocks` and a runner: one prompt at a time, to completion, returning its cached tokens. */
  function cacheOf(numGpuBlocks: number): (prompt: string) => number {
    const { vt, engine } = setup({ numGpuBlocks, itlMs: 0 });
    return (prompt) => {
      const l = collect();
      submitOk(engine, prompt, l, 1);
      vt.runAll();
      return l.results[0]!.cachedTokens;
    };
  }

  test('the LRU evicts the least recently used blocks at numGpuBlocks', () => {
    const run = cacheOf(4);
    const a = blockText('a', 4) + '!'; // 4 full blocks, 65 tokens → all 4 blocks can hit
    const b = blockText('b', 4) + '!';
    assert.equal(run(a), 0);
    assert.equal(run(a), 64);
    assert.equal(run(b), 0); // fills the cache with b's blocks, evicting all of a's
    assert.equal(run(a), 0);
    assert.equal(run(a), 64);
  });

  test('under pressure a prompt loses its tail blocks first, so its head still hits (as vLLM frees blocks in reverse)', () => {
    const run = cacheOf(6);
    const a = blockText('a', 4) + '!';
    const b = blockText('b', 4) + '!';
    assert.equal(run(a), 0);
    assert.equal(run(b), 0); // 8 blocks for 6 places: two of a's go, the last two
    assert.equal(run(a), 32); // a's first two blocks still hit
  });

  test('BlockLru: touching refreshes recency; matchPrefix stops at the first miss', () => {
    const lru = new BlockLru(3);
    lru.touch(1);
    lru.touch(2);
    lru.touch(3);
    lru.touch(1); // 2 is now the oldest
    lru.touch(4);
    assert.equal(lru.has(2), false);
    assert.deepEqual([lru.has(1), lru.has(3), lru.has(4)], [true, true, true]);
    assert.equal(lru.matchPrefix([1, 3, 99, 4], 10), 2);
    assert.equal(lru.matchPrefix([1, 3, 4], 1), 1);
    assert.equal(lru.size, 3);
  });

  test('block hashes: only full blocks, deterministic, prefix-stable', () => {
    const text = blockText('h', 3) + 'tail';
    const hashes = promptBlockHashes(text, 64);
    assert.equal(hashes.length, 3);
    assert.deepEqual(promptBlockHashes(text, 64), hashes);
    assert.deepEqual(promptBlockHashes(blockText('h', 2), 64), hashes.slice(0, 2));
    assert.equal(estimateTokens(text), Math.ceil(text.length / 4));
  });
});

describe('SimEngine KV usage and pins', () => {
  test('kv usage counts prompt and generated blocks of running requests', () => {
    const { vt, engine } = setup({
      numGpuBlocks: 100, ttftOverheadMs: 10, prefillMsPerToken: 0, itlMs: 1,
    });
    submitOk(engine, 'x'.repeat(320), collect(), 40); // 80 prompt tokens = 5 blocks
    assert.equal(engine.actualGauges().kvUsage, 0.05);
    vt.advance(10 + 16); // first token at 10, then 16 more: 97 tokens → 7 blocks
    assert.equal(engine.actualGauges().kvUsage, 0.07);
    vt.runAll();
    assert.equal(engine.actualGauges().kvUsage, 0);
  });

  test('running requests that share a prompt prefix hold its blocks once (vLLM prefix caching)', () => {
    const { engine } = setup({ numGpuBlocks: 100, maxNumSeqs: 4, itlMs: 1000 });
    const system = 'x'.repeat(320); // 5 full blocks
    submitOk(engine, system + 'y'.repeat(40), collect(), 40); // 90 tokens = 6 blocks: 5 shared + 1 own
    assert.equal(engine.actualGauges().kvUsage, 0.06);
    submitOk(engine, system + 'z'.repeat(40), collect(), 40); // same 5 blocks + its own partial one
    assert.equal(engine.actualGauges().running, 2);
    assert.equal(engine.actualGauges().kvUsage, 0.07);
    submitOk(engine, 'w'.repeat(360), collect(), 40); // nothing shared: 6 more
    assert.equal(engine.actualGauges().kvUsage, 0.13);
  });

  test('kv usage is clamped to 1', () => {
    const { engine } = setup({ numGpuBlocks: 2 });
    submitOk(engine, 'x'.repeat(1000), collect());
    assert.equal(engine.actualGauges().kvUsage, 1);
  });

  test('pinned gauges are reported until unpinned with null', () => {
    const { engine } = setup();
    submitOk(engine, 'a', collect());
    engine.pin({ waiting: 7, kvUsage: 0.5 });
    assert.deepEqual(engine.reportedGauges(), { waiting: 7, running: 1, kvUsage: 0.5 });
    assert.equal(engine.actualGauges().waiting, 0);
    engine.pin({ running: 3 });
    engine.pin({ waiting: null });
    assert.deepEqual(engine.reportedGauges(), { waiting: 0, running: 3, kvUsage: 0.5 });
    assert.deepEqual(engine.pinned, { waiting: null, running: 3, kvUsage: 0.5 });
  });

  test('dispose cancels every timer', () => {
    const { vt, engine } = setup({ maxNumSeqs: 1 });
    submitOk(engine, 'a', collect());
    submitOk(engine, 'b', collect());
    engine.dispose();
    assert.equal(vt.pendingCount, 0);
    assert.deepEqual(engine.actualGauges(), { waiting: 0, running: 0, kvUsage: 0 });
  });
});

describe('SimEngine: n > 1 children and token-id prompts', () => {
  test('a child submitted with a sibling hits all its full prompt blocks at once, even before the sibling\'s prefill is done (vLLM V1)', () => {
    const { vt, engine } = setup({ ttftOverheadMs: 10, prefillMsPerToken: 1, itlMs: 1, maxNumSeqs: 1 });
    const input = { promptText: blockText('p', 10) + 'tail', maxTokens: 2 }; // 161 tokens, 10 full blocks
    const first = streamCollect(vt);
    const second = streamCollect(vt);
    const start = vt.now();
    const a = engine.submit(input, first);
    assert.ok(a.accepted);
    const b = engine.submit(input, second, { sibling: a.request, choice: 1 });
    assert.ok(b.accepted);
    assert.equal(b.request.state, 'waiting', 'its own slot: it waits for one');
    vt.runAll();
    assert.equal(first.results[0]!.cachedTokens, 0);
    assert.equal(second.results[0]!.cachedTokens, 160);
    assert.notEqual(second.tokens.map((t) => t.text).join(''), first.tokens.map((t) => t.text).join(''), 'its own tokens');
    assert.equal(first.tokens[0]!.at - start, 10 + 161);
    assert.equal(engine.counters.prefixCacheHits, 160);
    assert.equal(engine.counters.promptTokens, 2 * 161);

    // Admitted in the same step: the sibling's blocks are being computed, and already shared.
    const { vt: vt2, engine: e2 } = setup({ ttftOverheadMs: 10, prefillMsPerToken: 1, itlMs: 1, maxNumSeqs: 2, numGpuBlocks: 100 });
    const r0 = collect();
    const r1 = collect();
    const c0 = e2.submit(input, r0);
    assert.ok(c0.accepted);
    const c1 = e2.submit(input, r1, { sibling: c0.request, choice: 1 });
    assert.ok(c1.accepted);
    assert.deepEqual([c0.request.cachedTokens, c1.request.cachedTokens], [0, 160]);
    assert.equal(e2.actualGauges().kvUsage, 0.12, '10 shared blocks once + 1 partial block each');
    vt2.runAll();
    assert.equal(r1.results[0]!.cachedTokens, 160);
  });

  test('hasRoomFor: free slots plus queue places, whole or not at all', () => {
    const { engine } = setup({ maxNumSeqs: 2, maxWaiting: 1 });
    assert.ok(engine.hasRoomFor(3));
    assert.ok(!engine.hasRoomFor(4));
    submitOk(engine, 'a', collect());
    assert.ok(engine.hasRoomFor(2));
    assert.ok(!engine.hasRoomFor(3));
    submitOk(engine, 'b', collect());
    submitOk(engine, 'c', collect());
    assert.ok(!engine.hasRoomFor(1));
  });

  test('a token-id prompt: one token per id; its blocks hashed from the ids, chained, with the salt', () => {
    const ids = Array.from({ length: 40 }, (_, i) => i * 1000);
    assert.equal(promptTokensOf({ promptText: '', promptTokenIds: ids }), 40);
    const hashes = tokenIdBlockHashes(ids, 16);
    assert.equal(hashes.length, 2);
    assert.deepEqual(tokenIdBlockHashes(ids.slice(0, 32), 16), hashes, 'prefix-stable');
    assert.notDeepEqual(tokenIdBlockHashes([1, ...ids.slice(1)], 16)[1], hashes[1], 'chained');
    assert.notDeepEqual(tokenIdBlockHashes(ids, 16, 'salt'), hashes);

    const { vt, engine } = setup({ itlMs: 0 });
    const first = collect();
    const second = collect();
    assert.ok(engine.submit({ promptText: '', promptTokenIds: ids, maxTokens: 1 }, first).accepted);
    vt.runAll();
    assert.ok(engine.submit({ promptText: '', promptTokenIds: [...ids.slice(0, 32), 7, 8], maxTokens: 1 }, second).accepted);
    vt.runAll();
    assert.deepEqual([first.results[0]!.promptTokens, first.results[0]!.cachedTokens], [40, 0]);
    assert.deepEqual([second.results[0]!.promptTokens, second.results[0]!.cachedTokens], [34, 32]);
  });
});
