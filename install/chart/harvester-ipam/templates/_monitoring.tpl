{{/*
The metrics need the Deployment: refuse the ServiceMonitor and the dashboard
without it. The PrometheusRule needs a reconciler: in CronJob mode it holds
the alerts kube-state-metrics can raise (a failed Job, no success, the
CronJob gone), in Deployment mode the reconciler's and the audit's.
*/}}
{{- define "harvester-ipam.monitoringCheck" -}}
{{- $m := .Values.monitoring -}}
{{- if or $m.serviceMonitor.enabled $m.grafanaDashboard.enabled }}
{{- if not (and .Values.reconciler.enabled (eq .Values.reconciler.mode "deployment")) }}
{{- fail "monitoring.serviceMonitor and monitoring.grafanaDashboard need reconciler.enabled=true and reconciler.mode=deployment: only the reconciler's Deployment serves metrics" }}
{{- end }}
{{- end }}
{{- if and $m.prometheusRule.enabled (not .Values.reconciler.enabled) }}
{{- fail "monitoring.prometheusRule needs reconciler.enabled=true: every alert is about the reconciler's pools, audit or runs" }}
{{- end }}
{{- end -}}

{{/* An alert's labels: its severity, and the one label every alert of the chart carries. */}}
{{- define "harvester-ipam.alertLabels" -}}
severity: {{ . }}
component: harvester-ipam
{{- end -}}

{{/*
What gives a Longhorn pod a new sandbox, by its kind, and what each costs
the workloads (docs/reference.md, Longhorn's pods, cites Longhorn's and
Harvester's documentation for each).
*/}}
{{- define "harvester-ipam.longhornRemedy" -}}
For a Longhorn pod that depends on its kind, and each way costs the workloads: an instance manager (instance-manager-*) runs every engine and replica of its node, and deleting it faults them (attached volumes lose their disks): put its node into Harvester's maintenance mode (Hosts > Enable Maintenance Mode; the node's VMs live-migrate away, non-migratable ones must be shut down first, its replicas stop and rebuild later), wait for Maintenance, then disable it: Longhorn starts a new instance manager there only then. A share manager (share-manager-*): delete the pod (kubectl -n longhorn-system delete pod <pod>); its RWX volume's I/O blocks until Longhorn's new one serves and NFS's 90 s grace ends. A backing-image manager (backing-image-manager-*): delete the pod; its disk's backing-image files read unknown, neither synced nor prepared, until the new one runs; running volumes keep reading them. A backing-image data source (backing-image-ds-*) is an image download or upload: wait until Longhorn stops it, done; deleting it restarts a download and loses an upload. Any other pod: what its owner documents for a restart. Why, with sources: docs/reference.md, Longhorn's pods.
{{- end -}}
