/**
 * On-demand profiles on the metrics port (`/debug/profile/cpu|heap?seconds=N`): a running gateway
 * profiles itself while it serves (the OpenAI client's requests show up in the CPU profile), one
 * profile at a time, bad windows refused with §5 errors; a client that hangs up, and a shutdown,
 * end a running profile rather than wait it out.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { request } from 'undici';
import { fleetConfig, gatewayFor, startFleet, type Fleet } from '../helpers/fleet.js';
import { until } from '../helpers/wait.js';
import { Profiler } from '../../src/admin/profiling.js';

interface CpuProfile {
  nodes: { id: number; callFrame: { functionName: string; url: string } }[];
  samples: number[];
  startTime: number;
  endTime: number;
}

async function get(url: string): Promise<{ status: number; headers: Record<string, unknown>; json: unknown }> {
  const r = await request(url);
  return { status: r.statusCode, headers: r.headers, json: await r.body.json() };
}

describe('/debug/profile', () => {
  let fleet: Fleet;
  before(async () => {
    fleet = await startFleet(2);
  });
  after(async () => {
    await fleet.close();
  });

  test('cpu: a profile of the gateway at work, as a .cpuprofile download', async () => {
    const client = new OpenAI({ baseURL: `${fleet.gw.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
    let stop = false;
    let served = 0;
    const traffic = (async () => {
      while (!stop) {
        const r = await client.chat.completions.create({ model: 'sim-model', messages: [{ role: 'user', content: `hello ${served}` }], max_tokens: 2 });
        assert.ok(r.choices.length > 0);
        served++;
      }
    })();
    const started = Date.now();
    const res = await get(`${fleet.gw.metricsUrl}/debug/profile/cpu?seconds=1.5`);
    stop = true;
    await traffic;
    assert.equal(res.status, 200);
    assert.ok(Date.now() - started >= 1400, 'the window is the one asked for');
    assert.match(String(res.headers['content-disposition']), /^attachment; filename="sluice-.*\.cpuprofile"$/);
    const prof = res.json as CpuProfile;
    assert.ok(prof.endTime - prof.startTime >= 1.4e6, `${prof.endTime - prof.startTime} µs`);
    assert.ok(prof.samples.length > 0 && prof.nodes.length > 0);
    assert.ok(served > 0);
    const proxyFrames = prof.nodes.filter((n) => n.callFrame.url.includes('/src/proxy/'));
    assert.ok(proxyFrames.length > 0, `the proxy's code is in the profile (${served} requests served meanwhile)`);
  });

  test('heap: a sampling heap profile, as a .heapprofile download', async () => {
    const res = await get(`${fleet.gw.metricsUrl}/debug/profile/heap?seconds=0.3`);
    assert.equal(res.status, 200);
    assert.match(String(res.headers['content-disposition']), /\.heapprofile"$/);
    const prof = res.json as { head: { callFrame: { functionName: string }; children: unknown[] }; samples: unknown[] };
    assert.equal(prof.head.callFrame.functionName, '(root)');
    assert.ok(Array.isArray(prof.head.children) && Array.isArray(prof.samples));
  });

  test('one profile at a time; a bad window is a 400; both answers are §5 errors', async () => {
    const running = get(`${fleet.gw.metricsUrl}/debug/profile/cpu?seconds=1`);
    await new Promise((r) => setTimeout(r, 100));
    for (const kind of ['cpu', 'heap']) {
      const busy = await get(`${fleet.gw.metricsUrl}/debug/profile/${kind}?seconds=1`);
      assert.equal(busy.status, 409);
      assert.match((busy.json as { error: { message: string } }).error.message, /a cpu profile is being taken already/);
      assert.equal((busy.json as { error: { type: string } }).error.type, 'ConflictError');
    }
    assert.equal((await running).status, 200);
    for (const seconds of ['0', '-1', 'abc', '301', '']) {
      const bad = await get(`${fleet.gw.metricsUrl}/debug/profile/cpu?seconds=${seconds}`);
      assert.equal(bad.status, 400, seconds);
      assert.match((bad.json as { error: { message: string } }).error.message, /seconds must be a number in \(0, 300\]/);
    }
    // Free again once done.
    assert.equal((await get(`${fleet.gw.metricsUrl}/debug/profile/heap?seconds=0.1`)).status, 200);
  });
});

describe('/debug/profile: profiles that end early', () => {
  test('a client that hangs up ends its profile: the next one is not refused', async () => {
    const fleet = await startFleet(1);
    try {
      const gone = new AbortController();
      const first = request(`${fleet.gw.metricsUrl}/debug/profile/cpu?seconds=60`, { signal: gone.signal }).catch(() => 'aborted');
      await new Promise((r) => setTimeout(r, 200));
      gone.abort();
      assert.equal(await first, 'aborted');
      // Without the hang-up ending it, every request would get a 409 for a minute.
      await until(async () => (await get(`${fleet.gw.metricsUrl}/debug/profile/heap?seconds=0.1`)).status === 200, 10_000, 'a new profile is taken');
    } finally {
      await fleet.close();
    }
  });

  test('stopAll ends a profile that is still starting (a shutdown then does not wait out its window)', async () => {
    const profiler = new Profiler();
    const started = Date.now();
    const taking = profiler.take('cpu', 60);
    profiler.stopAll(); // the profiler is still being enabled
    const prof = (await taking) as CpuProfile;
    assert.ok(Date.now() - started < 20_000, 'not the 60 s window');
    assert.ok(prof.endTime >= prof.startTime);
    // And it is free again.
    assert.ok(await profiler.take('heap', 0.05));
  });
});

describe('/debug/profile and shutdown', () => {
  test('a drain ends a running profile: the answer has what was sampled, the gateway stops at once', async () => {
    const fleet = await startFleet(1);
    try {
      const pending = get(`${fleet.gw.metricsUrl}/debug/profile/cpu?seconds=40`);
      await new Promise((r) => setTimeout(r, 200));
      const closing = Date.now();
      await fleet.gw.close();
      assert.ok(Date.now() - closing < 20_000, 'not the 40 s of the profile');
      const res = await pending;
      assert.equal(res.status, 200);
      const prof = res.json as CpuProfile;
      assert.ok(prof.endTime - prof.startTime < 20e6);
    } finally {
      await fleet.close();
    }
  });
});

describe('server.profiling: false', () => {
  test('the profile routes answer 404 saying why; the rest of /debug stays', async () => {
    const gw = await gatewayFor(fleetConfig([], '', '\n  profiling: false'));
    try {
      for (const kind of ['cpu', 'heap']) {
        const res = await get(`${gw.metricsUrl}/debug/profile/${kind}?seconds=1`);
        assert.equal(res.status, 404);
        assert.match((res.json as { error: { message: string } }).error.message, /profiling is off \(server\.profiling: false\)/);
      }
      assert.equal((await get(`${gw.metricsUrl}/debug/pool`)).status, 200);
    } finally {
      await gw.close();
    }
  });
});
