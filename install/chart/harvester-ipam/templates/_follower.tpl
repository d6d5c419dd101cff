{{/* The NAD follower (follower.*) and the monitoring objects (monitoring.*). */}}

{{/* The follower runs in the reconciler's Deployment: refuse anything else. */}}
{{- define "harvester-ipam.followerCheck" -}}
{{- if .Values.follower.enabled }}
{{- if not (and .Values.reconciler.enabled (eq .Values.reconciler.mode "deployment")) }}
{{- fail "follower.enabled=true needs reconciler.enabled=true and reconciler.mode=deployment: the follower runs beside the reconciler's loop (a CronJob pass would only switch the NADs there at that moment)" }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The follower's flags, shared by the Deployment and the unfollow hook. */}}
{{- define "harvester-ipam.followerSelectorArgs" -}}
- --nad-namespace={{ .Values.follower.namespace }}
{{- range .Values.follower.selector }}
- --nad-selector={{ . }}
{{- end }}
{{- end -}}

{{/* The Deployment's extra arguments when the follower is on. */}}
{{- define "harvester-ipam.followerArgs" -}}
- --follow-nads
{{ include "harvester-ipam.followerSelectorArgs" . }}
- --nad-resync={{ .Values.follower.resync }}
{{- end -}}

{{/* Kind and binding kind for the follower's NAD rules: namespaced unless every namespace is followed. */}}
{{- define "harvester-ipam.followerRoleKind" -}}
{{- if .Values.follower.namespace }}Role{{ else }}ClusterRole{{ end -}}
{{- end -}}

{{/* The metrics need the Deployment: refuse monitoring objects without it. */}}
{{- define "harvester-ipam.monitoringCheck" -}}
{{- $m := .Values.monitoring -}}
{{- if or $m.serviceMonitor.enabled $m.prometheusRule.enabled $m.grafanaDashboard.enabled }}
{{- if not (and .Values.reconciler.enabled (eq .Values.reconciler.mode "deployment")) }}
{{- fail "monitoring.* needs reconciler.enabled=true and reconciler.mode=deployment: only the reconciler's Deployment serves metrics" }}
{{- end }}
{{- end }}
{{- end -}}
