import { test } from 'node:test';
import assert from 'node:assert/strict';
import { installEarlySignals, releaseEarlySignals } from '../../src/util/early-signals.js';
import { handleSignals } from '../../src/util/signals.js';

const SIGNALS = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;
const counts = () => SIGNALS.map((s) => process.listenerCount(s));

/** Runs `fn` with process.exit recording its code instead of exiting. */
function withExitRecorded(fn: () => void): number[] {
  const codes: number[] = [];
  const exit = process.exit;
  process.exit = ((code?: number) => void codes.push(code ?? 0)) as typeof process.exit;
  try {
    fn();
  } finally {
    process.exit = exit;
  }
  return codes;
}

test('start-up signals: SIGTERM and SIGINT end the process as their default action would (143, 130), SIGHUP is ignored; release removes them', () => {
  const before = counts();
  installEarlySignals();
  installEarlySignals(); // once only
  assert.deepEqual(counts(), before.map((n) => n + 1));
  assert.deepEqual(
    withExitRecorded(() => {
      process.emit('SIGTERM', 'SIGTERM');
      process.emit('SIGINT', 'SIGINT');
      process.emit('SIGHUP', 'SIGHUP');
    }),
    [143, 130],
  );
  releaseEarlySignals();
  releaseEarlySignals();
  assert.deepEqual(counts(), before);
});

test("a command's own handlers take over: handleSignals releases the start-up ones", () => {
  const before = SIGNALS.map((s) => process.listeners(s));
  installEarlySignals();
  handleSignals({ info: () => undefined, warn: () => undefined }, { hangup: true });
  // Its three handlers are in, the start-up ones out: one listener more per signal than before.
  assert.deepEqual(counts(), before.map((l) => l.length + 1));
  for (const [i, s] of SIGNALS.entries()) for (const l of process.listeners(s)) if (!before[i]!.includes(l)) process.off(s, l as () => void);
});
