/**
 * A scheduling simulation without servers: the default profile (queue ×2, kv ×2, prefix ×3,
 * max-score-picker, utilization-detector filter) over 4 equal endpoints, with Sluice's in-flight
 * count incremented on every pick and, in the loaded variant, scraped metrics that follow the load.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { SluiceConfig } from '../../src/config/types.js';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import type { Scheduler } from '../../src/scheduling/scheduler.js';
import { ManualClock, seededRandom } from '../../src/util/clock.js';
import { makeDeps, makeEndpoint, makeRequest, tally } from './helpers.js';

function defaultConfig(): SluiceConfig {
  const plugins = ['queue-scorer', 'kv-cache-utilization-scorer', 'prefix-cache-scorer', 'single-profile-handler', 'max-score-picker', 'utilization-detector'];
  return {
    plugins: plugins.map((type) => ({ type, name: type, parameters: {} })),
    schedulingProfiles: [
      {
        name: 'default',
        plugins: [
          { pluginRef: 'queue-scorer', weight: 2 },
          { pluginRef: 'kv-cache-utilization-scorer', weight: 2 },
          { pluginRef: 'prefix-cache-scorer', weight: 3 },
          { pluginRef: 'max-score-picker' },
          { pluginRef: 'utilization-detector' },
        ],
      },
    ],
    flowControl: { saturationDetector: { pluginRef: 'utilization-detector' } },
  } as unknown as SluiceConfig; // only the sections buildScheduling reads
}

function words(seed: number, length: number): string {
  const random = seededRandom(seed);
  const vocabulary = ['the', 'model', 'server', 'cache', 'prefix', 'token', 'queue', 'gateway', 'request', 'answer'];
  let s = '';
  while (s.length < length) s += vocabulary[Math.floor(random() * vocabulary.length)] + ' ';
  return s.slice(0, length);
}

interface Fleet {
  clock: ManualClock;
  endpoints: Endpoint[];
  scheduler: Scheduler;
}

function fleet(seed: number): Fleet {
  const clock = new ManualClock();
  const endpoints = ['e0', 'e1', 'e2', 'e3'].map((n) => makeEndpoint(n, { waiting: 0, kv: 0 }, clock.now()));
  const { scheduler } = buildScheduling(defaultConfig(), builtinRegistry(), makeDeps({ clock, seed, endpoints }));
  return { clock, endpoints, scheduler };
}

function send(f: Fleet, prompt: string): Endpoint {
  const outcome = f.scheduler.schedule(makeRequest(prompt), f.endpoints);
  assert.ok(outcome.ok, 'scheduling failed');
  outcome.target.inFlight++;
  return outcome.target;
}

const FAIR_SHARE = 100; // 400 requests over 4 endpoints

describe('scheduling simulation (default profile, 4 equal endpoints)', () => {
  test('idle fleet, metrics unchanged: distinct prompts spread evenly by random tie-break', () => {
    for (const seed of [1, 2, 3]) {
      const f = fleet(seed);
      const picks: string[] = [];
      for (let i = 0; i < 400; i++) {
        f.clock.advance(1);
        for (const e of f.endpoints) e.metricsAt = f.clock.now(); // scrapes keep coming, values unchanged
        picks.push(send(f, `request ${i}: ${words(1000 + i, 400)}`).name);
      }
      const counts = tally(picks);
      for (const e of f.endpoints) {
        const n = counts.get(e.name) ?? 0;
        assert.ok(n <= 2 * FAIR_SHARE && n >= FAIR_SHARE / 2, `seed ${seed}: ${e.name} got ${n}/400`);
        assert.equal(e.inFlight, n);
      }
    }
  });

  test('loaded fleet: metrics follow in-flight load; spread stays even and a repeated long prompt sticks', () => {
    const f = fleet(42);
    const SLOTS = 4;
    const HOLD_TICKS = 20;
    const finishing: { at: number; endpoint: Endpoint }[] = [];
    const scrape = () => {
      for (const e of f.endpoints) {
        e.metrics = { waiting: Math.max(0, e.inFlight - SLOTS), running: Math.min(e.inFlight, SLOTS), kvUsage: Math.min(1, e.inFlight * 0.02) };
        e.metricsAt = f.clock.now();
        e.inFlightAtScrape = e.inFlight; // as pool.recordScrape does
      }
    };
    const tick = (t: number, prompt: string): Endpoint => {
      f.clock.advance(5);
      while (finishing.length > 0 && finishing[0]!.at <= t) finishing.shift()!.endpoint.inFlight--;
      if (t % 2 === 0) scrape(); // scrapes lag the picks
      const target = send(f, prompt);
      finishing.push({ at: t + HOLD_TICKS, endpoint: target });
      return target;
    };

    const longPrompt = `You are a helpful assistant. ${words(7, 4000)}`;
    const distinct: string[] = [];
    const repeated: string[] = [];
    const sharedPrefix: string[] = [];
    for (let t = 0; t < 400; t++) {
      if (t % 20 === 10) repeated.push(tick(t, longPrompt).name);
      else if (t % 40 === 35) sharedPrefix.push(tick(t, `${longPrompt} Question ${t}: ${words(t, 200)}`).name);
      else distinct.push(tick(t, `request ${t}: ${words(5000 + t, 600)}`).name);
    }

    const counts = tally(distinct);
    const fair = distinct.length / 4;
    for (const e of f.endpoints) {
      const n = counts.get(e.name) ?? 0;
      assert.ok(n <= 2 * fair, `${e.name} got ${n} of ${distinct.length} distinct prompts`);
    }
    // The first send teaches the index; every repeat and every prompt sharing the long prefix follows it.
    assert.equal(new Set(repeated).size, 1, `repeated prompt went to ${[...tally(repeated)]}`);
    assert.deepEqual(new Set(sharedPrefix), new Set(repeated));
  });
});
