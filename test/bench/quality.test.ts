/** What the quality part derives from its per-request outcomes (no traffic). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { instancesPerPrompt } from '../../bench/lib/quality.js';

test('instances per prompt: those answering ≥ 10 % of a shared prompt\'s requests, averaged over the prompts', () => {
  const sent = (prompt: number, pods: Record<string, number>) =>
    Object.entries(pods).flatMap(([pod, n]) => Array.from({ length: n }, () => ({ prompt, pod })));
  const outcomes = [
    // prompt 0: pinned to one instance (the stray 1 of 20 is under 10 %)
    ...sent(0, { 'sim-0': 19, 'sim-1': 1 }),
    // prompt 1: spread over three (exactly 10 % counts)
    ...sent(1, { 'sim-1': 5, 'sim-2': 4, 'sim-3': 1 }),
    // distinct prompts and requests that got no answer do not count
    ...sent(-1, { 'sim-4': 7 }),
    ...sent(1, { '': 50 }),
  ];
  assert.equal(instancesPerPrompt(outcomes), 2);
  assert.equal(instancesPerPrompt(sent(-1, { 'sim-0': 3 })), undefined);
});
