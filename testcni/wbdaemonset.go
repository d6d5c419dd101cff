package testcni

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HarvesterWhereabouts is the name of whereabouts' DaemonSet, ServiceAccount,
// ClusterRole and ClusterRoleBinding on Harvester (its chart's whereabouts
// dependency in the release "harvester"), all in kube-system.
const HarvesterWhereabouts = "harvester-whereabouts"

// harvesterWhereaboutsManifest is what Harvester's chart
// (deploy/charts/harvester/dependency_charts/whereabouts) renders with
// Harvester's values: its ServiceAccount, ClusterRole and binding,
// whereabouts-config, and the DaemonSet (privileged, hostNetwork, the
// host's /opt/cni/bin and /etc/cni/net.d, its install step then
// ip-control-loop). %[1]s is the image, %[2]s the container's script, %[3]s
// the version's extra env.
const harvesterWhereaboutsManifest = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: harvester-whereabouts
  namespace: kube-system
  labels: {app: whereabouts, app.kubernetes.io/name: whereabouts, app.kubernetes.io/instance: harvester, app.kubernetes.io/managed-by: Helm}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: harvester-whereabouts
rules:
- apiGroups: [whereabouts.cni.cncf.io]
  resources: [ippools, overlappingrangeipreservations]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: ['*']
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
- apiGroups: [k8s.cni.cncf.io]
  resources: [network-attachment-definitions]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update, get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: harvester-whereabouts
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: harvester-whereabouts}
subjects:
- {kind: ServiceAccount, name: harvester-whereabouts, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: whereabouts-config
  namespace: kube-system
data:
  cron-expression: "30 4 * * *"
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: harvester-whereabouts
  namespace: kube-system
  labels: {app: whereabouts, app.kubernetes.io/name: whereabouts, app.kubernetes.io/instance: harvester, app.kubernetes.io/managed-by: Helm}
spec:
  selector:
    matchLabels: {name: whereabouts, app: whereabouts, app.kubernetes.io/name: whereabouts, app.kubernetes.io/instance: harvester}
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels: {name: whereabouts, app: whereabouts, app.kubernetes.io/name: whereabouts, app.kubernetes.io/instance: harvester}
    spec:
      hostNetwork: true
      serviceAccountName: harvester-whereabouts
      securityContext: {}
      containers:
      - name: whereabouts
        command: [/bin/sh]
        args:
        - -c
        - |
%[2]s
        securityContext:
          privileged: true
        image: %[1]s
        imagePullPolicy: IfNotPresent
        env:%[3]s
        - name: WHEREABOUTS_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        resources:
          requests: {cpu: 100m, memory: 100Mi}
          limits: {cpu: 100m, memory: 200Mi}
        volumeMounts:
        - {name: cnibin, mountPath: /host/opt/cni/bin}
        - {name: cni-net-dir, mountPath: /host/etc/cni/net.d}
        - {name: cron-scheduler-configmap, mountPath: /cron-schedule}
      volumes:
      - name: cnibin
        hostPath: {path: /opt/cni/bin}
      - name: cni-net-dir
        hostPath: {path: /etc/cni/net.d}
      - name: cron-scheduler-configmap
        configMap:
          name: whereabouts-config
          defaultMode: 0744
          items:
          - {key: cron-expression, path: config}
      tolerations:
      - {operator: Exists, effect: NoSchedule}
`

// whereaboutsScript is the container's script in Harvester's chart for a
// version: from v0.9 its install step is sourced, then token-watcher.sh
// keeps the kubeconfig's token fresh beside ip-control-loop; before, the
// install step runs, then ip-control-loop.
func whereaboutsScript(version string) (script, env string) {
	if AtLeast(version, "v0.9.0") {
		return "          SLEEP=false source /install-cni.sh\n          /token-watcher.sh &\n          /ip-control-loop -log-level debug",
			"\n        - name: NODENAME\n          valueFrom:\n            fieldRef:\n              apiVersion: v1\n              fieldPath: spec.nodeName"
	}
	return "          SLEEP=false /install-cni.sh && /ip-control-loop -log-level debug", ""
}

// DeployHarvesterWhereabouts applies whereabouts of a version as Harvester
// deploys it: the DaemonSet harvester-whereabouts in kube-system, its
// ServiceAccount and ClusterRole (server-side apply, as helm's objects; run
// again with another version, it is the chart's upgrade: the DaemonSet's
// image changes, and its rolling update replaces each pod). The image must
// be on the nodes (NodeOptions.Images).
func (r *Rig) DeployHarvesterWhereabouts(ctx context.Context, version string) error {
	script, env := whereaboutsScript(version)
	manifest := fmt.Sprintf(harvesterWhereaboutsManifest, WhereaboutsImageRef(version), script, env)
	if err := r.Apply(ctx, []byte(manifest), false); err != nil {
		return fmt.Errorf("Harvester's whereabouts %s: %w", version, err)
	}
	return nil
}

// DaemonSetRolledOut says whether a DaemonSet's rollout is complete, as
// `kubectl rollout status` judges it: the controller has seen its latest
// spec, and every node it should run on has an updated pod that is
// available. The string says what it waits for.
func DaemonSetRolledOut(ds *appsv1.DaemonSet) (bool, string) {
	st := ds.Status
	switch {
	case ds.Generation > st.ObservedGeneration:
		return false, "waiting for the daemon set spec update to be observed"
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
		return false, fmt.Sprintf("%d out of %d new pods have been updated", st.UpdatedNumberScheduled, st.DesiredNumberScheduled)
	case st.NumberAvailable < st.DesiredNumberScheduled:
		return false, fmt.Sprintf("%d of %d updated pods are available", st.NumberAvailable, st.DesiredNumberScheduled)
	case st.DesiredNumberScheduled == 0:
		return false, "no node to run on yet"
	}
	return true, fmt.Sprintf("successfully rolled out (%d pods)", st.DesiredNumberScheduled)
}

// WaitRolledOut waits until a DaemonSet is rolled out (DaemonSetRolledOut),
// reading it fresh every half second, for at most limit.
func (r *Rig) WaitRolledOut(ctx context.Context, namespace, name string, limit time.Duration) error {
	var last string
	deadline := time.Now().Add(limit)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ds, err := r.Kube.AppsV1().DaemonSets(namespace).Get(cctx, name, metav1.GetOptions{})
		cancel()
		if err == nil {
			var done bool
			if done, last = DaemonSetRolledOut(ds); done {
				return nil
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon set %s/%s not rolled out after %s: %s", namespace, name, limit, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("daemon set %s/%s: %w (%s)", namespace, name, ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// PodOf is the name of a DaemonSet's pod on a node ("" when it has none),
// from a fresh list.
func (r *Rig) PodOf(ctx context.Context, namespace, selector, node string) (string, error) {
	pods, err := r.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	switch len(names) {
	case 0:
		return "", nil
	case 1:
		return names[0], nil
	}
	return "", fmt.Errorf("%d pods of %s on %s: %s", len(names), selector, node, strings.Join(names, ", "))
}
