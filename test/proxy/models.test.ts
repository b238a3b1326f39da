/** The `/v1/models` cache (proxy/models.ts): per authorization value, a few seconds, at most 64 values; at most 4 listings at once. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Upstreams } from '../../src/proxy/upstreams.js';
import { ModelsCache } from '../../src/proxy/models.js';
import { ManualClock } from '../../src/util/clock.js';
import { makeEndpoint } from '../scheduling/helpers.js';

/** An undici response body holding `text`, delivered in 64 KiB chunks; `destroyed` once the reader gave up. */
function bodyOf(text: string) {
  const bytes = Buffer.from(text);
  const body = {
    destroyed: false,
    read: 0,
    destroy() {
      body.destroyed = true;
    },
    async *[Symbol.asyncIterator]() {
      for (let i = 0; i < bytes.length && !body.destroyed; i += 65536) {
        body.read += Math.min(65536, bytes.length - i);
        yield bytes.subarray(i, i + 65536);
      }
    },
  };
  return body;
}

/** An upstream that lists one model and counts the requests, by authorization value. */
function countingUpstreams() {
  const asked: string[] = [];
  const upstreams = {
    get: () => ({
      request: async (opts: { headers: Record<string, string> }) => {
        asked.push(opts.headers.authorization ?? '');
        return { statusCode: 200, body: bodyOf(JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] })) };
      },
    }),
  } as unknown as Upstreams;
  return { asked, upstreams };
}

test('answers are cached per authorization value for the TTL; past 64 values the oldest goes, not all', async () => {
  const clock = new ManualClock();
  const { asked, upstreams } = countingUpstreams();
  const cache = new ModelsCache(() => [makeEndpoint('a')], upstreams, clock, 5000);
  const key = (i: number) => `Bearer key-${i}`;

  for (let i = 0; i < 64; i++) assert.equal((await cache.list(key(i), 'r')).status, 200);
  assert.equal(asked.length, 64);
  await cache.list(key(0), 'r');
  await cache.list(key(63), 'r');
  assert.equal(asked.length, 64, 'all 64 still cached');

  await cache.list(key(64), 'r'); // a 65th value: the oldest (key 0) makes room
  assert.equal(asked.length, 65);
  await cache.list(key(64), 'r');
  await cache.list(key(1), 'r');
  assert.equal(asked.length, 65, 'the newest and the others are cached');
  await cache.list(key(0), 'r');
  assert.equal(asked.at(-1), key(0), 'the oldest was dropped');

  clock.advance(5000);
  await cache.list(key(64), 'r');
  assert.equal(asked.at(-1), key(64), 'expired after the TTL');
});

test("a refusal of the client's key (a wrong key's 401) is cached as a list is; a server's 5xx or 429 is not", async () => {
  const clock = new ManualClock();
  let asked = 0;
  let status = 401;
  const upstreams = {
    get: () => ({
      request: async () => {
        asked++;
        return { statusCode: status, headers: { 'content-type': 'application/json' }, body: bodyOf('{"error":"Unauthorized"}') };
      },
    }),
  } as unknown as Upstreams;
  const cache = new ModelsCache(() => [makeEndpoint('a'), makeEndpoint('b')], upstreams, clock, 5000);
  for (let i = 0; i < 10; i++) assert.equal((await cache.list('Bearer wrong', 'r')).status, 401);
  assert.equal(asked, 2, 'each server asked once');
  for (const trouble of [503, 429]) {
    status = trouble;
    for (let i = 0; i < 3; i++) assert.equal((await cache.list(`Bearer other-${trouble}`, 'r')).status, trouble);
  }
  assert.equal(asked, 14, 'a server in trouble is asked again');
});

test('at most 4 listings ask the pool at once, the rest in turn; past 256 waiting, 503 at once', async () => {
  let running = 0;
  let most = 0;
  const release: (() => void)[] = [];
  const upstreams = {
    get: () => ({
      request: async () => {
        most = Math.max(most, ++running);
        await new Promise<void>((r) => release.push(r));
        running--;
        return { statusCode: 200, body: bodyOf('{"object":"list","data":[{"id":"m"}]}') };
      },
    }),
  } as unknown as Upstreams;
  const cache = new ModelsCache(() => [makeEndpoint('a')], upstreams, new ManualClock(), 5000);
  const answers = Array.from({ length: 4 + 256 }, (_, i) => cache.list(`Bearer k${i}`, 'r'));
  assert.deepEqual(await cache.list('Bearer one-too-many', 'r'), { status: 503, body: JSON.stringify({ error: { message: 'too many model listings in progress; try again', type: 'ServiceUnavailableError', param: null, code: 503 } }) });
  assert.equal(cache.list('Bearer k0', 'r'), answers[0], 'a value already asking shares its listing, whatever the queue');
  while (release.length > 0 || running > 0) {
    release.splice(0).forEach((go) => go());
    await new Promise((r) => setImmediate(r));
  }
  assert.ok((await Promise.all(answers)).every((a) => a.status === 200));
  assert.equal(most, 4);
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
        return { statusCode: 200, body: bodyOf(JSON.stringify({ object: 'list', data: lists[ep.name] })) };
      },
    }),
  } as unknown as Upstreams;
  const cache = new ModelsCache(() => [makeEndpoint('a'), makeEndpoint('b')], upstreams, new ManualClock(), 0);
  const data = (JSON.parse((await cache.list(undefined, 'r')).body) as { data: { id: string; owned_by: string }[] }).data;
  assert.deepEqual(data.map((m) => `${m.id}/${m.owned_by}`), ['only-a/a', 'shared/a', 'only-b/b']);
});

test('a server whose list is over 1 MiB contributes nothing, and no more of it is read (a hostile server cannot fill the heap)', async () => {
  const huge = bodyOf(JSON.stringify({ object: 'list', data: Array.from({ length: 60_000 }, (_, i) => ({ id: `model-${i}`, object: 'model' })) }));
  const upstreams = {
    get: (ep: { name: string }) => ({
      request: async () => ({ statusCode: 200, body: ep.name === 'a' ? huge : bodyOf('{"object":"list","data":[{"id":"m"}]}') }),
    }),
  } as unknown as Upstreams;
  const cache = new ModelsCache(() => [makeEndpoint('a'), makeEndpoint('b')], upstreams, new ManualClock(), 5000);
  const answer = await cache.list(undefined, 'r');
  assert.equal(answer.status, 200);
  assert.deepEqual((JSON.parse(answer.body) as { data: { id: string }[] }).data.map((m) => m.id), ['m']);
  assert.ok(huge.destroyed && huge.read <= (1 << 20) + 65536, `read ${huge.read} bytes`);
});
