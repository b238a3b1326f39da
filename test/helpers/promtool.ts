/**
 * Runs `promtool` (the Debian `prometheus` package). Without it the test is skipped locally and fails
 * in CI (`CI` set), which installs it: a check that silently never runs would prove nothing.
 */
import assert from 'node:assert/strict';
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';

/** promtool's result, or undefined when it is not installed (the test is then skipped). */
export function runPromtool(t: TestContext, args: string[], input?: string): SpawnSyncReturns<string> | undefined {
  const run = spawnSync('promtool', args, { input, encoding: 'utf8' });
  if ((run.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') {
    const advice = 'promtool not found: install the Debian `prometheus` package (apt-get install -y --no-install-recommends prometheus)';
    if (process.env.CI !== undefined && process.env.CI !== '') assert.fail(advice);
    t.skip(`${advice}; skipped locally, CI fails here`);
    return undefined;
  }
  if (run.error) throw run.error;
  return run;
}

/** `promtool check rules` on a rules file's text; asserts success and `SUCCESS: <count> rules found`. */
export function checkRules(t: TestContext, rules: string, count?: number): void {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-rules-'));
  try {
    const file = join(dir, 'rules.yaml');
    writeFileSync(file, rules);
    const run = runPromtool(t, ['check', 'rules', file]);
    if (run === undefined) return;
    assert.equal(run.status, 0, `promtool check rules failed:\n${run.stdout}${run.stderr}`);
    assert.match(run.stdout, new RegExp(`SUCCESS: ${count ?? '\\d+'} rules found`));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
