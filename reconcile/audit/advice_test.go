package audit

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAdviceIsSafeForEachKindOfPod: what a finding tells an operator to do
// with the pod it names, in its message and its next command, is what is
// safe for that kind of pod: a Longhorn instance manager is never to be
// deleted (that stops every engine and replica on its node) but its node
// put into maintenance; a share manager's RWX volume detached by its
// workloads; a backing-image manager deleted only once none of its files
// is in progress; a VM's pod never deleted but the VM live-migrated; any
// other pod deleted, with what that costs said.
func TestAdviceIsSafeForEachKindOfPod(t *testing.T) {
	yes := true
	for _, tt := range []struct {
		name    string
		pod     func(p *corev1.Pod)
		command string
		says    []string
		deletes bool // the message may name a delete of this pod
	}{
		{name: "instance manager (its label)", pod: func(p *corev1.Pod) {
			p.Name, p.Labels = "instance-manager-0a1b", map[string]string{componentLabel: instanceManager}
		}, command: "kubectl cordon node-b", says: []string{"Longhorn instance manager", "stops every engine and replica it runs on node node-b", "Do not delete it", "Enable Maintenance Mode", "kubectl drain --ignore-daemonsets", "Longhorn starts a new one, and its next sandbox"}},
		{name: "instance manager (its name)", pod: func(p *corev1.Pod) { p.Name = "instance-manager-0a1b" },
			command: "kubectl cordon node-b", says: []string{"Do not delete it", "Enable Maintenance Mode"}},
		{name: "instance manager, node unknown", pod: func(p *corev1.Pod) { p.Name, p.Spec.NodeName = "instance-manager-0a1b", "" },
			command: "kubectl -n longhorn-system get pod instance-manager-0a1b -o wide", says: []string{"Do not delete it", "Put its node into maintenance"}},
		{name: "share manager", pod: func(p *corev1.Pod) { p.Name = "share-manager-pvc-1234" },
			command: "kubectl -n longhorn-system get volumes.longhorn.io pvc-1234", says: []string{"Longhorn share manager, the NFS server of RWX volume pvc-1234", "Do not delete it", "blocks every client's I/O", "until the volume is detached"}},
		{name: "backing-image manager", pod: func(p *corev1.Pod) { p.Name = "backing-image-manager-5a6b-c7d8" },
			command: "kubectl -n longhorn-system get backingimagemanagers.longhorn.io backing-image-manager-5a6b-c7d8 -o yaml", says: []string{"fails any backing image file it is downloading", "Delete it only once none of its files is in progress"}, deletes: true},
		{name: "a VM's pod", pod: func(p *corev1.Pod) {
			p.Namespace, p.Name, p.Labels = "default", "virt-launcher-vm1-x7k2p", map[string]string{kubevirtLabel: virtLauncher, kubevirtVMLabel: "vm1"}
		}, command: `kubectl -n default create -f - <<< '{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstanceMigration","metadata":{"generateName":"vm1-"},"spec":{"vmiName":"vm1"}}'`,
			says: []string{"runs virtual machine default/vm1", "stops the VM as a power cut would", "Do not delete it", "Live-migrate the VM"}},
		{name: "a pod a controller owns", pod: func(p *corev1.Pod) {
			p.Namespace, p.Name = "default", "web-5d9f-abcde"
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-5d9f", Controller: &yes}}
		}, command: "kubectl -n default delete pod web-5d9f-abcde", says: []string{"Deleting default/web-5d9f-abcde stops its containers, and what it serves is down until its ReplicaSet web-5d9f makes another pod"}, deletes: true},
		{name: "a pod no controller owns", pod: func(p *corev1.Pod) { p.Namespace, p.Name = "default", "debug" },
			command: "kubectl -n default delete pod debug", says: []string{"No controller owns default/debug: deleting it stops its containers for good", "kubectl -n default get pod debug -o yaml"}, deletes: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := podSpec{ref: lh + "/x", phase: corev1.PodRunning, asks: []string{storage}, status: map[string][]string{}}.build()
			p.Spec.NodeName = "node-b"
			tt.pod(p)
			// Every finding that names one pod: its network missing, then
			// an address the pools do not hold for it.
			for _, status := range [][]string{nil, {"10.0.50.77"}} {
				s, pods := healthy()
				for _, q := range pods {
					s.Pods = append(s.Pods, q.build())
				}
				q := p.DeepCopy()
				if status != nil {
					q.Annotations[NetworksAnnotation] = `[{"namespace":"harvester-system","name":"storagenetwork","interface":"lhnet1"}]`
					q.Annotations["k8s.v1.cni.cncf.io/network-status"] = `[{"name":"harvester-system/storagenetwork","interface":"lhnet1","ips":["10.0.50.77"]}]`
				}
				s.Pods = append(s.Pods, TrimPod(q))
				var f *Finding
				for _, x := range Judge(s, Options{}).Findings {
					if len(x.Pods) == 1 && x.Pods[0] == q.Namespace+"/"+q.Name {
						x := x
						f = &x
					}
				}
				require.NotNil(t, f, "a finding on the pod")
				assert.Equal(t, tt.command, f.Command, "%s's command", f.Kind)
				for _, w := range tt.says {
					assert.Contains(t, strings.ReplaceAll(f.Message, "\n", " "), w, "%s's message", f.Kind)
				}
				if !tt.deletes {
					assert.NotContains(t, f.Command, "delete")
					assert.NotContains(t, f.Message, "delete pod", "%s's message", f.Kind)
				}
			}
		})
	}
}

// A SharedAddress whose newest pod is an instance manager tells how to
// give it a new sandbox safely; one reservation named by another pod lists
// the safe way for each pod it names.
func TestAdviceOfFindingsOfTwoPods(t *testing.T) {
	imC := lh + "/instance-manager-c"
	s, pods := healthy()
	s.NADs = append(s.NADs, nad("default/small", "10.0.50.0/28", nil))
	s.Pools = append(s.Pools, pool("10.0.50.0-28", "10.0.50.0/28", "1="+imC+"#cc"))
	pods = append(pods, podSpec{ref: imC, phase: corev1.PodRunning, created: 5})
	for _, p := range pods {
		s.Pods = append(s.Pods, p.build())
	}
	fs := Judge(s, Options{}).Findings
	require.NotEmpty(t, fs)
	assert.Equal(t, SharedAddress, fs[0].Kind)
	assert.Contains(t, fs[0].Message, "Give the newest, "+imC+", a new sandbox")
	assert.Contains(t, fs[0].Message, "Do not delete it. Put its node into maintenance")
	assert.NotContains(t, fs[0].Message, "delete pod")

	s, pods = healthy()
	s.Reservations[1] = orip("10.0.50.2", "default/other")
	for _, p := range pods {
		s.Pods = append(s.Pods, p.build())
	}
	fs = Judge(s, Options{}).Findings
	require.Len(t, fs, 1)
	assert.Contains(t, fs[0].Message, lh+"/instance-manager-b (a Longhorn instance manager: by its node's maintenance, never by deleting it)")
	assert.Contains(t, fs[0].Message, "default/other (by deleting it")
}
