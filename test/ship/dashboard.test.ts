/**
 * dashboards/sluice-grafana.json queries only what Sluice exposes: every `llm_d_epp_*` or `sluice_*` name in a
 * PromQL expression (panel targets and template variable queries) is a metric family that
 * GatewayMetrics renders, and every label the dashboard filters or groups by exists on that metric.
 * Plus the dashboard's own shape (schema version, datasource variable, saturation threshold line).
 */
import { test, describe, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Registry, collectDefaultMetrics } from 'prom-client';
import { GatewayMetrics } from '../../src/metrics/metrics.js';
import { checkRules } from '../helpers/promtool.js';

type Json = Record<string, any>;

const DASHBOARD_PATH = new URL('../../dashboards/sluice-grafana.json', import.meta.url);
const dashboard = JSON.parse(readFileSync(DASHBOARD_PATH, 'utf8')) as Json;

/** Labels Prometheus adds to every scraped series (target labels), usable on any metric. */
const TARGET_LABELS = new Set(['job', 'instance', 'namespace', 'pod', 'service', 'container']);

function allPanels(panels: Json[] = []): Json[] {
  return panels.flatMap((p) => [p, ...allPanels(p.panels)]);
}

interface Expr {
  where: string;
  expr: string;
}

function dashboardExpressions(d: Json): Expr[] {
  const out: Expr[] = [];
  for (const p of allPanels(d.panels)) {
    for (const t of p.targets ?? []) if (typeof t.expr === 'string') out.push({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr });
  }
  for (const v of d.templating?.list ?? []) {
    const q = typeof v.query === 'string' ? v.query : v.query?.query;
    if (v.type === 'query' && typeof q === 'string') out.push({ where: `variable $${v.name}`, expr: q });
  }
  return out;
}

interface MetricRef {
  series: string; // as written, e.g. llm_d_epp_request_ttft_seconds_bucket
  matcherLabels: string[];
}

/** `llm_d_epp_*` and `sluice_*` series referenced in an expression, with the labels of their own `{...}` matcher. */
function metricRefs(expr: string): MetricRef[] {
  const refs: MetricRef[] = [];
  for (const m of expr.matchAll(/\b((?:llm_d_epp|sluice)_[a-zA-Z0-9_:]+)\s*(\{[^}]*\})?/g)) {
    const matcherLabels = [...(m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)/g)].map((x) => x[1]);
    refs.push({ series: m[1], matcherLabels });
  }
  return refs;
}

/** Labels in `by (...)` / `without (...)` clauses, and the label argument of label_values(). */
function groupingLabels(expr: string): string[] {
  const labels: string[] = [];
  for (const m of expr.matchAll(/\b(?:by|without)\s*\(([^)]*)\)/g))
    labels.push(...m[1].split(',').map((s) => s.trim()).filter(Boolean));
  for (const m of expr.matchAll(/label_values\s*\([^,]*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)/g)) labels.push(m[1]);
  return labels;
}

describe('dashboards/sluice-grafana.json', () => {
  /** family name -> label names, for every family GatewayMetrics renders */
  const families = new Map<string, { type: string; labels: Set<string> }>();

  before(async () => {
    const m = new GatewayMetrics({ poolName: 'dashboard-test', pool: () => ({ endpoints: [] }), defaultMetrics: false });
    // prom-client's process and runtime metrics, which /metrics carries too (the gateway panels).
    const runtime = new Registry();
    collectDefaultMetrics({ register: runtime });
    for (const [registry, text] of [
      [m.registry, await m.text()],
      [runtime, await runtime.metrics()],
    ] as const) {
      for (const line of text.split('\n')) {
        const t = /^# TYPE (\S+) (\S+)$/.exec(line);
        if (!t) continue;
        const metric = registry.getSingleMetric(t[1]) as unknown as { labelNames?: readonly string[] } | undefined;
        families.set(t[1], { type: t[2], labels: new Set(metric?.labelNames ?? []) });
      }
    }
    runtime.clear();
  });

  /** Resolves a written series name to its family: itself, or a histogram/summary's _bucket/_sum/_count. */
  function family(series: string): { name: string; labels: Set<string> } | undefined {
    const direct = families.get(series);
    if (direct) return { name: series, labels: direct.labels };
    const m = /^(.*)_(bucket|sum|count)$/.exec(series);
    const base = m && families.get(m[1]);
    if (!m || !base || (base.type !== 'histogram' && base.type !== 'summary')) return undefined;
    const labels = new Set(base.labels);
    if (m[2] === 'bucket') labels.add('le');
    return { name: m[1], labels };
  }

  test('GatewayMetrics renders the llm_d_epp_* families (sanity of this test)', () => {
    const names = [...families.keys()].filter((n) => n.startsWith('llm_d_epp_'));
    assert.ok(names.length >= 20, `only ${names.length} llm_d_epp_* families rendered`);
    assert.equal(family('llm_d_epp_request_ttft_seconds_bucket')?.name, 'llm_d_epp_request_ttft_seconds');
    assert.equal(family('llm_d_epp_request_total_bucket'), undefined, '_bucket of a counter is not a series');
    assert.equal(family('llm_d_epp_no_such_metric'), undefined);
    assert.deepEqual(metricRefs('sum by (le) (rate(llm_d_epp_x_bucket{job=~"$job", stage!="global"}[5m]))'), [
      { series: 'llm_d_epp_x_bucket', matcherLabels: ['job', 'stage'] },
    ]);
  });

  test('every llm_d_epp_* and sluice_* name in a PromQL expression is a metric Sluice exposes', () => {
    const exprs = dashboardExpressions(dashboard);
    assert.ok(exprs.length >= 20, `only ${exprs.length} expressions found`);
    const unknown: string[] = [];
    let refs = 0;
    for (const { where, expr } of exprs) {
      for (const r of metricRefs(expr)) {
        refs++;
        if (!family(r.series)) unknown.push(`${where}: ${r.series}`);
      }
      // any other metric name (a typo of the prefix, a vllm:* series) is not Sluice's
      for (const m of expr.matchAll(/\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{|\[)/g))
        if (!/^(llm_d_epp|sluice)_/.test(m[1]) && !family(m[1]) && !/^(by|without|on|ignoring|group_left|group_right)$/.test(m[1]))
          unknown.push(`${where}: ${m[1]} (not a metric Sluice exposes)`);
    }
    assert.ok(refs >= 30, `only ${refs} metric references found`);
    assert.deepEqual(unknown, [], `metric names the dashboard uses but Sluice does not expose:\n${unknown.join('\n')}`);
  });


  test("a metric any process exports (prom-client's defaults) is joined to one only Sluice exports: $job = All matches every job", () => {
    const generic = dashboardExpressions(dashboard).filter(({ expr }) => /\b(process|nodejs)_[a-z0-9_]+\s*[{[(]/.test(expr));
    assert.ok(generic.length >= 2, 'the gateway CPU and event-loop lag panels');
    const unguarded = generic.filter(({ expr }) => !/\band on \(job, instance\) (llm_d_epp|sluice)_\w+/.test(expr)).map((e) => `${e.where}: ${e.expr}`);
    assert.deepEqual(unguarded, []);
  });
  test('labels filtered and grouped by exist on the metrics they apply to', () => {
    const problems: string[] = [];
    for (const { where, expr } of dashboardExpressions(dashboard)) {
      const refs = metricRefs(expr).map((r) => ({ ...r, fam: family(r.series) })).filter((r) => r.fam);
      for (const r of refs)
        for (const l of r.matcherLabels)
          if (!TARGET_LABELS.has(l) && !r.fam!.labels.has(l)) problems.push(`${where}: ${r.series} has no label "${l}"`);
      for (const l of groupingLabels(expr)) {
        if (TARGET_LABELS.has(l)) continue;
        for (const r of refs) if (!r.fam!.labels.has(l)) problems.push(`${where}: grouped by "${l}", which ${r.series} does not have`);
      }
    }
    assert.deepEqual(problems, [], problems.join('\n'));
  });

  test('covers the signals operators need (SPEC §9)', () => {
    const used = new Set(
      dashboardExpressions(dashboard).flatMap(({ expr }) => metricRefs(expr).map((r) => family(r.series)?.name ?? r.series)),
    );
    for (const name of [
      'llm_d_epp_flow_control_pool_saturation',
      'llm_d_epp_flow_control_stale_endpoints',
      'llm_d_epp_flow_control_queue_size',
      'llm_d_epp_flow_control_queue_bytes',
      'llm_d_epp_flow_control_requests_total',
      'llm_d_epp_flow_control_request_queue_duration_seconds',
      'llm_d_epp_request_total',
      'llm_d_epp_request_error_total',
      'llm_d_epp_request_ttft_seconds',
      'llm_d_epp_endpoint_inflight_requests',
      'llm_d_epp_per_endpoint_queue_size',
      'llm_d_epp_datalayer_poll_errors_total',
      'llm_d_epp_upstream_retries_total',
      'sluice_endpoint_first_byte_seconds',
      'sluice_endpoint_upstream_errors_total',
      'sluice_endpoint_kv_cache_usage_ratio',
      'sluice_request_cancelled_total',
      'sluice_request_rejected_total',
    ])
      assert.ok(used.has(name), `no panel uses ${name}`);

    const exprs = dashboardExpressions(dashboard).map((e) => e.expr);
    const grouped = (metric: string, label: string) =>
      exprs.some((e) => e.includes(metric) && groupingLabels(e).includes(label));
    assert.ok(grouped('llm_d_epp_flow_control_pool_saturation', 'stage'), 'saturation by stage');
    assert.ok(grouped('llm_d_epp_flow_control_queue_size', 'priority'), 'queue size by priority');
    assert.ok(grouped('llm_d_epp_flow_control_queue_bytes', 'priority'), 'queue bytes by priority');
    assert.ok(grouped('llm_d_epp_flow_control_requests_total', 'outcome'), 'flow-control outcomes');
    assert.ok(grouped('llm_d_epp_request_error_total', 'error_code'), 'errors by code');
    assert.ok(grouped('llm_d_epp_endpoint_inflight_requests', 'endpoint_name'), 'in-flight per endpoint');
    assert.ok(grouped('llm_d_epp_per_endpoint_queue_size', 'endpoint_name'), 'queue size per endpoint');
    assert.ok(grouped('sluice_endpoint_first_byte_seconds_bucket', 'endpoint_name'), 'first-byte latency per endpoint');
    assert.ok(grouped('sluice_endpoint_upstream_errors_total', 'error'), 'upstream errors by kind');
    assert.ok(grouped('sluice_request_cancelled_total', 'stage'), 'client cancels by stage');
    assert.ok(grouped('sluice_request_rejected_total', 'reason'), 'gateway refusals by reason');
    for (const h of ['llm_d_epp_request_ttft_seconds_bucket', 'llm_d_epp_flow_control_request_queue_duration_seconds_bucket'])
      for (const q of ['0.5', '0.9', '0.99'])
        assert.ok(exprs.some((e) => e.includes(`histogram_quantile(${q},`) && e.includes(h)), `${h} p${Number(q) * 100}`);
  });

  test('dashboard shape: schema version, datasource variable, threshold line at 1.0, unique ids', () => {
    assert.ok(dashboard.schemaVersion >= 36, `schemaVersion ${dashboard.schemaVersion} < 36`);
    assert.equal(typeof dashboard.uid, 'string');
    const dsVar = (dashboard.templating?.list ?? []).find((v: Json) => v.type === 'datasource');
    assert.ok(dsVar, 'no datasource template variable');
    assert.equal(dsVar.query, 'prometheus');
    const dsRef = `\${${dsVar.name}}`;

    const panels = allPanels(dashboard.panels);
    const ids = panels.map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length, 'panel ids must be unique');
    for (const p of panels.filter((p) => p.type !== 'row')) {
      assert.equal(p.datasource?.uid, dsRef, `panel "${p.title}" must use the ${dsRef} datasource`);
      assert.ok(p.targets?.length, `panel "${p.title}" has no queries`);
      for (const t of p.targets) assert.equal(t.datasource?.uid, dsRef, `panel "${p.title}" ${t.refId}`);
      const g = p.gridPos;
      assert.ok(g && g.x >= 0 && g.w > 0 && g.x + g.w <= 24, `panel "${p.title}" gridPos`);
    }
    for (const v of dashboard.templating.list.filter((v: Json) => v.type === 'query'))
      assert.equal(v.datasource?.uid, dsRef, `variable $${v.name} must use ${dsRef}`);

    const sat = panels.find(
      (p) => p.type === 'timeseries' && p.targets?.some((t: Json) => /pool_saturation/.test(t.expr) && /\bstage\b/.test(t.expr)),
    );
    assert.ok(sat, 'no saturation-by-stage time series');
    const steps: Json[] = sat.fieldConfig.defaults.thresholds.steps;
    assert.ok(steps.some((s) => s.value === 1), 'the saturation panel needs a threshold step at 1.0');
    assert.match(sat.fieldConfig.defaults.custom.thresholdsStyle.mode, /line/, 'threshold drawn as a line');
  });

  test('every expression is valid PromQL (promtool check rules)', (t) => {
    // Grafana variables -> PromQL: ranges to 5m, multi-value variables to a regex; label_values(sel, l) -> sel
    const toPromQL = (e: string) =>
      e
        .replace(/\$__rate_interval|\$__interval|\$__range/g, '5m')
        .replace(/\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?/g, '.*')
        .replace(/^label_values\s*\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$/s, '$1');
    const exprs = dashboardExpressions(dashboard);
    const rules = exprs.map((e, i) => `      - record: dashboard:expr_${i}\n        expr: ${JSON.stringify(toPromQL(e.expr))}`);
    checkRules(t, `groups:\n  - name: dashboard\n    rules:\n${rules.join('\n')}\n`, exprs.length);
  });
});

describe('charts/sluice/dashboards/sluice-grafana.json (the chart ships the dashboard)', () => {
  const CHART_COPY = new URL('../../charts/sluice/dashboards/sluice-grafana.json', import.meta.url);
  const TEMPLATE = new URL('../../charts/sluice/templates/dashboard-configmap.yaml', import.meta.url);

  test('is byte-identical to dashboards/sluice-grafana.json', () => {
    const source = readFileSync(DASHBOARD_PATH);
    const copy = readFileSync(CHART_COPY);
    assert.ok(
      copy.equals(source),
      'charts/sluice/dashboards/sluice-grafana.json differs from dashboards/sluice-grafana.json; ' +
        'run: cp dashboards/sluice-grafana.json charts/sluice/dashboards/sluice-grafana.json',
    );
  });

  test('templates/dashboard-configmap.yaml renders that file, behind dashboard.enabled, with the grafana_dashboard label', () => {
    const template = readFileSync(TEMPLATE, 'utf8');
    assert.match(template, /\.Files\.Get "dashboards\/sluice-grafana\.json"/);
    assert.match(template, /if \.Values\.dashboard\.enabled/);
    const values = readFileSync(new URL('../../charts/sluice/values.yaml', import.meta.url), 'utf8');
    assert.match(values, /^dashboard:\n {2}enabled: false\n/m, 'dashboard.enabled defaults to false');
    assert.match(values, /^ {4}grafana_dashboard: "1"$/m, 'default label grafana_dashboard: "1"');
  });
});
