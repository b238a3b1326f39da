import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import type { SchedulingResult } from '../../src/scheduling/framework.js';
import { blockHashes, hashRange, hashString, PrefixIndex } from '../../src/scheduling/prefix-index.js';
import {
  PrefixCacheScorer,
  prefixCacheScorerDefinition,
  prefixCacheScorerParams,
} from '../../src/scheduling/plugins/prefix-cache-scorer.js';
import { shouldDisaggregate } from '../../src/scheduling/plugins/prefix-based-pd-decider.js';
import { ManualClock, seededRandom } from '../../src/util/clock.js';
import { makeContext, makeEndpoint, makeRequest } from './helpers.js';

/** Deterministic pseudo-text of `length` characters. */
function text(seed: number, length: number): string {
  const random = seededRandom(seed);
  const words = ['alpha', 'beta', 'gamma', 'delta', 'kv', 'cache', 'token', 'decode', 'prefill', 'model'];
  let s = '';
  while (s.length < length) s += words[Math.floor(random() * words.length)] + ' ';
  return s.slice(0, length);
}

const OPTS = { blockChars: 64, maxBlocks: 256 };

describe('block hashing', () => {
  test('deterministic, seed- and content-sensitive, safe integers', () => {
    const t = text(1, 500);
    assert.deepEqual(blockHashes(t, 1, OPTS), blockHashes(t, 1, OPTS));
    assert.notDeepEqual(blockHashes(t, 1, OPTS), blockHashes(t, 2, OPTS));
    for (const h of blockHashes(t, 1, OPTS)) assert.ok(Number.isSafeInteger(h) && h >= 0);
    assert.notEqual(hashString('abc'), hashString('abd'));
    assert.equal(hashRange('xxabcxx', 2, 5, 0), hashString('abc'));
  });

  test('a range longer than the kept scratch hashes the same from any offset, and later short ranges are unaffected', () => {
    const long = text(3, 70_000); // past hashRange's kept scratch (64 Ki units)
    const small = hashString('abc');
    const whole = hashString(long, 7);
    assert.equal(hashRange(`x${long}y`, 1, long.length + 1, 7), whole);
    assert.notEqual(hashString(`${long.slice(0, -1)}!`, 7), whole);
    assert.equal(hashString('abc'), small);
    assert.equal(hashRange('xxabcxx', 2, 5, 0), small);
  });

  test('full blocks plus a trailing partial block; shorter than one block → none', () => {
    assert.equal(blockHashes(text(1, 63), 0, OPTS).length, 0);
    assert.equal(blockHashes(text(1, 64), 0, OPTS).length, 1);
    assert.equal(blockHashes(text(1, 65), 0, OPTS).length, 2);
    assert.equal(blockHashes(text(1, 640), 0, OPTS).length, 10);
  });

  test('chained: a shared prefix gives shared leading hashes, then they diverge for good', () => {
    const common = text(1, 256);
    const h1 = blockHashes(common + text(2, 256), 0, OPTS);
    const h2 = blockHashes(common + text(3, 256), 0, OPTS);
    assert.deepEqual(h1.slice(0, 4), h2.slice(0, 4));
    for (let i = 4; i < 8; i++) assert.notEqual(h1[i], h2[i]);
  });

  test('a differing tail changes the trailing partial block', () => {
    const base = text(1, 128);
    assert.notEqual(blockHashes(base + 'x', 0, OPTS).at(-1), blockHashes(base + 'y', 0, OPTS).at(-1));
  });

  test('truncated to maxBlocks (0 = unlimited)', () => {
    const long = text(1, 64 * 300 + 10);
    assert.equal(blockHashes(long, 0, { blockChars: 64, maxBlocks: 256 }).length, 256);
    assert.equal(blockHashes(long, 0, { blockChars: 64, maxBlocks: 0 }).length, 301);
  });
});

describe('PrefixIndex', () => {
  const [a, b, c] = ['a', 'b', 'c'].map((n) => makeEndpoint(n)) as [Endpoint, Endpoint, Endpoint];

  test('learned endpoint matches; others do not; distinct prompts match nothing', () => {
    const index = new PrefixIndex();
    const hashes = blockHashes(text(1, 1000), 0, OPTS);
    index.learn('b', hashes, 1000);
    assert.deepEqual([...index.match(hashes, [a, b, c])], [0, hashes.length, 0]);
    assert.deepEqual([...index.match(blockHashes(text(2, 1000), 0, OPTS), [a, b, c])], [0, 0, 0]);
  });

  test('partial shared prefix → partial match', () => {
    const index = new PrefixIndex();
    const common = text(1, 64 * 4);
    index.learn('a', blockHashes(common + text(2, 64 * 4), 0, OPTS), 1000);
    const query = blockHashes(common + text(3, 64 * 12), 0, OPTS);
    assert.equal(query.length, 16);
    assert.deepEqual([...index.match(query, [a, b])], [4, 0]);
  });

  test('several owners of the same blocks', () => {
    const index = new PrefixIndex();
    const hashes = blockHashes(text(1, 640), 0, OPTS);
    index.learn('a', hashes.slice(0, 3), 1000);
    index.learn('b', hashes, 1000);
    assert.deepEqual([...index.match(hashes, [a, b, c])], [3, 10, 0]);
    assert.equal(index.distinctBlocks, 10);
  });

  test('LRU eviction per endpoint, most recent kept; the reverse map follows', () => {
    const index = new PrefixIndex();
    const first = blockHashes(text(1, 64 * 3), 0, OPTS);
    const second = blockHashes(text(2, 64 * 3), 0, OPTS);
    index.learn('a', first, 4);
    index.learn('a', second, 4);
    assert.equal(index.size('a'), 4);
    // A chain is learned tail first, so first's tail (first[2], then first[1]) is the oldest and goes;
    // its head first[0] survives and still matches.
    assert.deepEqual([...index.match(first, [a])], [1]);
    assert.deepEqual([...index.match(second, [a])], [3]);
    assert.equal(index.distinctBlocks, 4);
  });

  test('a chain longer than the capacity keeps its head', () => {
    const index = new PrefixIndex();
    const hashes = blockHashes(text(1, 64 * 10), 0, OPTS);
    index.learn('a', hashes, 4);
    assert.equal(index.size('a'), 4);
    assert.deepEqual([...index.match(hashes, [a])], [4]);
  });

  test('re-learning refreshes recency', () => {
    const index = new PrefixIndex();
    const keep = blockHashes(text(1, 64 * 2), 0, OPTS);
    index.learn('a', keep, 4);
    index.learn('a', blockHashes(text(2, 64 * 2), 0, OPTS), 4);
    index.learn('a', keep, 4); // touch
    index.learn('a', blockHashes(text(3, 64 * 2), 0, OPTS), 4);
    assert.deepEqual([...index.match(keep, [a])], [2]);
  });

  test('lazy tails: a prompt learned by a second endpoint, or branching inside the tail, shares real blocks', () => {
    const index = new PrefixIndex();
    const hashes = blockHashes(text(1, 64 * 10), 0, OPTS);
    index.learn('a', hashes, 1000); // block 0, then a tail of 9
    const branch = [...hashes.slice(0, 5), ...blockHashes(text(2, 64 * 3), 7, OPTS)];
    index.learn('b', branch, 1000); // reaches 4 blocks into a's tail: turned into blocks
    assert.deepEqual([...index.match(hashes, [a, b])], [10, 5]);
    assert.deepEqual([...index.match(branch, [a, b])], [5, 8]);
    assert.equal(index.distinctBlocks, 13);
    assert.deepEqual([index.size('a'), index.size('b')], [10, 8]);
    index.purge(new Set(['b']));
    assert.deepEqual([...index.match(hashes, [a, b])], [0, 5]);
    assert.equal(index.distinctBlocks, 8);
  });

  test('P/D: the first of two learns of the same blocks makes them blocks (no tail to turn back); same answers', () => {
    for (const lazyTail of [true, false]) {
      const index = new PrefixIndex();
      const hashes = blockHashes(text(1, 64 * 10), 0, OPTS);
      index.learn('decode', hashes, 1000, lazyTail);
      index.learn('prefill', hashes, 1000, true);
      assert.deepEqual([...index.match(hashes, [makeEndpoint('decode'), makeEndpoint('prefill')])], [10, 10]);
      assert.equal(index.distinctBlocks, 10);
    }
  });

  test('a fractional capacity counts whole blocks', () => {
    const index = new PrefixIndex();
    index.learn('a', blockHashes(text(1, 64 * 10), 0, OPTS), 2.5);
    assert.equal(index.size('a'), 2);
    assert.equal(index.distinctBlocks, 2);
    index.purge(new Set());
    assert.equal(index.distinctBlocks, 0);
  });

  test('purge forgets endpoints that left the pool', () => {
    const index = new PrefixIndex();
    const hashes = blockHashes(text(1, 640), 0, OPTS);
    index.learn('a', hashes, 1000);
    index.learn('b', hashes, 1000);
    index.purge(new Set(['b']));
    assert.deepEqual(index.endpointNames(), ['b']);
    assert.deepEqual([...index.match(hashes, [a, b])], [0, 10]);
    index.purge(new Set());
    assert.equal(index.distinctBlocks, 0);
  });
});

/** The index's contract, kept simple: per endpoint an insertion-ordered Map used as an LRU, a chain learned tail first. */
class ReferenceIndex {
  readonly lru = new Map<string, Map<number, true>>();

  learn(name: string, hashes: readonly number[], capacity: number): void {
    let held = this.lru.get(name);
    if (held === undefined) this.lru.set(name, (held = new Map()));
    for (const h of [...hashes].reverse()) {
      held.delete(h);
      held.set(h, true);
    }
    while (held.size > capacity) held.delete(held.keys().next().value!);
  }

  match(hashes: readonly number[], names: readonly string[]): number[] {
    return names.map((name) => {
      const held = this.lru.get(name);
      let n = 0;
      while (held !== undefined && n < hashes.length && held.has(hashes[n]!)) n++;
      return n;
    });
  }

  purge(live: ReadonlySet<string>): void {
    for (const name of [...this.lru.keys()]) if (!live.has(name)) this.lru.delete(name);
  }

  distinct(): number {
    const all = new Set<number>();
    for (const held of this.lru.values()) for (const h of held.keys()) all.add(h);
    return all.size;
  }
}

describe('PrefixIndex against a reference model', () => {
  /**
   * Hash chains as blockHashes makes them: a block's hash stands for its whole prefix, so each hash
   * has one predecessor. The chains form a random tree; new hashes collide in their low 32 bits in
   * pairs and crowd the table slots, so probing, backward-shift deletion and tag checks are exercised.
   */
  function chainTree(random: () => number) {
    const int = (n: number) => Math.floor(random() * n);
    const children = new Map<number, number[]>(); // predecessor hash (−1: none) → continuations
    let lastLow = -1;
    const newHash = (): number => {
      const low = lastLow >= 0 && random() < 0.5 ? lastLow : int(64) * 1024 + int(7);
      lastLow = low;
      return 2 ** 32 * (1 + int(1 << 20)) + low;
    };
    /** A chain of 1–12 blocks, following existing branches mostly. */
    return (): number[] => {
      const chain: number[] = [];
      let previous = -1;
      for (let length = 1 + int(12); chain.length < length; ) {
        let next = children.get(previous);
        if (next === undefined) children.set(previous, (next = []));
        const hash = next.length > 0 && random() < 0.75 ? next[int(next.length)]! : newHash();
        if (!next.includes(hash)) next.push(hash);
        chain.push((previous = hash));
      }
      return chain;
    };
  }

  for (const seed of [1, 2, 3, 4]) {
    test(`random learn / match / purge over hash chains (seed ${seed})`, () => {
      const random = seededRandom(seed);
      const int = (n: number) => Math.floor(random() * n);
      const nextChain = chainTree(random);
      const names = ['a', 'b', 'c', 'd'];
      const endpoints = names.map((n) => makeEndpoint(n));
      const index = new PrefixIndex();
      const ref = new ReferenceIndex();
      const learned: number[][] = [];
      for (let step = 0; step < 4000; step++) {
        const op = int(20);
        if (op < 12) {
          const chain = nextChain();
          const name = names[int(names.length)]!;
          const capacity = 5 + int(60);
          // Lazy tails mostly; sometimes every block a block (what P/D's first learn does).
          index.learn(name, chain, capacity, random() < 0.8);
          ref.learn(name, chain, capacity);
          learned.push(chain);
        } else if (op < 19) {
          // Often a prefix of something learned, so matches run deep.
          const probe = learned.length > 0 && op < 17 ? learned[int(learned.length)]!.slice(0, 1 + int(12)) : nextChain();
          assert.deepEqual([...index.match(probe, endpoints)], ref.match(probe, names), `step ${step}`);
        } else {
          const live = new Set(names.filter(() => random() < 0.75));
          index.purge(live);
          ref.purge(live);
        }
        if (step % 100 === 0) {
          assert.equal(index.distinctBlocks, ref.distinct(), `distinct blocks at step ${step}`);
          for (const name of names) assert.equal(index.size(name), ref.lru.get(name)?.size ?? 0, `${name} at step ${step}`);
        }
      }
      index.purge(new Set());
      assert.equal(index.distinctBlocks, 0);
    });
  }

  test('hashes that do not chain (a collision) keep the index whole: everything stays findable and purges to empty', () => {
    const random = seededRandom(9);
    const int = (n: number) => Math.floor(random() * n);
    const universe = Array.from({ length: 40 }, (_, i) => 2 ** 32 * (1 + i) + (i % 5));
    const index = new PrefixIndex();
    const e = makeEndpoint('a');
    for (let step = 0; step < 3000; step++) {
      const chain = Array.from({ length: 1 + int(8) }, () => universe[int(universe.length)]!);
      index.learn(int(2) === 0 ? 'a' : 'b', chain, 3 + int(30));
      // A chain just learned by an endpoint matches in full on it, whatever it repeats or shares.
      if (int(4) === 0) {
        index.learn('a', chain, 1000);
        assert.equal(index.match(chain, [e])[0], chain.length, `step ${step}`);
      }
    }
    index.purge(new Set());
    assert.equal(index.distinctBlocks, 0);
  });
});

describe('prefix-cache-scorer', () => {
  const endpoints = ['a', 'b', 'c'].map((n) => makeEndpoint(n));
  const [a, b, c] = endpoints as [Endpoint, Endpoint, Endpoint];

  function setup(params: Record<string, unknown> = {}, pool: Endpoint[] = endpoints) {
    const clock = new ManualClock();
    const scorer = new PrefixCacheScorer('prefix-cache-scorer', prefixCacheScorerParams.parse(params), clock, { endpoints: pool });
    const score = (prompt: string, opts: Parameters<typeof makeRequest>[1] = {}, on: Endpoint[] = endpoints) => {
      const req = makeRequest(prompt, opts);
      const out = new Float64Array(on.length);
      scorer.score(makeContext(), req, on, out);
      return { req, scores: [...out] };
    };
    const learn = (prompt: string, target: Endpoint, opts: Parameters<typeof makeRequest>[1] = {}, prefill?: Endpoint) => {
      const req = makeRequest(prompt, opts);
      const result: SchedulingResult = {
        primaryProfile: 'decode',
        profileResults: new Map([['decode', { targets: [target] }]]),
      };
      if (prefill) result.profileResults.set('prefill', { targets: [prefill] });
      scorer.preRequest(req, result);
    };
    return { clock, scorer, score, learn };
  }

  test('score = matched / total blocks; 0 before learning and for short prompts', () => {
    const { score, learn } = setup();
    const prompt = text(1, 64 * 10);
    assert.deepEqual(score(prompt).scores, [0, 0, 0]);
    learn(prompt, b);
    assert.deepEqual(score(prompt).scores, [0, 1, 0]);
    assert.deepEqual(score(prompt.slice(0, 64 * 5) + text(9, 64 * 5)).scores, [0, 0.5, 0]);
    assert.deepEqual(score('short').scores, [0, 0, 0]);
  });

  test('hashes computed in score() are reused by preRequest() via req.state', () => {
    const { scorer, score } = setup();
    const { req } = score(text(1, 640));
    const hashes = req.state.get(scorer.stateKey);
    assert.ok(Array.isArray(hashes) && hashes.length === 10);
    assert.equal(scorer.hashesFor(req), hashes);
  });

  test("a reload that re-cuts the blocks does not reuse a request's hashes from the old instance", () => {
    const old = setup({ blockSizeTokens: 16 });
    const { req } = old.score(text(1, 1024));
    assert.equal(old.scorer.hashesFor(req).length, 16);
    // The same name after a reload with 64-token blocks: the probed request's state must not leak in.
    const next = new PrefixCacheScorer('prefix-cache-scorer', prefixCacheScorerParams.parse({ blockSizeTokens: 64 }), new ManualClock(), { endpoints });
    next.carryOver(old.scorer, new Set());
    assert.equal(next.hashesFor(req).length, 4);
  });

  test('learns the primary target and the `prefill` profile target', () => {
    const { score, learn } = setup();
    const prompt = text(1, 640);
    learn(prompt, a, {}, c);
    assert.deepEqual(score(prompt).scores, [1, 0, 1]);
  });

  test("the expected hit it reports: the chosen endpoint's match before learning, the same whether score() ran on it or not", () => {
    const reported: number[] = [];
    const scorer = new PrefixCacheScorer('p', prefixCacheScorerParams.parse({}), new ManualClock(), { endpoints }, (matched, total) => reported.push(matched / total));
    const prompt = text(1, 640); // 10 blocks
    const result = (target: Endpoint): SchedulingResult => ({ primaryProfile: 'default', profileResults: new Map([['default', { targets: [target] }]]) });
    const scored = (target: Endpoint, on: Endpoint[]) => {
      const req = makeRequest(prompt);
      scorer.score(makeContext(), req, on, new Float64Array(on.length));
      scorer.preRequest(req, result(target));
    };
    scored(a, endpoints); // nothing learned yet
    scored(a, endpoints); // a holds it all
    scored(b, [a, b]); // b holds nothing
    scored(a, [b, c]); // a was not scored for this request: its match is walked
    scorer.preRequest(makeRequest(prompt), result(a)); // not scored at all
    assert.deepEqual(reported, [0, 1, 0, 1, 1]);
  });

  test('cache_salt and model separate the chains', () => {
    const { score, learn } = setup();
    const prompt = text(1, 640);
    learn(prompt, a, { body: { cache_salt: 'tenant-1' } });
    assert.deepEqual(score(prompt, { body: { cache_salt: 'tenant-1' } }).scores, [1, 0, 0]);
    assert.deepEqual(score(prompt, { body: { cache_salt: 'tenant-2' } }).scores, [0, 0, 0]);
    assert.deepEqual(score(prompt).scores, [0, 0, 0]);
    assert.deepEqual(score(prompt, { model: 'other', body: { cache_salt: 'tenant-1' } }).scores, [0, 0, 0]);
    // An empty salt is no salt: those requests share the unsalted chain.
    learn(prompt, b);
    assert.deepEqual(score(prompt, { body: { cache_salt: '' } }).scores, [0, 1, 0]);
  });

  test('LRU capacity: lruCapacityPerServer, or num_gpu_blocks when autoTune', () => {
    const small = makeEndpoint('small', { numGpuBlocks: 5 });
    const { scorer, learn } = setup({ lruCapacityPerServer: 8 }, [small, a]);
    learn(text(1, 64 * 20), small);
    learn(text(1, 64 * 20), a);
    assert.equal(scorer.index.size('small'), 5);
    assert.equal(scorer.index.size('a'), 8);
    const fixed = setup({ autoTune: false, lruCapacityPerServer: 8 }, [small]);
    fixed.learn(text(1, 64 * 20), small);
    assert.equal(fixed.scorer.index.size('small'), 8);
    // vLLM --block-size 64: 3 engine blocks hold 192 tokens, 12 of our 16-token blocks.
    const large = makeEndpoint('large', { numGpuBlocks: 3 });
    large.metrics!.cacheConfig!.blockSize = 64;
    const tuned = setup({}, [large]);
    assert.equal(tuned.scorer.capacityOf(large), 12);
    tuned.learn(text(1, 64 * 20), large);
    assert.equal(tuned.scorer.index.size('large'), 12);
  });

  test('purges endpoints that left the pool, at most every 2 minutes', () => {
    const pool = [a, b];
    const { clock, scorer, learn } = setup({}, pool);
    learn(text(1, 640), a);
    learn(text(2, 640), b);
    pool.pop(); // b leaves
    clock.advance(60_000);
    learn(text(3, 640), a);
    assert.deepEqual(scorer.index.endpointNames().sort(), ['a', 'b']);
    clock.advance(60_000);
    learn(text(4, 640), a);
    assert.deepEqual(scorer.index.endpointNames(), ['a']);
  });

  test('block size and match limits', () => {
    const tokens = setup({ blockSizeTokens: 32, maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 3 });
    assert.deepEqual(tokens.scorer.hashOptions, { blockChars: 128, maxBlocks: 3 });
    // A block count alone is ignored: the default token window wins (llm-d).
    assert.deepEqual(setup({ maxPrefixBlocksToMatch: 3 }).scorer.hashOptions, { blockChars: 64, maxBlocks: 8192 });
    const byTokens = setup({ blockSizeTokens: 16, maxPrefixTokensToMatch: 160 });
    assert.deepEqual(byTokens.scorer.hashOptions, { blockChars: 64, maxBlocks: 10 });
    // The deprecated blockSize is tokens (llm-d's code), unless blockSizeTokens is set.
    const deprecated = setup({ blockSize: 64 });
    assert.deepEqual(deprecated.scorer.hashOptions, { blockChars: 256, maxBlocks: 131_072 / 64 });
    assert.deepEqual(setup({ blockSize: 64, blockSizeTokens: 32 }).scorer.hashOptions, { blockChars: 128, maxBlocks: 131_072 / 32 });
    // The token window wins when both are set (llm-d); by default it is 131 072 tokens.
    assert.deepEqual(setup({ maxPrefixBlocksToMatch: 3, maxPrefixTokensToMatch: 160 }).scorer.hashOptions, { blockChars: 64, maxBlocks: 10 });
    assert.deepEqual(setup({}).scorer.hashOptions, { blockChars: 64, maxBlocks: 8192 });
    assert.deepEqual(setup({ maxPrefixTokensToMatch: 0 }).scorer.hashOptions, { blockChars: 64, maxBlocks: 2048 });
    assert.deepEqual(setup({ maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 0 }).scorer.hashOptions, { blockChars: 64, maxBlocks: 0 });
    // A window under one block is one block, not none (0 would mean no limit).
    assert.deepEqual(setup({ maxPrefixTokensToMatch: 8 }).scorer.hashOptions, { blockChars: 64, maxBlocks: 1 });
    const { req } = byTokens.score(text(1, 64 * 40));
    assert.equal((req.state.get(byTokens.scorer.stateKey) as number[]).length, 10);
  });

  test('a token window that is not a whole number of blocks matches only the whole blocks in it (40 tokens of 16 → 2)', () => {
    assert.deepEqual(setup({ blockSizeTokens: 16, maxPrefixTokensToMatch: 40 }).scorer.hashOptions, { blockChars: 64, maxBlocks: 2 });
  });

  test('matchLengthWeight mixes in the absolute match length', () => {
    const { score, learn } = setup({ matchLengthWeight: 0.5, matchLengthScaleTokens: 320 });
    const prompt = text(1, 64 * 40);
    learn(prompt.slice(0, 64 * 10), a); // 10 blocks × 16 tokens = 160 tokens matched of 40 blocks
    const s = score(prompt).scores[0]!;
    const expected = 0.5 * (160 / 320) ** 2 + 0.5 * (10 / 40);
    assert.ok(Math.abs(s - expected) < 1e-12, `${s} vs ${expected}`);
    // A match longer than the scale counts as the scale (min(1, …)): the ratio still tells partial from whole.
    const short = setup({ matchLengthWeight: 0.5, matchLengthScaleTokens: 16 });
    short.learn(prompt.slice(0, 64 * 20), a);
    const partial = short.score(prompt).scores[0]!;
    assert.ok(Math.abs(partial - (0.5 + 0.5 * (20 / 40))) < 1e-12, `${partial}`);
  });

  test('prefixMatch for one endpoint (for P/D deciders)', () => {
    const { scorer, learn } = setup();
    const prompt = text(1, 64 * 8);
    learn(prompt.slice(0, 64 * 6), a);
    const req = makeRequest(prompt);
    assert.deepEqual(scorer.prefixMatch(req, a), { matchedBlocks: 6, totalBlocks: 8, blockSizeTokens: 16 });
    assert.deepEqual(scorer.prefixMatch(req, b), { matchedBlocks: 0, totalBlocks: 8, blockSizeTokens: 16 });
  });

  test('a 10 000-token prompt the decode endpoint caches whole is not prefilled again (the window covers it)', () => {
    const { scorer, learn } = setup();
    const prompt = text(1, 40_000);
    learn(prompt, a);
    const match = scorer.prefixMatch(makeRequest(prompt), a);
    assert.equal(match.matchedBlocks * match.blockSizeTokens, 10_000);
    assert.equal(shouldDisaggregate(prompt.length, match, 16), false);
    assert.equal(shouldDisaggregate(prompt.length, scorer.prefixMatch(makeRequest(prompt), b), 16), true);
  });

  test('parameters: llm-d defaults, strict', () => {
    const p = prefixCacheScorerDefinition.params;
    assert.deepEqual(p.parse({}), {
      autoTune: true,
      blockSizeTokens: 16,
      maxPrefixTokensToMatch: 131_072,
      lruCapacityPerServer: 31250,
      matchLengthWeight: 0,
      matchLengthScaleTokens: 8192,
    });
    // A block count is kept where written (to be warned about) or where it decides (token window 0).
    assert.deepEqual(p.parse({ maxPrefixBlocksToMatch: 64 }), { ...p.parse({}), maxPrefixBlocksToMatch: 64 });
    assert.deepEqual(p.parse({ maxPrefixTokensToMatch: 0 }), { ...p.parse({}), maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 2048 });
    const warnings = (raw: object) =>
      prefixCacheScorerDefinition.configWarnings!(p.parse(raw), { metricsIntervalMs: 50 }).map((w) => `${w.parameter}: ${w.message}`);
    assert.deepEqual(warnings({}), []);
    assert.deepEqual(warnings({ maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 64 }), []);
    assert.match(warnings({ maxPrefixBlocksToMatch: 256 }).join(), /^maxPrefixBlocksToMatch: ignored: maxPrefixTokensToMatch \(131072 tokens\) takes precedence/);
    assert.match(warnings({ blockSize: 64 }).join(), /^blockSize: deprecated: read as blockSizeTokens: 64 \(tokens/);
    assert.match(warnings({ blockSize: 64, blockSizeTokens: 32 }).join(), /^blockSize: deprecated and ignored/);
    assert.equal(p.safeParse({ blockSizeTokens: 0 }).success, false);
    assert.equal(p.safeParse({ autoTune: 'yes' }).success, false);
    assert.equal(p.safeParse({ hashSeed: 1 }).success, false);
  });
});
