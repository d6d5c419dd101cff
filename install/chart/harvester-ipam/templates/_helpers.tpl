{{/* The name of every object: the release's, with harvester-ipam in it once. */}}
{{- define "harvester-ipam.fullname" -}}
{{- if contains "harvester-ipam" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-harvester-ipam" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "harvester-ipam.labels" -}}
app.kubernetes.io/name: harvester-ipam
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector: call with (dict "ctx" . "component" "installer") */}}
{{- define "harvester-ipam.selector" -}}
app.kubernetes.io/name: harvester-ipam
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "harvester-ipam.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The reconciler's arguments, but --interval. */}}
{{- define "harvester-ipam.reconcilerArgs" -}}
- --namespace={{ .Values.whereabouts.poolNamespace }}
- --grace={{ required "reconciler.grace is required" .Values.reconciler.grace }}
- --daemonset={{ include "harvester-ipam.fullname" . }}
{{- if .Values.reconciler.dryRun }}
- --dry-run
{{- end }}
{{- if .Values.reconciler.deleteOrphanedPools }}
- --delete-orphaned-pools
{{- end }}
{{- end -}}

{{/* A container that needs no privilege at all. */}}
{{- define "harvester-ipam.restricted" -}}
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The reconciler's pod spec, but its containers. */}}
{{- define "harvester-ipam.reconcilerPod" -}}
serviceAccountName: {{ include "harvester-ipam.fullname" . }}-reconciler
{{- with .Values.reconciler.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.reconciler.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.reconciler.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/*
whereabouts serialises its ADD and DEL on the Lease "whereabouts" of the pool
namespace; harvester-ipam holds it while it judges and deletes reservations.
*/}}
{{- define "harvester-ipam.leaseRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [whereabouts]
  verbs: [get, update]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
{{- end }}

{{/*
The installer's check of the node, for its startup and readiness probes.
*/}}
{{- define "harvester-ipam.verify" -}}
exec:
  command:
    - /usr/bin/harvester-ipam-install
    - --verify
    - --source=/usr/bin/harvester-ipam
    - --cni-bin-dir=/host/opt/cni/bin
    {{- if .Values.standIn.enabled }}
    - --stand-in={{ .Values.standIn.name }}
    {{- end }}
    - --daemonset={{ include "harvester-ipam.fullname" . }}
timeoutSeconds: 15
{{- end }}

{{/*
"true" when the DaemonSet's pods carry the reconciler's permissions (for an
operator's kubectl exec), else "".
*/}}
{{- define "harvester-ipam.diagnostics" -}}
{{- if and .Values.reconciler.enabled .Values.rbac.diagnostics }}true{{ end -}}
{{- end }}
