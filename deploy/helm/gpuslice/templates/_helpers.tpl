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

{{/* The namespace of every namespaced object: namespaceOverride, else the release's. */}}
{{- define "gpuslice.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "gpuslice.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride }}
{{- toYaml .Values.selectorLabelsOverride }}
{{- else }}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
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

{{/* The ConfigMap's name when the agent reads it through the API (CONFIG_MAP), else empty:
the one object the Role's configmaps rule covers. */}}
{{- define "gpuslice.configMapFromApi" -}}
{{- if include "gpuslice.configFromApi" . }}{{ include "gpuslice.configMapName" . }}{{ end }}
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
names a cdi-* strategy, or DRA is served (a CDI spec per claim). */}}
{{- define "gpuslice.cdi" -}}
{{- $names := splitList "," (include "gpuslice.envText" (default "" .Values.deviceListStrategy)) }}
{{- $cdi := false }}
{{- range $names }}{{ if hasPrefix "cdi-" (trim .) }}{{ $cdi = true }}{{ end }}{{ end }}
{{- range $entry, $text := .Values.config.map }}
{{- if regexMatch "cdi-(annotations|cri)" (toString $text) }}{{ $cdi = true }}{{ end }}
{{- end }}
{{- if include "gpuslice.dra" . }}{{ $cdi = true }}{{ end }}
{{- if $cdi }}true{{ end }}
{{- end }}

{{/* "true" when the agent serves DRA: dra.enabled on Kubernetes 1.34 or later, where
resource.k8s.io/v1 is served. */}}
{{- define "gpuslice.dra" -}}
{{- if and .Values.dra.enabled (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/* "true" when the memory-budget watchdog kills processes: its terminate policy, which needs
accounting to see them. */}}
{{- define "gpuslice.terminate" -}}
{{- if and .Values.accounting.enabled (eq .Values.memoryBudget.policy "terminate") }}true{{ end }}
{{- end }}

{{/* "true" when the agent's pod needs the host's PID namespace: the watchdog signals host PIDs
(terminate policy). MPS servers need it too, but they run in the mps-control pod. */}}
{{- define "gpuslice.hostPID" -}}
{{- if include "gpuslice.terminate" . }}true{{ end }}
{{- end }}

{{/* The mps-control DaemonSet's selector labels: a name of its own, so that neither
DaemonSet's selector matches the other's pods (NVIDIA's chart gives both one selector, #982). */}}
{{- define "gpuslice.mpsControlSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-mps-control" (include "gpuslice.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mps-control
{{- end }}

{{/* The socket of `gpuslice mps-control` (mps.enabled), which the agent has every MPS daemon
started from. */}}
{{- define "gpuslice.mpsControlSocket" -}}
{{- printf "%s/.mps-control.sock" (trimSuffix "/" .Values.mps.root) }}
{{- end }}

{{/* "true" when MIG may be in use or devices are passed as volume mounts: as NVIDIA's chart,
the container then gets SYS_ADMIN and NVIDIA_MIG_MONITOR_DEVICES=all. */}}
{{- define "gpuslice.migMonitor" -}}
{{- $mig := and .Values.migStrategy (ne (toString .Values.migStrategy) "none") }}
{{- $lists := splitList "," (include "gpuslice.envText" (default "" .Values.deviceListStrategy)) }}
{{- $mounts := false }}
{{- range $lists }}{{ if eq (trim .) "volume-mounts" }}{{ $mounts = true }}{{ end }}{{ end }}
{{- if or $mig $mounts }}true{{ end }}
{{- end }}

{{/* The agent container's securityContext: privileged with compatWithCPUManager, else the
one given in values, else root with no capability but SYS_ADMIN (migMonitor, MIG layouts, and
the driver's per-cgroup memory limits: its root-only calls check CAP_SYS_ADMIN) and KILL (the
watchdog's terminate policy). */}}
{{- define "gpuslice.securityContext" -}}
{{- if .Values.compatWithCPUManager }}
privileged: true
{{- else if .Values.securityContext }}
{{- toYaml .Values.securityContext }}
{{- else }}
{{- $add := list }}
{{- if or (include "gpuslice.migMonitor" .) .Values.memoryIsolation.enabled .Values.migManager.enabled }}{{ $add = append $add "SYS_ADMIN" }}{{ end }}
{{- if include "gpuslice.terminate" . }}{{ $add = append $add "KILL" }}{{ end }}
runAsUser: 0
runAsGroup: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- with $add }}
  add: {{ toJson . }}
  {{- end }}
{{- end }}
{{- end }}

{{/* "true" when a container with this securityContext (YAML text) holds CAP_SYS_ADMIN:
privileged, or SYS_ADMIN (or CAP_SYS_ADMIN, ALL) added. */}}
{{- define "gpuslice.hasSysAdmin" -}}
{{- $ctx := fromYaml . }}
{{- $add := list }}
{{- with $ctx.capabilities }}{{ $add = .add | default list }}{{ end }}
{{- $found := $ctx.privileged }}
{{- range $add }}{{ if has (upper (toString .)) (list "SYS_ADMIN" "CAP_SYS_ADMIN" "ALL") }}{{ $found = true }}{{ end }}{{ end }}
{{- if $found }}true{{ end }}
{{- end }}

{{/* The Levenshtein distance of .a and .b (short strings: value keys). */}}
{{- define "gpuslice.distance" -}}
{{- $b := splitList "" .b }}
{{- $prev := until (add1 (len $b) | int) }}
{{- range $i, $ca := splitList "" .a }}
{{- $cur := list (add1 $i) }}
{{- range $j, $cb := $b }}
{{- $cost := ternary 0 1 (eq $ca $cb) }}
{{- $cur = append $cur (min (add1 (index $prev (add1 $j))) (add1 (index $cur $j)) (add (index $prev $j) $cost)) }}
{{- end }}
{{- $prev = $cur }}
{{- end }}
{{- last $prev }}
{{- end }}

{{/* Fails on a top-level value the chart does not know, naming the closest known one (the
schema's properties, listed in _generated.tpl). */}}
{{- define "gpuslice.unknownValues" -}}
{{- $known := include "gpuslice.knownValues" . | fromJsonArray }}
{{- range $key := keys .Values | sortAlpha }}
{{- if not (has $key $known) }}
{{- $best := "" }}{{ $bestDistance := 1000 }}
{{- range $known }}
{{- $d := include "gpuslice.distance" (dict "a" (lower $key) "b" (lower .)) | int }}
{{- if lt $d $bestDistance }}{{ $best = . }}{{ $bestDistance = $d }}{{ end }}
{{- end }}
{{- fail (printf "values: unknown key %q; did you mean %q? (docs/install.md lists every value)" $key $best) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Render-time checks of combinations the schema cannot express; each fails with one line. */}}
{{- define "gpuslice.validate" -}}
{{- include "gpuslice.unknownValues" . }}
{{- if and (eq (include "gpuslice.namespace" .) "default") (not .Values.allowDefaultNamespace) }}
{{- fail "the namespace is default: install into a namespace of its own (-n gpuslice --create-namespace), or set allowDefaultNamespace=true" }}
{{- end }}
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

{{/* The agent's status socket under hostNetwork (GPUSLICE_STATUS_SOCKET), in a directory of
the pod's own (an emptyDir). */}}
{{- define "gpuslice.statusSocket" -}}/run/gpuslice/status.sock{{- end }}

{{/* An exec probe's command: GET of the path (the template's argument) over the status
socket, with the image's interpreter and nothing of gpuslice loaded but the probe. */}}
{{- define "gpuslice.probe" -}}
["/opt/gpuslice/bin/python", "-I", "-m", "gpuslice.adapters.status_probe", {{ include "gpuslice.statusSocket" . | quote }}, {{ . | quote }}]
{{- end }}
