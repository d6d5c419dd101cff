{{/* The metrics need the Deployment: refuse monitoring objects without it. */}}
{{- define "harvester-ipam.monitoringCheck" -}}
{{- $m := .Values.monitoring -}}
{{- if or $m.serviceMonitor.enabled $m.prometheusRule.enabled $m.grafanaDashboard.enabled }}
{{- if not (and .Values.reconciler.enabled (eq .Values.reconciler.mode "deployment")) }}
{{- fail "monitoring.* needs reconciler.enabled=true and reconciler.mode=deployment: only the reconciler's Deployment serves metrics" }}
{{- end }}
{{- end }}
{{- end -}}
