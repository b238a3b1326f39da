/** startAllOrNone: the demo's fleet starts whole or not at all (nothing left listening). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { startAllOrNone } from '../src/demo.js';
import { startSimulator } from '../src/sim/server.js';

test('startAllOrNone returns the servers in order, or closes those that started and throws the failure', async () => {
  const closed: string[] = [];
  const server = (name: string) => ({ name, close: async () => void closed.push(name) });
  const all = await startAllOrNone([Promise.resolve(server('a')), Promise.resolve(server('b'))]);
  assert.deepEqual(all.map((s) => s.name), ['a', 'b']);
  assert.deepEqual(closed, []);

  // A real busy port: the simulators that did start are closed before the EADDRINUSE surfaces.
  const busy = createServer();
  await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
  const busyPort = (busy.address() as { port: number }).port;
  const sims: Awaited<ReturnType<typeof startSimulator>>[] = [];
  const sim = (port: number) => startSimulator({ host: '127.0.0.1', port, name: `s${port}`, model: 'm' }).then((s) => (sims.push(s), s));
  try {
    await assert.rejects(startAllOrNone([sim(0), sim(busyPort), sim(0)]), { code: 'EADDRINUSE' });
    assert.equal(sims.length, 2);
    for (const s of sims) {
      const released = await new Promise<boolean>((resolve) => {
        const probe = createServer().once('error', () => resolve(false));
        probe.listen(s.port, '127.0.0.1', () => probe.close(() => resolve(true)));
      });
      assert.ok(released, `port ${s.port} was released`);
    }
  } finally {
    busy.close();
  }
});
