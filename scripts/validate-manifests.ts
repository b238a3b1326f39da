/**
 * Validates rendered Kubernetes manifests (the output of `helm template`), one multi-document YAML
 * file per run:
 *
 *   npx tsx scripts/validate-manifests.ts rendered.yaml [--config-out config.yaml]
 *
 * 1. Schema: every object is validated against the Kubernetes OpenAPI schema of its
 *    apiVersion/kind with kubernetes-models (4.x; `new Model(obj).validate()`): types, required
 *    fields, formats. Note: those schemas do not forbid unknown fields, so a misspelt optional key is
 *    not caught here (the cross-checks below catch the ones that matter for this chart).
 * 2. ServiceMonitor (a Prometheus Operator CRD, not in kubernetes-models): a minimal structural check
 *    of the fields this chart sets (selector.matchLabels, endpoints[].port/path/interval/scrapeTimeout).
 *    PrometheusRule (the same): groups with named rules that have an expr, and its spec is the chart's
 *    alerts/sluice-alerts.yaml, unchanged.
 * 3. Cross-object checks: the Deployment selector matches its pod labels; the Service, the
 *    PodDisruptionBudget and the ServiceMonitor select those pods / that Service; Service targetPorts
 *    and probe ports name container ports; the mounted ConfigMap exists and has config.yaml; the
 *    container ports equal config.server.port / metricsPort of that config.yaml; the pod runs as
 *    non-root with a read-only root filesystem and drops ALL capabilities; the termination grace
 *    period is longer than preStop + config.server.shutdownGracePeriod; a config checksum annotation
 *    is present.
 * With --config-out, the ConfigMap's config.yaml is written there (for `sluice validate`).
 * Exit 0 when everything passes, 1 otherwise (every problem is printed).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { parseAllDocuments, parse as parseYaml } from 'yaml';

type Obj = Record<string, any>;

const args = process.argv.slice(2);
const file = args.find((a) => !a.startsWith('--'));
const configOutIdx = args.indexOf('--config-out');
const configOut = configOutIdx >= 0 ? args[configOutIdx + 1] : undefined;
if (!file || (configOutIdx >= 0 && !configOut)) {
  console.error('usage: tsx scripts/validate-manifests.ts RENDERED.yaml [--config-out FILE]');
  process.exit(2);
}

const problems: string[] = [];
const fail = (where: string, msg: string) => problems.push(`${where}: ${msg}`);
const ok = (msg: string) => console.log(`  ok    ${msg}`);

// ---- parse ------------------------------------------------------------------------------------
const objects: Obj[] = [];
for (const doc of parseAllDocuments(readFileSync(file, 'utf8'))) {
  if (doc.errors.length) {
    for (const e of doc.errors) fail(file, `YAML: ${e.message}`);
    continue;
  }
  const o = doc.toJSON();
  if (o === null || o === undefined) continue; // empty document (a disabled template)
  if (typeof o !== 'object' || Array.isArray(o)) {
    fail(file, `a document is not a mapping: ${JSON.stringify(o).slice(0, 80)}`);
    continue;
  }
  objects.push(o);
}
if (objects.length === 0) fail(file, 'no Kubernetes objects found');

const id = (o: Obj) => `${o.kind ?? '?'}/${o.metadata?.name ?? '?'}`;

// ---- 1 + 2. schemas ---------------------------------------------------------------------------
function modulePath(apiVersion: string): string {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  return group === '' ? `kubernetes-models/${version}` : `kubernetes-models/${group}/${version}`;
}

function checkServiceMonitor(o: Obj): string[] {
  const errs: string[] = [];
  const spec = o.spec;
  const isMap = (v: unknown) => typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isMap(o.metadata) || typeof o.metadata.name !== 'string' || !o.metadata.name) errs.push('metadata.name is required');
  if (!isMap(spec)) return [...errs, 'spec must be an object'];
  if (!isMap(spec.selector)) errs.push('spec.selector must be an object');
  else if (spec.selector.matchLabels !== undefined && !isMap(spec.selector.matchLabels)) errs.push('spec.selector.matchLabels must be an object');
  if (!Array.isArray(spec.endpoints) || spec.endpoints.length === 0) errs.push('spec.endpoints must be a non-empty array');
  else
    spec.endpoints.forEach((ep: Obj, i: number) => {
      if (!isMap(ep)) return errs.push(`spec.endpoints[${i}] must be an object`);
      if (typeof ep.port !== 'string' && ep.targetPort === undefined) errs.push(`spec.endpoints[${i}]: port (a Service port name) is required`);
      if (ep.path !== undefined && (typeof ep.path !== 'string' || !ep.path.startsWith('/'))) errs.push(`spec.endpoints[${i}].path must start with /`);
      for (const k of ['interval', 'scrapeTimeout'])
        if (ep[k] !== undefined && !/^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$/.test(String(ep[k])))
          errs.push(`spec.endpoints[${i}].${k} must be a Prometheus duration, got ${JSON.stringify(ep[k])}`);
    });
  if (spec.namespaceSelector !== undefined && !isMap(spec.namespaceSelector)) errs.push('spec.namespaceSelector must be an object');
  return errs;
}

/** The chart's alert rules file, parsed: a PrometheusRule renders it unchanged. */
const SHIPPED_RULES = parseYaml(readFileSync(new URL('../charts/sluice/alerts/sluice-alerts.yaml', import.meta.url), 'utf8'));

function checkPrometheusRule(o: Obj): string[] {
  const errs: string[] = [];
  const groups = o.spec?.groups;
  if (typeof o.metadata?.name !== 'string' || !o.metadata.name) errs.push('metadata.name is required');
  if (!Array.isArray(groups) || groups.length === 0) return [...errs, 'spec.groups must be a non-empty array'];
  groups.forEach((g: Obj, i: number) => {
    if (typeof g?.name !== 'string' || !g.name) errs.push(`spec.groups[${i}].name is required`);
    if (!Array.isArray(g?.rules) || g.rules.length === 0) return errs.push(`spec.groups[${i}].rules must be a non-empty array`);
    g.rules.forEach((r: Obj, j: number) => {
      if (typeof r?.alert !== 'string' && typeof r?.record !== 'string') errs.push(`spec.groups[${i}].rules[${j}]: alert or record is required`);
      if (typeof r?.expr !== 'string' || !r.expr) errs.push(`spec.groups[${i}].rules[${j}].expr is required`);
    });
  });
  if (!isDeepStrictEqual(o.spec, SHIPPED_RULES)) errs.push('spec differs from charts/sluice/alerts/sluice-alerts.yaml');
  return errs;
}

for (const o of objects) {
  if (typeof o.apiVersion !== 'string' || typeof o.kind !== 'string') {
    fail(id(o), 'apiVersion and kind are required strings');
    continue;
  }
  if (o.apiVersion === 'monitoring.coreos.com/v1' && o.kind === 'PrometheusRule') {
    const errs = checkPrometheusRule(o);
    errs.forEach((e) => fail(id(o), e));
    if (!errs.length) ok(`${o.apiVersion} ${id(o)} (minimal CRD check; its rules are alerts/sluice-alerts.yaml, unchanged)`);
    continue;
  }
  if (o.apiVersion === 'monitoring.coreos.com/v1' && o.kind === 'ServiceMonitor') {
    const errs = checkServiceMonitor(o);
    errs.forEach((e) => fail(id(o), e));
    if (!errs.length) ok(`${o.apiVersion} ${id(o)} (minimal CRD check: not in kubernetes-models)`);
    continue;
  }
  let mod: Obj;
  try {
    mod = await import(modulePath(o.apiVersion));
  } catch {
    fail(id(o), `no kubernetes-models module for apiVersion ${o.apiVersion}`);
    continue;
  }
  const Model = mod[o.kind];
  if (typeof Model !== 'function') {
    fail(id(o), `kubernetes-models has no ${o.kind} in ${o.apiVersion}`);
    continue;
  }
  try {
    new Model(o).validate();
    ok(`${o.apiVersion} ${id(o)} (schema)`);
  } catch (e) {
    fail(id(o), `schema: ${(e as Error).message}`);
  }
}

// ---- 3. cross-object checks -------------------------------------------------------------------
const byKind = (kind: string) => objects.filter((o) => o.kind === kind);
const matches = (selector: Obj | undefined, labels: Obj | undefined) =>
  !!selector && Object.keys(selector).length > 0 && Object.entries(selector).every(([k, v]) => labels?.[k] === v);

/** Go duration -> seconds (the subset Sluice accepts). */
function durationSeconds(v: unknown): number {
  if (v === 0 || v === '0') return 0;
  const s = String(v).replace(/^\+/, '');
  const scale: Record<string, number> = { ns: 1e-9, us: 1e-6, 'µs': 1e-6, 'μs': 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 };
  const terms = [...s.matchAll(/([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)/g)];
  if (!terms.length || terms.map((t) => t[0]).join('') !== s) return NaN;
  return terms.reduce((sum, t) => sum + Number(t[1]) * scale[t[2]], 0);
}

const deployments = byKind('Deployment');
if (deployments.length !== 1) fail(file, `expected exactly one Deployment, found ${deployments.length}`);
const configMaps = byKind('ConfigMap');
const services = byKind('Service');

for (const d of deployments) {
  const where = id(d);
  const podLabels = d.spec?.template?.metadata?.labels ?? {};
  const selector = d.spec?.selector?.matchLabels;
  if (matches(selector, podLabels)) ok(`${where}: selector matches the pod labels`);
  else fail(where, 'spec.selector.matchLabels does not match spec.template.metadata.labels');

  const pod = d.spec?.template?.spec ?? {};
  const containers: Obj[] = pod.containers ?? [];
  const c = containers[0] ?? {};
  const ports = new Map<string, number>((c.ports ?? []).map((p: Obj) => [p.name, p.containerPort]));

  for (const probe of ['livenessProbe', 'readinessProbe']) {
    const port = c[probe]?.httpGet?.port;
    if (port === undefined) fail(where, `${probe} with httpGet is required`);
    else if (typeof port === 'string' && !ports.has(port)) fail(where, `${probe} port "${port}" is not a container port name`);
    else ok(`${where}: ${probe} GET ${c[probe].httpGet.path} on port ${port}`);
  }
  if (c.livenessProbe?.httpGet?.path !== '/health') fail(where, 'livenessProbe must GET /health');
  if (c.readinessProbe?.httpGet?.path !== '/ready') fail(where, 'readinessProbe must GET /ready');

  const sc = c.securityContext ?? {};
  const psc = pod.securityContext ?? {};
  const nonRoot = (sc.runAsNonRoot ?? psc.runAsNonRoot) === true && (sc.runAsUser ?? psc.runAsUser ?? 1) !== 0;
  if (!nonRoot) fail(where, 'the container must run as non-root (runAsNonRoot: true, runAsUser != 0)');
  if (sc.readOnlyRootFilesystem !== true) fail(where, 'securityContext.readOnlyRootFilesystem must be true');
  if (!(sc.capabilities?.drop ?? []).includes('ALL')) fail(where, 'securityContext.capabilities.drop must include ALL');
  if (sc.allowPrivilegeEscalation !== false) fail(where, 'securityContext.allowPrivilegeEscalation must be false');
  if (nonRoot && sc.readOnlyRootFilesystem === true && (sc.capabilities?.drop ?? []).includes('ALL'))
    ok(`${where}: non-root, read-only root filesystem, capabilities drop ALL`);

  if (!d.spec?.template?.metadata?.annotations?.['checksum/config']) fail(where, 'pod annotation checksum/config is missing');

  // the ConfigMap behind /etc/sluice
  const mount = (c.volumeMounts ?? []).find((m: Obj) => m.mountPath === '/etc/sluice' || m.mountPath === '/etc/sluice/config.yaml');
  const volume = mount && (pod.volumes ?? []).find((v: Obj) => v.name === mount.name);
  const cmName = volume?.configMap?.name;
  const cm = configMaps.find((m) => m.metadata?.name === cmName);
  if (!cm) {
    fail(where, `no ConfigMap mounted at /etc/sluice (volume ${mount?.name ?? '?'} -> ConfigMap ${cmName ?? '?'} not rendered)`);
    continue;
  }
  const text = cm.data?.['config.yaml'];
  if (typeof text !== 'string') {
    fail(id(cm), 'data["config.yaml"] is missing');
    continue;
  }
  let cfg: Obj;
  try {
    cfg = (parseYaml(text) ?? {}) as Obj;
  } catch (e) {
    fail(id(cm), `config.yaml is not YAML: ${(e as Error).message}`);
    continue;
  }
  if (configOut) {
    writeFileSync(configOut, text);
    ok(`${id(cm)}: config.yaml written to ${configOut}`);
  }
  const apiPort = cfg.server?.port ?? 8080;
  const metricsPort = cfg.server?.metricsPort ?? 9090;
  if (ports.get('http') === apiPort && ports.get('metrics') === metricsPort)
    ok(`${where}: container ports http=${apiPort} metrics=${metricsPort} follow config.server`);
  else fail(where, `container ports ${JSON.stringify(Object.fromEntries(ports))} differ from config.server port ${apiPort} / metricsPort ${metricsPort}`);

  const grace = durationSeconds(cfg.server?.shutdownGracePeriod ?? '30s');
  const preStop = Number(c.lifecycle?.preStop?.exec?.command?.[1] ?? 0);
  const tgps = pod.terminationGracePeriodSeconds;
  if (Number.isFinite(grace) && typeof tgps === 'number' && tgps > grace + preStop)
    ok(`${where}: terminationGracePeriodSeconds ${tgps} > preStop ${preStop}s + shutdownGracePeriod ${grace}s`);
  else fail(where, `terminationGracePeriodSeconds ${tgps} must exceed preStop ${preStop}s + config.server.shutdownGracePeriod (${cfg.server?.shutdownGracePeriod ?? '30s'})`);

  for (const s of services) {
    if (!matches(s.spec?.selector, podLabels)) {
      fail(id(s), 'spec.selector does not select the Deployment pods');
      continue;
    }
    const names = (s.spec?.ports ?? []).map((p: Obj) => p.name);
    for (const want of ['http', 'metrics']) if (!names.includes(want)) fail(id(s), `no port named ${want}`);
    for (const p of s.spec?.ports ?? [])
      if (typeof p.targetPort === 'string' && !ports.has(p.targetPort)) fail(id(s), `targetPort "${p.targetPort}" is not a container port name`);
    ok(`${id(s)}: selects the pods; ports ${names.join(', ')} -> container ports`);
  }
  for (const pdb of byKind('PodDisruptionBudget')) {
    if (matches(pdb.spec?.selector?.matchLabels, podLabels)) ok(`${id(pdb)}: selects the pods`);
    else fail(id(pdb), 'spec.selector.matchLabels does not select the Deployment pods');
    if ((pdb.spec?.minAvailable === undefined) === (pdb.spec?.maxUnavailable === undefined))
      fail(id(pdb), 'exactly one of minAvailable / maxUnavailable must be set');
  }
}
for (const sm of byKind('ServiceMonitor')) {
  const svc = services.find((s) => matches(sm.spec?.selector?.matchLabels, s.metadata?.labels));
  if (!svc) fail(id(sm), 'spec.selector.matchLabels selects no rendered Service');
  else {
    const missing = (sm.spec?.endpoints ?? []).filter((e: Obj) => !(svc.spec?.ports ?? []).some((p: Obj) => p.name === e.port));
    if (missing.length) fail(id(sm), `endpoint port(s) ${missing.map((e: Obj) => e.port).join(', ')} not named in ${id(svc)}`);
    else ok(`${id(sm)}: selects ${id(svc)}, port ${(sm.spec.endpoints as Obj[]).map((e) => e.port).join(', ')}`);
  }
}
if (configMaps.length === 0) fail(file, 'no ConfigMap rendered');

// ---- result -----------------------------------------------------------------------------------
for (const p of problems) console.log(`  FAIL  ${p}`);
console.log(`${objects.length} objects, ${problems.length} problem(s)`);
process.exit(problems.length ? 1 : 0);
