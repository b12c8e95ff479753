{{- define "gpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuslice.fullname" -}}
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

{{- define "gpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpuslice.labels" -}}
{{ include "gpuslice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/* The ConfigMap of per-node configs, or empty when none is used. */}}
{{- define "gpuslice.configMapName" -}}
{{- if .Values.config.map }}
{{- printf "%s-configs" (include "gpuslice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else if .Values.config.name }}
{{- .Values.config.name }}
{{- end }}
{{- end }}

{{/* "true" when the agent reads the ConfigMap of configs through the API (CONFIG_MAP) rather
than mounted. */}}
{{- define "gpuslice.configFromApi" -}}
{{- if and (include "gpuslice.configMapName" .) (eq .Values.config.source "api") }}true{{ end }}
{{- end }}

{{/* "true" when config.default goes into the chart-created ConfigMap's annotation, where the
agent follows it live; otherwise a config.default is DEFAULT_CONFIG in the pod template. */}}
{{- define "gpuslice.defaultInAnnotation" -}}
{{- if and (include "gpuslice.configFromApi" .) .Values.config.map }}true{{ end }}
{{- end }}

{{/* A value as an env var's text: a list comma-separated. */}}
{{- define "gpuslice.envText" -}}
{{- if kindIs "slice" . }}{{ join "," . }}{{ else }}{{ toString . }}{{ end }}
{{- end }}

{{/* memoryBudget.budgets as GPUSLICE_MEMORY_BUDGET: "resource=size,..." in key order. */}}
{{- define "gpuslice.budgets" -}}
{{- $out := list }}
{{- range $resource, $size := . }}{{ $out = append $out (printf "%s=%s" $resource $size) }}{{ end }}
{{- join "," $out }}
{{- end }}

{{/* "true" when a CDI spec directory is needed: deviceListStrategy, or an inline config,
names a cdi-* strategy. */}}
{{- define "gpuslice.cdi" -}}
{{- $names := splitList "," (include "gpuslice.envText" (default "" .Values.deviceListStrategy)) }}
{{- $cdi := false }}
{{- range $names }}{{ if hasPrefix "cdi-" (trim .) }}{{ $cdi = true }}{{ end }}{{ end }}
{{- range $entry, $text := .Values.config.map }}
{{- if regexMatch "cdi-(annotations|cri)" (toString $text) }}{{ $cdi = true }}{{ end }}
{{- end }}
{{- if $cdi }}true{{ end }}
{{- end }}

{{/* "true" when the memory-budget watchdog kills processes: its terminate policy, which needs
accounting to see them. */}}
{{- define "gpuslice.terminate" -}}
{{- if and .Values.accounting.enabled (eq .Values.memoryBudget.policy "terminate") }}true{{ end }}
{{- end }}

{{/* "true" when the agent's pod needs the host's PID namespace: the watchdog signals host PIDs
(terminate policy), or a config may use MPS (mps.enableHostPID: an inline config with
sharing.mps, or an existing ConfigMap the chart cannot read). */}}
{{- define "gpuslice.hostPID" -}}
{{- $need := include "gpuslice.terminate" . }}
{{- if .Values.mps.enableHostPID }}
{{- if .Values.config.name }}{{ $need = true }}{{ end }}
{{- range $entry, $text := .Values.config.map }}
{{- if regexMatch "(^|[\\s{,\"])mps\"?\\s*:" (toString $text) }}{{ $need = true }}{{ end }}
{{- end }}
{{- end }}
{{- if $need }}true{{ end }}
{{- end }}

{{/* Render-time checks of combinations the schema cannot express; each fails with one line. */}}
{{- define "gpuslice.validate" -}}
{{- $c := .Values.config }}
{{- if and $c.map $c.name }}
{{- fail "config.map and config.name are both set: give the configs inline (map) or name an existing ConfigMap (name), not both" }}
{{- end }}
{{- if and $c.default (not (or $c.map $c.name)) }}
{{- fail (printf "config.default is %q but there are no configs: set config.map or config.name" $c.default) }}
{{- end }}
{{- if and $c.map $c.default }}
{{- $found := false }}
{{- range $entry, $text := $c.map }}
{{- if or (eq $entry $c.default) (eq (trimSuffix (ext $entry) $entry) $c.default) }}{{ $found = true }}{{ end }}
{{- end }}
{{- if not $found }}
{{- fail (printf "config.default is %q, which is not an entry of config.map (%s)" $c.default (keys $c.map | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- if and $c.map (not $c.default) }}
{{- $fb := $c.fallbackStrategies }}
{{- $named := and (has "named" $fb) (hasKey $c.map "default") }}
{{- $single := and (has "single" $fb) (eq (len $c.map) 1) }}
{{- if not (or $named $single (has "empty" $fb)) }}
{{- fail (printf "config.map has entries %s and none is chosen for unlabelled nodes: set config.default, name an entry default, or add empty to config.fallbackStrategies" (keys $c.map | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- end }}
