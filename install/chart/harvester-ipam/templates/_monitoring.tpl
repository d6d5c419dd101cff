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
For a Longhorn or VM pod that depends on its kind, as the audit's Events on the pod say, and each way costs the workloads. An instance manager (instance-manager-*) runs every engine and replica of its node, and deleting it stops them and their volumes' I/O (attached VMs lose their disks): never delete it; put its node into Harvester's maintenance mode (Hosts > Enable Maintenance Mode; the node's VMs live-migrate away, non-migratable ones must be stopped first, its replicas stop and rebuild later; elsewhere kubectl cordon, then kubectl drain --ignore-daemonsets), wait for Maintenance, then disable it: Longhorn starts a new instance manager there only then. A share manager (share-manager-<volume>) is the NFS server of an RWX volume, and deleting it blocks every client's I/O until Longhorn has made another and NFS's 90 s grace has passed (an application that cannot handle the I/O errors may lose data): never delete it; stop the workloads that mount the volume (scale them to 0, stop the VMs) until the volume is detached (kubectl -n longhorn-system get volumes.longhorn.io <volume>), and Longhorn starts a new one when they start again. A backing-image manager (backing-image-manager-*): deleting it fails any backing image file it is downloading, receiving or syncing, and its files read unknown until the new one runs: delete it only once none of its files is in progress (kubectl -n longhorn-system get backingimagemanagers.longhorn.io <pod> shows their states). A backing-image data source (backing-image-ds-*) is an image download or upload: wait until Longhorn stops it, done; deleting it restarts a download and loses an upload. A VM's virt-launcher-* pod: deleting it stops the VM as a power cut would; live-migrate the VM instead (Virtual Machines > Migrate), which gives it a new pod. Any other pod: deleting it stops it until its controller makes another (none: for good). Why, with sources: docs/reference.md, Longhorn's pods.
{{- end -}}
