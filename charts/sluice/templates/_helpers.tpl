{{/*
Chart name, truncated to 63 characters (DNS label).
*/}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: release-chart, or the release name when it already contains the chart name.
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString .Values.image.tag)) }}
{{- end }}
{{- end }}

{{/*
The server section of the config (empty map when absent).
*/}}
{{- define "sluice.server" -}}
{{- $cfg := .Values.config | default dict }}
{{- toYaml (get $cfg "server" | default dict) }}
{{- end }}

{{/*
The server settings a running gateway cannot change (a live reload logs them and goes on without
them), for configRollout: reload.
*/}}
{{- define "sluice.restartOnlyServer" -}}
{{- $server := include "sluice.server" . | fromYaml }}
{{- pick $server "host" "port" "metricsPort" "requestHeadersTimeout" "requestTimeout" | toYaml }}
{{- end }}

{{/*
API and metrics ports: config.server.port / metricsPort, else Sluice's defaults 8080 / 9090.
Port 0 ("any free port") cannot be probed or exposed, so it is refused here.
*/}}
{{- define "sluice.apiPort" -}}
{{- $server := include "sluice.server" . | fromYaml }}
{{- $p := 8080 }}
{{- if not (kindIs "invalid" (index $server "port")) }}{{ $p = int (get $server "port") }}{{ end }}
{{- if or (lt $p 1) (gt $p 65535) }}
{{- fail (printf "config.server.port must be 1-65535 in Kubernetes (got %v)" (get $server "port")) }}
{{- end }}
{{- $p }}
{{- end }}

{{- define "sluice.metricsPort" -}}
{{- $server := include "sluice.server" . | fromYaml }}
{{- $p := 9090 }}
{{- if not (kindIs "invalid" (index $server "metricsPort")) }}{{ $p = int (get $server "metricsPort") }}{{ end }}
{{- if or (lt $p 1) (gt $p 65535) }}
{{- fail (printf "config.server.metricsPort must be 1-65535 in Kubernetes (got %v)" (get $server "metricsPort")) }}
{{- end }}
{{- if eq $p (int (include "sluice.apiPort" .)) }}
{{- fail "config.server.metricsPort must differ from config.server.port" }}
{{- end }}
{{- $p }}
{{- end }}

{{/*
A Go duration string ("30s", "1m30s", "500ms", "0") in seconds, as a float: (list VALUE KEY), where
KEY names the value in the error a malformed one fails with.
*/}}
{{- define "sluice.duration" -}}
{{- $d := index . 0 | toString | trimPrefix "+" }}
{{- $total := 0.0 }}
{{- if ne $d "0" }}
{{- $terms := regexFindAll "([0-9]+\\.?[0-9]*|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" $d -1 }}
{{- if or (not $terms) (ne (join "" $terms) $d) }}
{{- fail (printf "%s: %q is not a duration such as \"30s\" or \"1m30s\"" (index . 1) $d) }}
{{- end }}
{{- $scale := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- range $terms }}
{{- $unit := regexFind "(ns|us|µs|μs|ms|s|m|h)$" . }}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get $scale $unit)) }}
{{- end }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
A Prometheus duration (ms, s, m, h, d, w, y, as values.schema.json checks it) in seconds: the
ServiceMonitor's interval and scrape timeout are Prometheus', not Go, durations.
*/}}
{{- define "sluice.promDuration" -}}
{{- $total := 0.0 }}
{{- $scale := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" (toString .) -1 }}
{{- $unit := regexFind "(ms|s|m|h|d|w|y)$" . }}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get $scale $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Sluice's drain time (config.server.shutdownGracePeriod, default 30s) in seconds.
*/}}
{{- define "sluice.shutdownGraceSeconds" -}}
{{- $server := include "sluice.server" . | fromYaml }}
{{- include "sluice.duration" (list (get $server "shutdownGracePeriod" | default "30s") "config.server.shutdownGracePeriod") | float64 | ceil | int }}
{{- end }}

{{/*
terminationGracePeriodSeconds: explicit, or preStop sleep + drain + 10 s; must exceed preStop + drain.
*/}}
{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- $needed := add (int .Values.preStopSleepSeconds) (int (include "sluice.shutdownGraceSeconds" .)) }}
{{- $tgps := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $tgps }}
{{- add $needed 10 }}
{{- else if le (int $tgps) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than preStopSleepSeconds + config.server.shutdownGracePeriod (%d s)" (int $tgps) $needed) }}
{{- else }}
{{- int $tgps }}
{{- end }}
{{- end }}

{{/*
config.server.host, when set, must listen on every address: the kubelet probes the pod IP and the
Service sends to it.
*/}}
{{- define "sluice.checkHost" -}}
{{- $server := include "sluice.server" . | fromYaml }}
{{- $host := get $server "host" | default "0.0.0.0" }}
{{- if not (has $host (list "0.0.0.0" "::")) }}
{{- fail (printf "config.server.host is %q: in Kubernetes it must be \"0.0.0.0\" (IPv4) or \"::\" (IPv6 and IPv4), or the probes and the Service cannot reach the pod" $host) }}
{{- end }}
{{- end }}
