{{/* The resource names the admission policy refuses (deny) or warns about (warn) above 1 per
container, as JSON: gpuslice.core.admission.capped_names over the configs of config.map,
plus admissionPolicies.deny and .warn. A name is denied when every config that may serve it
caps it (failRequestsGreaterThanOne); a GPU resource's own name (gpuslice.baseResource) may
also be served whole, unless a config shares all of it under that name with the cap. */}}
{{- define "gpuslice.admissionNames" -}}
{{- $configs := list }}
{{- range $entry, $text := .Values.config.map }}
{{- $config := dict "caps" list "free" list "full" list }}
{{- $sharing := (fromYaml (toString $text)).sharing | default dict }}
{{- $mps := not (empty $sharing.mps) }}
{{- $block := ternary $sharing.mps $sharing.timeSlicing $mps | default dict }}
{{- $fail := $block.failRequestsGreaterThanOne }}
{{- if kindIs "invalid" $fail }}{{ $fail = $mps }}{{ end }}
{{- $seen := list }}
{{- range $block.resources | default list }}
{{- $name := include "gpuslice.resourceName" .name }}
{{- $all := or (kindIs "invalid" .devices) (eq (toString .devices) "all") }}
{{- if not (and $all (has $name $seen)) }}
{{- if $all }}{{ $seen = append $seen $name }}{{ end }}
{{- $rename := ternary (include "gpuslice.resourceName" .rename) "" (not (empty .rename)) }}
{{- if eq $rename $name }}{{ $rename = "" }}{{ end }}
{{- if and (not $rename) $block.renameByDefault }}{{ $rename = printf "%s.shared" $name }}{{ end }}
{{- $advertised := $rename | default $name }}
{{- if $fail }}
{{- $_ := set $config "caps" (append $config.caps $advertised) }}
{{- if and $all (eq $advertised $name) }}{{ $_ := set $config "full" (append $config.full $name) }}{{ end }}
{{- else }}
{{- $_ := set $config "free" (append $config.free $advertised) }}
{{- end }}
{{- end }}
{{- end }}
{{- $configs = append $configs $config }}
{{- end }}
{{- $given := .Values.admissionPolicies }}
{{- $capped := list }}
{{- range $configs }}{{ $capped = concat $capped .caps }}{{ end }}
{{- $deny := $given.deny | default list }}
{{- $warn := $given.warn | default list }}
{{- range $capped | uniq | sortAlpha }}
{{- $name := . }}
{{- $uncapped := false }}
{{- range $configs }}
{{- if or (has $name .free) (and (include "gpuslice.baseResource" $name) (not (has $name .full))) }}{{ $uncapped = true }}{{ end }}
{{- end }}
{{- if $uncapped }}{{ $warn = append $warn $name }}{{ else }}{{ $deny = append $deny $name }}{{ end }}
{{- end }}
{{- $deny = $deny | uniq | sortAlpha }}
{{- $warned := list }}
{{- range $warn | uniq | sortAlpha }}{{ if not (has . $deny) }}{{ $warned = append $warned . }}{{ end }}{{ end }}
{{- dict "deny" $deny "warn" $warned | toJson }}
{{- end }}

{{/* A config's resource name with the nvidia.com/ prefix added when missing. */}}
{{- define "gpuslice.resourceName" -}}
{{- $name := toString . }}
{{- if hasPrefix "nvidia.com/" $name }}{{ $name }}{{ else }}nvidia.com/{{ $name }}{{ end }}
{{- end }}

{{/* "true" when the cluster serves ValidatingAdmissionPolicy v1 (Kubernetes 1.30 on): the only
part of the chart that needs 1.30. */}}
{{- define "gpuslice.admissionSupported" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- end }}
