import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import type {
  CycleContext,
  Filter,
  Picker,
  PreRequest,
  ProfileHandler,
  ProfileRunResult,
  ScoredEndpoint,
  Scorer,
  SchedulingProfile,
  SchedulingRequest,
  SchedulingResult,
} from '../../src/scheduling/framework.js';
import { runProfile, Scheduler, type DecisionTrace } from '../../src/scheduling/scheduler.js';
import { SingleProfileHandler } from '../../src/scheduling/plugins/single-profile-handler.js';
import { makeContext, makeEndpoint, makeRequest, names } from './helpers.js';

function keepFilter(name: string, keep: (e: Endpoint) => boolean, calls: string[] = []): Filter {
  return {
    type: 'test-filter',
    name,
    filter(_ctx, _req, endpoints) {
      calls.push(`${name}:${names(endpoints).join(',')}`);
      return endpoints.filter(keep);
    },
  };
}

function fixedScorer(name: string, scores: Record<string, number>): Scorer {
  return {
    type: 'test-scorer',
    name,
    score(_ctx, _req, endpoints, out) {
      endpoints.forEach((e, i) => (out[i] = scores[e.name] ?? 0));
    },
  };
}

/** Picks the best score (first on ties) and remembers what it was given. */
class RecordingPicker implements Picker {
  readonly type = 'test-picker';
  readonly name = 'recording-picker';
  seen: { name: string; score: number }[] = [];
  pick(_ctx: CycleContext, _req: SchedulingRequest, scored: ScoredEndpoint[]): Endpoint[] {
    this.seen = scored.map((s) => ({ name: s.endpoint.name, score: s.score }));
    let best = scored[0]!;
    for (const s of scored) if (s.score > best.score) best = s;
    return [best.endpoint];
  }
}

function profile(
  name: string,
  parts: { filters?: Filter[]; scorers?: { scorer: Scorer; weight: number }[]; picker?: Picker },
): SchedulingProfile {
  return { name, filters: parts.filters ?? [], scorers: parts.scorers ?? [], picker: parts.picker ?? new RecordingPicker() };
}

const a = makeEndpoint('a');
const b = makeEndpoint('b');
const c = makeEndpoint('c');

describe('runProfile', () => {
  test('runs filters in order, each on the previous output', () => {
    const calls: string[] = [];
    const p = profile('default', {
      filters: [keepFilter('no-a', (e) => e.name !== 'a', calls), keepFilter('no-b', (e) => e.name !== 'b', calls)],
    });
    const result = runProfile(makeContext(), p, makeRequest(), [a, b, c]);
    assert.deepEqual(calls, ['no-a:a,b,c', 'no-b:b,c']);
    assert.deepEqual(names(result.targets), ['c']);
    assert.equal(result.failure, undefined);
  });

  test('a filter that empties the list fails the profile and stops the chain', () => {
    const calls: string[] = [];
    const picker = new RecordingPicker();
    const p = profile('default', {
      filters: [keepFilter('none', () => false, calls), keepFilter('after', () => true, calls)],
      picker,
    });
    const result = runProfile(makeContext(), p, makeRequest(), [a, b]);
    assert.deepEqual(result.targets, []);
    assert.match(result.failure!, /filter none left no endpoints/);
    assert.deepEqual(calls, ['none:a,b']);
    assert.deepEqual(picker.seen, []);
  });

  test('scores are clamped to [0,1] (NaN → 0), multiplied by weight and summed', () => {
    const picker = new RecordingPicker();
    const p = profile('default', {
      scorers: [
        { scorer: fixedScorer('s1', { a: 2, b: -1, c: Number.NaN }), weight: 2 },
        { scorer: fixedScorer('s2', { a: 0.5, b: 0.25, c: 1 }), weight: 3 },
      ],
      picker,
    });
    const result = runProfile(makeContext(), p, makeRequest(), [a, b, c]);
    assert.deepEqual(picker.seen, [
      { name: 'a', score: 2 * 1 + 3 * 0.5 },
      { name: 'b', score: 0 + 3 * 0.25 },
      { name: 'c', score: 0 + 3 * 1 },
    ]);
    assert.deepEqual(names(result.targets), ['a']);
  });

  test('a scorer that writes nothing contributes 0 (buffer is cleared between scorers)', () => {
    const picker = new RecordingPicker();
    const silent: Scorer = { type: 't', name: 'silent', score() {} };
    const p = profile('default', {
      scorers: [
        { scorer: fixedScorer('s1', { a: 1, b: 1 }), weight: 1 },
        { scorer: silent, weight: 5 },
      ],
      picker,
    });
    runProfile(makeContext(), p, makeRequest(), [a, b]);
    assert.deepEqual(
      picker.seen.map((s) => s.score),
      [1, 1],
    );
  });

  test('the picker chooses among survivors only', () => {
    const picker = new RecordingPicker();
    const p = profile('default', {
      filters: [keepFilter('no-a', (e) => e.name !== 'a')],
      scorers: [{ scorer: fixedScorer('s', { a: 1, b: 0.2, c: 0.7 }), weight: 1 }],
      picker,
    });
    const result = runProfile(makeContext(), p, makeRequest(), [a, b, c]);
    assert.deepEqual(names(result.targets), ['c']);
    assert.deepEqual(
      picker.seen.map((s) => s.name),
      ['b', 'c'],
    );
  });

  test('no candidates fails without calling anything', () => {
    const picker = new RecordingPicker();
    const result = runProfile(makeContext(), profile('p', { picker }), makeRequest(), []);
    assert.deepEqual(result.targets, []);
    assert.ok(result.failure);
  });

  test('a picker choosing nothing fails the profile', () => {
    const empty: Picker = { type: 't', name: 'empty', pick: () => [] };
    const result = runProfile(makeContext(), profile('p', { picker: empty }), makeRequest(), [a]);
    assert.deepEqual(result.targets, []);
    assert.match(result.failure!, /picker empty/);
  });
});

describe('Scheduler', () => {
  function recordingHook(): PreRequest & { calls: SchedulingResult[] } {
    const calls: SchedulingResult[] = [];
    return { type: 'hook', name: 'hook', calls, preRequest: (_req, result) => void calls.push(result) };
  }

  test('no candidates → no-endpoints (503)', () => {
    const hook = recordingHook();
    const p = profile('default', {});
    const s = new Scheduler(new SingleProfileHandler('h'), new Map([['default', p]]), [hook], makeContext());
    const outcome = s.schedule(makeRequest(), []);
    assert.equal(outcome.ok, false);
    assert.equal(!outcome.ok && outcome.reason, 'no-endpoints');
    assert.equal(hook.calls.length, 0);
  });

  test('primary profile filtered empty → filtered (429), PreRequest not called', () => {
    const hook = recordingHook();
    const p = profile('default', { filters: [keepFilter('none', () => false)] });
    const s = new Scheduler(new SingleProfileHandler('h'), new Map([['default', p]]), [hook], makeContext());
    const outcome = s.schedule(makeRequest(), [a, b]);
    assert.equal(outcome.ok, false);
    if (!outcome.ok) {
      assert.equal(outcome.reason, 'filtered');
      assert.match(outcome.message, /none/);
    }
    assert.equal(hook.calls.length, 0);
  });

  test('success returns the primary target and calls every PreRequest hook with the result', () => {
    const hook1 = recordingHook();
    const hook2 = recordingHook();
    const p = profile('default', { scorers: [{ scorer: fixedScorer('s', { b: 1 }), weight: 1 }] });
    const s = new Scheduler(new SingleProfileHandler('h'), new Map([['default', p]]), [hook1, hook2], makeContext());
    const outcome = s.schedule(makeRequest(), [a, b, c]);
    assert.ok(outcome.ok);
    assert.equal(outcome.target.name, 'b');
    assert.equal(outcome.result.primaryProfile, 'default');
    assert.equal(hook1.calls.length, 1);
    assert.equal(hook2.calls.length, 1);
    assert.equal(hook1.calls[0], outcome.result);
    assert.deepEqual(names(outcome.result.profileResults.get('default')!.targets), ['b']);
  });

  test('handler loop: profiles over several rounds, then processResults picks the primary', () => {
    const decode = profile('decode', {
      filters: [keepFilter('decode', (e) => e.name !== 'a')],
      scorers: [{ scorer: fixedScorer('s', { c: 1 }), weight: 1 }],
    });
    const prefill = profile('prefill', {
      filters: [keepFilter('prefill', (e) => e.name === 'a')],
    });
    const rounds: string[][] = [];
    const handler: ProfileHandler = {
      type: 'two-round',
      name: 'two-round',
      pickProfiles(_ctx, _req, profiles, results) {
        rounds.push([...results.keys()]);
        if (results.size === 0) return [profiles.get('decode')!];
        if (results.size === 1) return [profiles.get('prefill')!];
        return [];
      },
      processResults(_req, results): SchedulingResult {
        return { primaryProfile: 'decode', profileResults: new Map(results as Map<string, ProfileRunResult>) };
      },
    };
    const hook = recordingHook();
    const s = new Scheduler(
      handler,
      new Map([
        ['decode', decode],
        ['prefill', prefill],
      ]),
      [hook],
      makeContext(),
    );
    const trace: DecisionTrace = [];
    const outcome = s.schedule(makeRequest(), [a, b, c], trace);
    assert.deepEqual(rounds, [[], ['decode'], ['decode', 'prefill']]);
    assert.ok(outcome.ok);
    assert.equal(outcome.target.name, 'c');
    assert.deepEqual(names(outcome.result.profileResults.get('prefill')!.targets), ['a']);
    assert.equal(hook.calls.length, 1);
    // The trace has both runs, in the handler's order.
    assert.deepEqual(
      trace.map((t) => [t.profile, t.filters.map((f) => f.dropped), t.picked]),
      [
        ['decode', [['a']], ['c']],
        ['prefill', [['b', 'c']], ['a']],
      ],
    );
  });

  test('a failing non-primary profile does not fail the request', () => {
    const decode = profile('decode', {});
    const prefill = profile('prefill', { filters: [keepFilter('none', () => false)] });
    const handler: ProfileHandler = {
      type: 'both',
      name: 'both',
      pickProfiles: (_ctx, _req, profiles, results) => (results.size === 0 ? [...profiles.values()] : []),
      processResults: (_req, results) => ({ primaryProfile: 'decode', profileResults: new Map(results) }),
    };
    const s = new Scheduler(
      handler,
      new Map([
        ['decode', decode],
        ['prefill', prefill],
      ]),
      [],
      makeContext(),
    );
    const outcome = s.schedule(makeRequest(), [a]);
    assert.ok(outcome.ok);
    assert.ok(outcome.result.profileResults.get('prefill')!.failure);
  });

  test('a trace records each profile run: filters with what they dropped, weights, clamped scores, totals, the pick', () => {
    const p = profile('default', {
      filters: [keepFilter('no-a', (e) => e.name !== 'a'), keepFilter('all', () => true)],
      scorers: [
        { scorer: fixedScorer('q', { b: 0.5, c: 2 }), weight: 2 },
        { scorer: fixedScorer('k', { b: NaN, c: 0.25 }), weight: 1 },
      ],
    });
    const s = new Scheduler(new SingleProfileHandler('h'), new Map([['default', p]]), [], makeContext());
    const trace: DecisionTrace = [];
    const outcome = s.schedule(makeRequest(), [a, b, c], trace);
    assert.ok(outcome.ok);
    assert.equal(outcome.target.name, 'c');
    assert.deepEqual(trace, [
      {
        profile: 'default',
        candidates: 3,
        filters: [
          { filter: 'no-a', kept: 2, dropped: ['a'] },
          { filter: 'all', kept: 2, dropped: [] },
        ],
        weights: { q: 2, k: 1 },
        scores: {
          b: { total: 1, scorers: { q: 0.5, k: 0 } },
          c: { total: 2.25, scorers: { q: 1, k: 0.25 } },
        },
        picked: ['c'],
      },
    ]);
    // Tracing changes nothing about the decision.
    const plain = s.schedule(makeRequest(), [a, b, c]);
    assert.ok(plain.ok);
    assert.equal(plain.target.name, 'c');
  });

  test('a trace of a refused decision names the filter that left nothing', () => {
    const p = profile('default', { filters: [keepFilter('none', () => false)] });
    const s = new Scheduler(new SingleProfileHandler('h'), new Map([['default', p]]), [], makeContext());
    const trace: DecisionTrace = [];
    assert.equal(s.schedule(makeRequest(), [a, b], trace).ok, false);
    assert.equal(trace.length, 1);
    assert.deepEqual(trace[0]!.filters, [{ filter: 'none', kept: 0, dropped: ['a', 'b'] }]);
    assert.deepEqual(trace[0]!.picked, []);
    assert.deepEqual(trace[0]!.scores, {});
    assert.match(trace[0]!.failure!, /filter none left no endpoints/);
  });

  test('a handler that never stops is cut off with an error', () => {
    const p = profile('default', {});
    const handler: ProfileHandler = {
      type: 'loop',
      name: 'loop',
      pickProfiles: () => [p],
      processResults: (_req, results) => ({ primaryProfile: 'default', profileResults: new Map(results) }),
    };
    const s = new Scheduler(handler, new Map([['default', p]]), [], makeContext());
    assert.throws(() => s.schedule(makeRequest(), [a]), /rounds/);
  });
});
