/** The `/v1/models` cache (proxy/models.ts): per authorization value, a few seconds, at most 64 values. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Upstreams } from '../../src/proxy/upstreams.js';
import { ModelsCache } from '../../src/proxy/models.js';
import { ManualClock } from '../../src/util/clock.js';
import { makeEndpoint } from '../scheduling/helpers.js';

/** An upstream that lists one model and counts the requests, by authorization value. */
function countingUpstreams() {
  const asked: string[] = [];
  const upstreams = {
    get: () => ({
      request: async (opts: { headers: Record<string, string> }) => {
        asked.push(opts.headers.authorization ?? '');
        return { statusCode: 200, body: { text: async () => JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] }) } };
      },
    }),
  } as unknown as Upstreams;
  return { asked, upstreams };
}

test('answers are cached per authorization value for the TTL; past 64 values the cache starts over', async () => {
  const clock = new ManualClock();
  const { asked, upstreams } = countingUpstreams();
  const cache = new ModelsCache(() => [makeEndpoint('a')], upstreams, clock, 5000);
  const key = (i: number) => `Bearer key-${i}`;

  for (let i = 0; i < 64; i++) assert.equal((await cache.list(key(i), 'r')).status, 200);
  assert.equal(asked.length, 64);
  await cache.list(key(0), 'r');
  await cache.list(key(63), 'r');
  assert.equal(asked.length, 64, 'all 64 still cached');

  await cache.list(key(64), 'r'); // a 65th value: the cache starts over with it
  assert.equal(asked.length, 65);
  await cache.list(key(64), 'r');
  assert.equal(asked.length, 65, 'the newest is cached');
  await cache.list(key(0), 'r');
  assert.equal(asked.at(-1), key(0), 'the older ones were dropped');

  clock.advance(5000);
  await cache.list(key(64), 'r');
  assert.equal(asked.at(-1), key(64), 'expired after the TTL');
});

test('the list is merged in configuration order, whichever server answers first', async () => {
  // The first server answers last; both list `shared`, each with its own owner.
  const lists: Record<string, { id: string; owned_by: string }[]> = {
    a: [{ id: 'only-a', owned_by: 'a' }, { id: 'shared', owned_by: 'a' }],
    b: [{ id: 'only-b', owned_by: 'b' }, { id: 'shared', owned_by: 'b' }],
  };
  const upstreams = {
    get: (ep: { name: string }) => ({
      request: async () => {
        await new Promise((r) => setTimeout(r, ep.name === 'a' ? 30 : 0));
        return { statusCode: 200, body: { text: async () => JSON.stringify({ object: 'list', data: lists[ep.name] }) } };
      },
    }),
  } as unknown as Upstreams;
  const cache = new ModelsCache(() => [makeEndpoint('a'), makeEndpoint('b')], upstreams, new ManualClock(), 0);
  const data = (JSON.parse((await cache.list(undefined, 'r')).body) as { data: { id: string; owned_by: string }[] }).data;
  assert.deepEqual(data.map((m) => `${m.id}/${m.owned_by}`), ['only-a/a', 'shared/a', 'only-b/b']);
});
