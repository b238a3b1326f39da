import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { handleSignals, type SignalTarget } from '../../src/util/signals.js';

const quiet = { info() {}, warn() {} };

class FakeProcess extends EventEmitter implements SignalTarget {
  exits: number[] = [];
  exit(code: number) {
    this.exits.push(code);
  }
  send(signal: NodeJS.Signals) {
    // A signal nobody listens for takes its default action: for these three, the process dies.
    if (this.listenerCount(signal) === 0) throw new Error(`${signal} would kill the process`);
    this.emit(signal);
  }
}

const settle = () => new Promise((r) => setImmediate(r));

test('a SIGHUP before the gateway is up neither kills the process nor is lost: it reloads once ready', () => {
  const proc = new FakeProcess();
  const signals = handleSignals(quiet, { hangup: true, target: proc });
  proc.send('SIGHUP');
  proc.send('SIGHUP');
  let reloads = 0;
  signals.ready({ stop: async () => {}, reload: () => reloads++ });
  assert.equal(reloads, 1, 'held SIGHUPs collapse into one reload');
  proc.send('SIGHUP');
  assert.equal(reloads, 2);
  assert.deepEqual(proc.exits, []);
});

test('SIGTERM before the gateway is up drains once it is, then exits 0', async () => {
  const proc = new FakeProcess();
  const signals = handleSignals(quiet, { hangup: true, target: proc });
  proc.send('SIGTERM');
  await settle();
  assert.deepEqual(proc.exits, [], 'nothing to drain yet: no exit before ready');
  let stops = 0;
  let reloads = 0;
  signals.ready({ stop: async () => void stops++, reload: () => reloads++ });
  await settle();
  assert.equal(stops, 1);
  assert.deepEqual(proc.exits, [0]);
  proc.send('SIGHUP');
  assert.equal(reloads, 0, 'no reload while draining');
});

test('a second stop signal exits 2 at once (not 1: that is bad config or arguments); a failed drain exits 2', async () => {
  const proc = new FakeProcess();
  handleSignals(quiet, { target: proc }).ready({ stop: () => new Promise(() => {}) });
  proc.send('SIGINT');
  proc.send('SIGTERM');
  assert.deepEqual(proc.exits, [2]);

  const failing = new FakeProcess();
  handleSignals(quiet, { target: failing }).ready({ stop: () => Promise.reject(new Error('stuck')) });
  failing.send('SIGTERM');
  await settle();
  assert.deepEqual(failing.exits, [2]);
});

test('without hangup, SIGHUP keeps its default action (the demo ends with its terminal)', () => {
  const proc = new FakeProcess();
  handleSignals(quiet, { target: proc }).ready({ stop: async () => {} });
  assert.throws(() => proc.send('SIGHUP'), /would kill/);
});
