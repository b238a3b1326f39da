/**
 * The alert rules operations.md offers ("Alerts worth setting") are what it says: a rules file
 * promtool accepts, over metrics Sluice exposes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { GatewayMetrics } from '../../src/metrics/metrics.js';

const doc = readFileSync(new URL('../../docs/operations.md', import.meta.url), 'utf8');
const section = doc.slice(doc.indexOf('## Alerts worth setting'));
const rules = /```yaml\n([\s\S]*?)```/.exec(section)?.[1] ?? '';

test('operations.md\'s alert rules use only metrics Sluice exposes', async () => {
  const text = await new GatewayMetrics({ poolName: 'alerts-test', pool: () => ({ endpoints: [] }), defaultMetrics: false }).text();
  const families = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]!));
  const used = [...new Set([...rules.matchAll(/\b((?:llm_d_epp|sluice)_[a-zA-Z0-9_]+)/g)].map((m) => m[1]!))];
  assert.ok(used.length >= 10, `only ${used.length} metrics found in the rules`);
  const unknown = used.filter((n) => !families.has(n) && !families.has(n.replace(/_(bucket|sum|count)$/, '')));
  assert.deepEqual(unknown, []);
});

test('operations.md\'s alert rules pass promtool check rules', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-alerts-'));
  try {
    const file = join(dir, 'rules.yaml');
    writeFileSync(file, rules);
    const run = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
    if ((run.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') {
      const advice = 'promtool not found: install the Debian `prometheus` package (apt-get install -y --no-install-recommends prometheus)';
      if (process.env.CI !== undefined && process.env.CI !== '') assert.fail(advice);
      t.skip(`${advice}; skipped locally, CI fails here`);
      return;
    }
    if (run.error) throw run.error;
    assert.equal(run.status, 0, `promtool check rules failed:\n${run.stdout}${run.stderr}`);
    assert.match(run.stdout, /SUCCESS: \d+ rules found/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
