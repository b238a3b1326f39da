/**
 * The alert rules the chart ships (charts/sluice/alerts/sluice-alerts.yaml, which operations.md's
 * "Alerts worth setting" describes): a rules file promtool accepts, over metrics Sluice exposes,
 * that fire when they should (promtool test rules, test/fixtures/sluice-alerts.test.yaml).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { GatewayMetrics } from '../../src/metrics/metrics.js';
import { checkRules, runPromtool } from '../helpers/promtool.js';

const RULES = new URL('../../charts/sluice/alerts/sluice-alerts.yaml', import.meta.url);
const rules = readFileSync(RULES, 'utf8');
const alertNames = (parse(rules) as { groups: { rules: { alert: string }[] }[] }).groups.flatMap((g) => g.rules.map((r) => r.alert));

test('the alert rules use only metrics Sluice exposes', async () => {
  const text = await new GatewayMetrics({ poolName: 'alerts-test', pool: () => ({ endpoints: [] }), defaultMetrics: false }).text();
  const families = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]!));
  const used = [...new Set([...rules.matchAll(/\b((?:llm_d_epp|sluice)_[a-zA-Z0-9_]+)/g)].map((m) => m[1]!))];
  assert.ok(used.length >= 10, `only ${used.length} metrics found in the rules`);
  const unknown = used.filter((n) => !families.has(n) && !families.has(n.replace(/_(bucket|sum|count)$/, '')));
  assert.deepEqual(unknown, []);
});

test("the alert rules file keeps to the lint's line length (the chart renders it into a PrometheusRule that CI lints with .yamllint.yaml)", () => {
  const max = Number(/max:\s*(\d+)/.exec(readFileSync(new URL('../../.yamllint.yaml', import.meta.url), 'utf8'))![1]);
  // Rendered inside the PrometheusRule one level deeper: two more columns.
  const long = rules.split('\n').flatMap((l, i) => (l.length + 2 > max ? [`line ${i + 1}: ${l.length + 2} > ${max}`] : []));
  assert.deepEqual(long, []);
});

test('the alert rules pass promtool check rules', (t) => {
  checkRules(t, rules, alertNames.length);
});

test('the alert rules fire when they should (promtool test rules)', (t) => {
  const run = runPromtool(t, ['test', 'rules', fileURLToPath(new URL('../fixtures/sluice-alerts.test.yaml', import.meta.url))]);
  if (run === undefined) return;
  assert.equal(run.status, 0, `${run.stdout}${run.stderr}`);
});

test('operations.md describes every alert the chart ships', () => {
  const doc = readFileSync(new URL('../../docs/operations.md', import.meta.url), 'utf8');
  const section = doc.slice(doc.indexOf('## Alerts worth setting'), doc.indexOf('## Troubleshooting'));
  assert.deepEqual(
    alertNames.filter((name) => !section.includes(`\`${name}\``)),
    [],
  );
});
