{{/* The chart's name. */}}
{{- define "module-manager.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the release name, with the chart name unless it contains it. */}}
{{- define "module-manager.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "module-manager.selectorLabels" -}}
app.kubernetes.io/name: {{ include "module-manager.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "module-manager.labels" -}}
{{ include "module-manager.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "module-manager.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "module-manager.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* tenancy.mode, checked: cluster or impersonate. */}}
{{- define "module-manager.tenancyMode" -}}
{{- $mode := .Values.tenancy.mode -}}
{{- if not (has $mode (list "cluster" "impersonate")) -}}
{{- fail (printf "tenancy.mode must be cluster or impersonate, not %q" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{- define "module-manager.fleet" -}}
{{- default (include "module-manager.fullname" .) .Values.fleet -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: drain, then handover, then the margin (docs/deploy.md). */}}
{{- define "module-manager.terminationGrace" -}}
{{- add .Values.drainTimeoutSeconds .Values.handoverTimeoutSeconds .Values.terminationMarginSeconds -}}
{{- end -}}

{{/* The lease timings the binary accepts (it refuses to start otherwise): fail at render time. */}}
{{- define "module-manager.validate" -}}
{{- $v := .Values -}}
{{- if or (lt (int $v.renewIntervalSeconds) 1) (gt (mul 2 (int $v.renewIntervalSeconds)) (int $v.leaseDurationSeconds)) -}}
{{- fail "renewIntervalSeconds must be at least 1 and at most half of leaseDurationSeconds" -}}
{{- end -}}
{{- if or (le (int $v.renewDeadlineSeconds) (int $v.renewIntervalSeconds)) (ge (int $v.renewDeadlineSeconds) (int $v.leaseDurationSeconds)) -}}
{{- fail "renewDeadlineSeconds must be longer than renewIntervalSeconds and shorter than leaseDurationSeconds" -}}
{{- end -}}
{{- $powers := list 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536 -}}
{{- if not (has (int $v.shards) $powers) -}}
{{- fail "shards must be a power of two from 1 to 65536" -}}
{{- end -}}
{{- if lt (int $v.terminationMarginSeconds) 15 -}}
{{- fail "terminationMarginSeconds must be at least 15 (the last Lease writes and the exit)" -}}
{{- end -}}
{{- end -}}
