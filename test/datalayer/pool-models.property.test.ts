/**
 * The pool's model bookkeeping (Pool.eligibleFor, setAsideFor and what feeds them), against a from-scratch reading
 * after random sequences of reloads (add, remove, re-add, move, relabel), scrapes naming models and
 * LoRA adapters, failures that eject, requests and time passing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Pool } from '../../src/datalayer/pool.js';
import type { Endpoint, EndpointMetrics, EndpointSpec } from '../../src/datalayer/endpoint.js';

const NAMES = ['a', 'b', 'c', 'd', 'e', 'f'];
const MODELS = ['A', 'B', 'C'];
const ADAPTERS = ['l1', 'l2', 'A', 'B'];
const ROLES = ['', 'prefill', 'decode', 'both'];

type Op =
  | { k: 'set'; members: { name: string; port: number; role: string }[] }
  | { k: 'scrape'; who: number; model: string | undefined; run: string[] }
  | { k: 'fail'; who: number; times: number }
  | { k: 'acquire'; who: number }
  | { k: 'release'; who: number }
  | { k: 'tick'; ms: number }
  | { k: 'ask'; model: string };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 1, arbitrary: fc.record({
    k: fc.constant('set' as const),
    members: fc.uniqueArray(
      fc.record({ name: fc.constantFrom(...NAMES), port: fc.constantFrom(1, 2), role: fc.constantFrom(...ROLES) }),
      { selector: (m) => m.name, minLength: 2, maxLength: 6 },
    ),
  }) },
  { weight: 6, arbitrary: fc.record({ k: fc.constant('scrape' as const), who: fc.nat(10), model: fc.option(fc.constantFrom(...MODELS), { nil: undefined }), run: fc.subarray(ADAPTERS) }) },
  { weight: 2, arbitrary: fc.record({ k: fc.constant('fail' as const), who: fc.nat(10), times: fc.integer({ min: 1, max: 6 }) }) },
  fc.record({ k: fc.constant('acquire' as const), who: fc.nat(10) }),
  fc.record({ k: fc.constant('release' as const), who: fc.nat(10) }),
  fc.record({ k: fc.constant('tick' as const), ms: fc.integer({ min: 1, max: 40_000 }) }),
  fc.record({ k: fc.constant('ask' as const), model: fc.constantFrom(...MODELS, ...ADAPTERS, 'zz') }),
);

function specOf(m: { name: string; port: number; role: string }): EndpointSpec {
  // Ports unique per name; `port` toggles the address so a change makes a fresh object.
  return { name: m.name, address: `10.0.0.${m.port}`, port: 1000 + NAMES.indexOf(m.name), labels: m.role ? { 'llm-d.ai/role': m.role } : {} };
}

/** eligibleFor's documented answer, from scratch. */
function reference(pool: Pool, base: string | undefined, served: Set<string>, now: number): string[] {
  const eligible = pool.eligible(now);
  if (served.size < 2 || base === undefined || !served.has(base)) return eligible.map((e) => e.name);
  const serves = (ep: Endpoint) => ep.servedModel === undefined || ep.servedModel === base;
  const out: string[] = [];
  for (const ep of pool.endpoints) {
    if (!serves(ep)) continue;
    if (eligible.includes(ep)) { out.push(ep.name); continue; }
    // Set aside: kept only when no server of the model in its stage is eligible, and never in the prefill stage.
    const stageOpen = pool.endpoints.some((o) => o.servedModel === base && o.stage === ep.stage && eligible.includes(o));
    if (ep.servedModel === base && !stageOpen && ep.stage !== 'prefill') out.push(ep.name);
  }
  // No server of the model that can answer (decode or interleaved): as a model no page names.
  const answers = pool.endpoints.some((ep) => out.includes(ep.name) && ep.servedModel === base && (ep.stage === 'decode' || ep.stage === 'interleaved'));
  return answers ? out : eligible.map((e) => e.name);
}

test('Pool: model counts, onServedModels and eligibleFor agree with a from-scratch recount after any sequence of reloads, scrapes, failures, requests and time', () => {
  fc.assert(
    fc.property(fc.array(opArb, { minLength: 20, maxLength: 80 }), (ops) => {
      let fired: Set<string> | undefined;
      let firedCount = 0;
      const pool = new Pool(NAMES.map((name, i) => specOf({ name, port: 1, role: ROLES[i % 4]! })), { onServedModels: (by) => { fired = new Set(by.keys()); firedCount++; } });
      const adapterRef = new Map<string, string>();
      const held: Endpoint[] = [];
      let now = 1;
      let lastSet = new Set<string>();
      for (const op of ops) {
        const before = firedCount;
        const list = pool.endpoints;
        const pick = (i: number) => (list.length ? list[i % list.length]! : undefined);
        switch (op.k) {
          case 'set': pool.setEndpoints(op.members.map(specOf)); break;
          case 'scrape': {
            const ep = pick(op.who);
            if (!ep) break;
            const m: EndpointMetrics = { waiting: 0, running: 0, kvUsage: 0, ...(op.model ? { model: op.model } : {}), ...(op.run.length ? { lora: { running: op.run, waiting: [], maxLora: 4 } } : {}) };
            pool.recordScrape(ep, { metrics: m }, now);
            // An adapter shown under two models has none of its own ('': it goes anywhere).
            if (op.model) for (const a of op.run) adapterRef.set(a, adapterRef.get(a) === undefined || adapterRef.get(a) === op.model ? op.model : '');
            break;
          }
          case 'fail': { const ep = pick(op.who); if (ep) for (let i = 0; i < op.times; i++) pool.upstreamFailed(ep, 'x', now); break; }
          case 'acquire': { const ep = pick(op.who); if (ep) { pool.acquire(ep); held.push(ep); } break; }
          case 'release': { const ep = held.splice(op.who % Math.max(1, held.length), 1)[0]; if (ep) pool.release(ep); break; }
          case 'tick': now += op.ms; break;
          case 'ask': break;
        }
        // Brute-force recount over the list.
        const counts = new Map<string, number>();
        for (const ep of pool.endpoints) if (ep.servedModel !== undefined) counts.set(ep.servedModel, (counts.get(ep.servedModel) ?? 0) + 1);
        const p = pool as unknown as { modelCounts: Map<string, number> };
        assert.deepEqual(new Map([...p.modelCounts].sort()), new Map([...counts].sort()), `modelCounts after ${JSON.stringify(op)}`);
        const set = new Set(counts.keys());
        const changed = set.size !== lastSet.size || [...set].some((m) => !lastSet.has(m));
        assert.equal(firedCount - before, changed ? 1 : 0, `onServedModels fired ${firedCount - before}× for a ${changed ? '' : 'un'}changed set after ${JSON.stringify(op)}`);
        if (changed) assert.deepEqual(fired, set);
        lastSet = set;
        // eligibleFor, cached, against the reference, for every name.
        for (const model of [...MODELS, ...ADAPTERS, 'zz']) {
          const base = set.has(model) ? model : adapterRef.get(model);
          assert.deepEqual(pool.eligibleFor(model, now).map((e) => e.name), reference(pool, base, set, now), `eligibleFor(${model}) after ${JSON.stringify(op)}`);
          // setAsideFor: the rest of the model's servers (every server when any may take it), in configuration order.
          const named = set.size >= 2 && base !== undefined && set.has(base);
          const ofModel = pool.endpoints.filter((ep) => !named || ep.servedModel === undefined || ep.servedModel === base).map((e) => e.name);
          const eligibleNames = reference(pool, base, set, now);
          assert.deepEqual(pool.setAsideFor(model, now).map((e) => e.name), ofModel.filter((n) => !eligibleNames.includes(n)), `setAsideFor(${model}) after ${JSON.stringify(op)}`);
        }
      }
    }),
    { numRuns: 400 },
  );
});
