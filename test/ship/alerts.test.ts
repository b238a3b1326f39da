/**
 * The alert rules operations.md offers ("Alerts worth setting") are what it says: a rules file
 * promtool accepts, over metrics Sluice exposes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { GatewayMetrics } from '../../src/metrics/metrics.js';
import { checkRules } from '../helpers/promtool.js';

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
  checkRules(t, rules);
});
