import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import type { Picker } from '../../src/scheduling/framework.js';
import { MaxScorePicker, maxScorePickerDefinition } from '../../src/scheduling/plugins/max-score-picker.js';
import { RandomPicker, randomPickerDefinition } from '../../src/scheduling/plugins/random-picker.js';
import {
  WeightedRandomPicker,
  weightedRandomPickerDefinition,
} from '../../src/scheduling/plugins/weighted-random-picker.js';
import { makeContext, makeEndpoint, makeRequest, names, scoredOf, tally } from './helpers.js';

const eps = ['a', 'b', 'c', 'd'].map((n) => makeEndpoint(n));
const [a, b, c, d] = eps as [Endpoint, Endpoint, Endpoint, Endpoint];

/** Picks `draws` times (one pick = first endpoint) with one seeded random stream. */
function draw(picker: Picker, scores: number[], draws: number, seed = 7): Map<string, number> {
  const ctx = makeContext(seed);
  const req = makeRequest();
  const picked: string[] = [];
  for (let i = 0; i < draws; i++) {
    picked.push(picker.pick(ctx, req, scoredOf(eps.map((e, j) => [e, scores[j]!])))[0]!.name);
  }
  return tally(picked);
}

describe('max-score-picker', () => {
  test('picks the highest score', () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 1 });
    const picked = picker.pick(makeContext(), makeRequest(), scoredOf([[a, 1], [b, 3], [c, 2]]));
    assert.deepEqual(names(picked), ['b']);
  });

  test('maxNumOfEndpoints > 1 returns the best first', () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 3 });
    const picked = picker.pick(makeContext(), makeRequest(), scoredOf([[a, 1], [b, 3], [c, 2], [d, 0]]));
    assert.deepEqual(names(picked), ['b', 'c', 'a']);
    const all = new MaxScorePicker('p', { maxNumOfEndpoints: 10 }).pick(makeContext(), makeRequest(), scoredOf([[a, 1], [b, 2]]));
    assert.deepEqual(names(all), ['b', 'a']);
  });

  test('equal scores are taken in turn: four picks over four idle endpoints visit each once (llm-d PR #2515)', () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 1 });
    const ctx = makeContext(7);
    const picked: string[] = [];
    for (let i = 0; i < 8; i++) picked.push(picker.pick(ctx, makeRequest(), scoredOf(eps.map((e) => [e, 1])))[0]!.name);
    assert.deepEqual(picked, ['a', 'b', 'c', 'd', 'a', 'b', 'c', 'd']);
  });

  test('ties among the best only: lower scores are never picked, the tied ones alternate', () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 1 });
    const picked: string[] = [];
    for (let i = 0; i < 4; i++) picked.push(picker.pick(makeContext(), makeRequest(), scoredOf([[a, 2], [b, 1], [c, 2], [d, 0]]))[0]!.name);
    assert.deepEqual(picked, ['a', 'c', 'a', 'c']);
  });

  test('a tie broken by a better score in between keeps its turn count (counted per profile, not per tier)', () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 1 });
    const tied = () => picker.pick(makeContext(), makeRequest(), scoredOf([[a, 1], [b, 1], [c, 1]]))[0]!.name;
    assert.equal(tied(), 'a');
    assert.equal(picker.pick(makeContext(), makeRequest(), scoredOf([[a, 1], [b, 3], [c, 1]]))[0]!.name, 'b');
    assert.equal(tied(), 'c');
    assert.equal(tied(), 'a');
  });

  test("one picker serving two profiles (the auto-injected one) keeps a turn per profile; two pickers keep their own", () => {
    /** Two rounds of a pick over {a, b} as `first`, then one over {c, d} as `second`. */
    const alternate = (first: [MaxScorePicker, string], second: [MaxScorePicker, string]): string[] => {
      const got: string[] = [];
      for (let i = 0; i < 2; i++) {
        got.push(first[0].pick(makeContext(), makeRequest(), scoredOf([[a, 1], [b, 1]]), first[1])[0]!.name);
        got.push(second[0].pick(makeContext(), makeRequest(), scoredOf([[c, 1], [d, 1]]), second[1])[0]!.name);
      }
      return got;
    };
    const shared = new MaxScorePicker('p', { maxNumOfEndpoints: 1 });
    // One count for both would give decode turns 0, 2 (a, a) and prefill 1, 3 (d, d).
    assert.deepEqual(alternate([shared, 'decode'], [shared, 'prefill']), ['a', 'c', 'b', 'd']);
    const [p1, p2] = [new MaxScorePicker('p1', { maxNumOfEndpoints: 1 }), new MaxScorePicker('p2', { maxNumOfEndpoints: 1 })];
    assert.deepEqual(alternate([p1, 'x'], [p2, 'x']), ['a', 'c', 'b', 'd']);
  });

  test("flow control's look-ahead probes see the next turn without taking it", () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 1 });
    const probe = { ...makeContext(), probe: true };
    const tied = scoredOf(eps.map((e) => [e, 1]));
    assert.equal(picker.pick(makeContext(), makeRequest(), tied, 'd')[0]!.name, 'a');
    assert.equal(picker.pick(probe, makeRequest(), scoredOf(eps.map((e) => [e, 1])), 'd')[0]!.name, 'b');
    assert.equal(picker.pick(probe, makeRequest(), scoredOf(eps.map((e) => [e, 1])), 'd')[0]!.name, 'b');
    assert.equal(picker.pick(makeContext(), makeRequest(), scoredOf(eps.map((e) => [e, 1])), 'd')[0]!.name, 'b');
  });

  test('multi-pick rotates each tied tier that reaches the picked places, best tier first', () => {
    const picker = new MaxScorePicker('p', { maxNumOfEndpoints: 2 });
    const firsts: string[][] = [];
    for (let i = 0; i < 3; i++) firsts.push(names(picker.pick(makeContext(), makeRequest(), scoredOf([[c, 0.5], [a, 1], [b, 1]]))));
    assert.deepEqual(firsts, [['a', 'b'], ['b', 'a'], ['a', 'b']]);
    // Tier [b, c] of score 1 follows the lone best d; the third place is not asked for.
    const three = new MaxScorePicker('p', { maxNumOfEndpoints: 2 });
    const got: string[][] = [];
    for (let i = 0; i < 2; i++) got.push(names(three.pick(makeContext(), makeRequest(), scoredOf([[a, 0], [b, 1], [c, 1], [d, 2]]))));
    assert.deepEqual(got, [['d', 'b'], ['d', 'c']]);
  });

  test('parameters', () => {
    assert.deepEqual(maxScorePickerDefinition.params.parse({}), { maxNumOfEndpoints: 1 });
    // ≤ 0 falls back to 1 with a warning, as llm-d's pickers do.
    for (const def of [maxScorePickerDefinition, randomPickerDefinition, weightedRandomPickerDefinition]) {
      const zero = def.params.parse({ maxNumOfEndpoints: 0 });
      assert.match(def.configWarnings!(zero, {} as never)[0]!.message, /maxNumOfEndpoints 0 is not positive: read as 1/);
      assert.equal((def.create('p', zero, {} as never) as unknown as { maxNumOfEndpoints: number }).maxNumOfEndpoints, 1);
      assert.deepEqual(def.configWarnings!(def.params.parse({ maxNumOfEndpoints: 2 }), {} as never), []);
    }
    assert.equal(maxScorePickerDefinition.params.safeParse({ maxNumOfEndpoints: 1.5 }).success, false);
    assert.equal(maxScorePickerDefinition.params.safeParse({ max: 1 }).success, false);
  });
});

describe('random-picker', () => {
  test('ignores scores and spreads uniformly', () => {
    const counts = draw(new RandomPicker('p', { maxNumOfEndpoints: 1 }), [10, 0, 0, 0], 4000);
    for (const e of eps) {
      const n = counts.get(e.name) ?? 0;
      assert.ok(n > 800 && n < 1200, `${e.name} picked ${n}/4000`);
    }
  });

  test('maxNumOfEndpoints distinct endpoints', () => {
    const picked = new RandomPicker('p', { maxNumOfEndpoints: 3 }).pick(makeContext(3), makeRequest(), scoredOf(eps.map((e) => [e, 0])));
    assert.equal(picked.length, 3);
    assert.equal(new Set(names(picked)).size, 3);
    const capped = new RandomPicker('p', { maxNumOfEndpoints: 9 }).pick(makeContext(3), makeRequest(), scoredOf([[a, 0]]));
    assert.deepEqual(names(capped), ['a']);
    // Draws near 1 each time: every pick comes from the ones not yet picked (a partial shuffle), never past the end.
    const high = { clock: makeContext().clock, random: () => 0.999 };
    const all = new RandomPicker('p', { maxNumOfEndpoints: eps.length }).pick(high, makeRequest(), scoredOf(eps.map((e) => [e, 0])));
    assert.deepEqual(new Set(names(all)), new Set(names(eps)));
  });

  test('parameters', () => {
    assert.deepEqual(randomPickerDefinition.params.parse({}), { maxNumOfEndpoints: 1 });
  });
});

describe('weighted-random-picker', () => {
  test('picks in proportion to score', () => {
    const draws = 20000;
    const counts = draw(new WeightedRandomPicker('p', { maxNumOfEndpoints: 1 }), [1, 2, 3, 4], draws, 11);
    const expected = [0.1, 0.2, 0.3, 0.4];
    eps.forEach((e, i) => {
      const share = (counts.get(e.name) ?? 0) / draws;
      assert.ok(Math.abs(share - expected[i]!) < 0.02, `${e.name}: ${share} vs ${expected[i]}`);
    });
  });

  test('a zero score is never picked while a positive one exists', () => {
    const counts = draw(new WeightedRandomPicker('p', { maxNumOfEndpoints: 1 }), [0, 1, 0, 3], 2000);
    assert.equal(counts.get('a'), undefined);
    assert.equal(counts.get('c'), undefined);
    assert.ok(counts.get('d')! > counts.get('b')!);
  });

  test('all scores ≤ 0 → uniform random', () => {
    const counts = draw(new WeightedRandomPicker('p', { maxNumOfEndpoints: 1 }), [0, 0, -1, 0], 4000);
    for (const e of eps) {
      const n = counts.get(e.name) ?? 0;
      assert.ok(n > 800 && n < 1200, `${e.name} picked ${n}/4000`);
    }
  });

  test('several picks: distinct, positive scores first, zero scores fill up', () => {
    const picker = new WeightedRandomPicker('p', { maxNumOfEndpoints: 3 });
    const ctx = makeContext(9);
    for (let i = 0; i < 200; i++) {
      const picked = names(picker.pick(ctx, makeRequest(), scoredOf([[a, 0], [b, 1], [c, 2], [d, 0]])));
      assert.equal(picked.length, 3);
      assert.equal(new Set(picked).size, 3);
      assert.deepEqual(new Set(picked.slice(0, 2)), new Set(['b', 'c']));
    }
  });

  test('several picks: the zero scores fill up in every order, not only some', () => {
    const picker = new WeightedRandomPicker('p', { maxNumOfEndpoints: 4 });
    const ctx = makeContext(3);
    const tails = new Set<string>();
    for (let i = 0; i < 600; i++) {
      const picked = names(picker.pick(ctx, makeRequest(), scoredOf([[a, 1], [b, 0], [c, 0], [d, 0]])));
      assert.equal(picked[0], 'a');
      tails.add(picked.slice(1).join(''));
    }
    assert.deepEqual([...tails].sort(), ['bcd', 'bdc', 'cbd', 'cdb', 'dbc', 'dcb']);
  });

  test('parameters', () => {
    assert.deepEqual(weightedRandomPickerDefinition.params.parse({}), { maxNumOfEndpoints: 1 });
    assert.equal(weightedRandomPickerDefinition.params.safeParse({ maxNumOfEndpoints: 1.5 }).success, false);
  });
});
