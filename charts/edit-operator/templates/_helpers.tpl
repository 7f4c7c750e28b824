{{/* Names and labels shared by every template. */}}

{{- define "edit-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "edit-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "edit-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "edit-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "edit-operator.labels" -}}
{{ include "edit-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: edit
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "edit-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "edit-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The in-cluster address workers stream telemetry to (the telemetry Service): EDIT_TELEMETRY_ADDR. */}}
{{- define "edit-operator.telemetryAddr" -}}
{{- printf "%s-telemetry.%s.svc:%v" (include "edit-operator.fullname" .) .Release.Namespace .Values.ports.telemetry -}}
{{- end -}}

{{/*
Whether a Prometheus Operator resource is rendered: (list .Values.x.enabled $) -> "true" or "".
"auto" renders it when the cluster serves monitoring.coreos.com/v1.
*/}}
{{- define "edit-operator.monitoringEnabled" -}}
{{- $want := toString (index . 0) -}}
{{- $root := index . 1 -}}
{{- if or (eq $want "true") (and (eq $want "auto") ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}
true
{{- end -}}
{{- end -}}
