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
