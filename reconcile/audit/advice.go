package audit

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// What an operator is told to do about a pod depends on what the pod is: a
// Longhorn instance manager runs the engines and replicas of its node's
// volumes, and deleting it stops every one of them, so the audit never
// tells anyone to delete one. For each kind, the procedure Longhorn and
// Harvester document as safe (docs/audit.md, "What it tells you to do",
// cites them); for a pod of no known kind, what deleting it costs.

// KubeVirt's pods of a virtual machine (Harvester's VMs): the label and the
// start of their names.
const (
	kubevirtLabel   = "kubevirt.io"
	virtLauncher    = "virt-launcher"
	kubevirtVMLabel = "vm.kubevirt.io/name"
)

// podKind is what a pod is, for the advice.
func podKind(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	if c := component(p); c != "" {
		return c
	}
	if p.Labels[kubevirtLabel] == virtLauncher || strings.HasPrefix(p.Name, virtLauncher+"-") {
		return virtLauncher
	}
	return ""
}

// vmOf is the virtual machine a virt-launcher pod runs: its label, or its
// name less "virt-launcher-" and the pod's random suffix.
func vmOf(p *corev1.Pod) string {
	if vm := p.Labels[kubevirtVMLabel]; vm != "" {
		return vm
	}
	name := strings.TrimPrefix(p.Name, virtLauncher+"-")
	if i := strings.LastIndex(name, "-"); i > 0 {
		name = name[:i]
	}
	return name
}

// remedy says how to give pod ref a new sandbox safely for its kind, so
// that goal (what its next sandbox does) happens, and the one command to
// run next.
func (x *index) remedy(ref, goal string) (advice, command string) {
	p := x.pods[ref]
	ns, name, _ := strings.Cut(ref, "/")
	switch podKind(p) {
	case instanceManager:
		node := p.Spec.NodeName
		if node == "" {
			node = "its node"
		}
		return fmt.Sprintf("%s is a Longhorn instance manager: deleting it stops every engine and replica it runs on %s, and their volumes' I/O. Do not delete it. Put %s into maintenance instead (Harvester: Hosts > Enable Maintenance Mode, which live-migrates its VMs; else kubectl cordon, then kubectl drain --ignore-daemonsets): once drained, no engine or replica runs there and Longhorn stops the instance manager. End the maintenance (Disable Maintenance Mode, or kubectl uncordon): Longhorn starts a new one, and %s.",
			ref, nodeSaid(node), nodeSaid(node), goal), cordon(node, ref)
	case shareManager:
		volume := strings.TrimPrefix(name, shareManager+"-")
		return fmt.Sprintf("%s is a Longhorn share manager, the NFS server of RWX volume %s: deleting it blocks every client's I/O on the volume until Longhorn has made another and its 90 s lock grace has passed, and an application that cannot handle the I/O errors may then lose data. Do not delete it. Stop the workloads that mount the volume instead (scale them to 0, stop the VMs) until the volume is detached (the command below shows its state): Longhorn stops the share manager, and when they start again it starts a new one, and %s.",
			ref, volume, goal), fmt.Sprintf("kubectl -n %s get volumes.longhorn.io %s", ns, volume)
	case backingImageManager:
		return fmt.Sprintf("%s is a Longhorn backing-image manager: deleting it fails any backing image file it is downloading, receiving or syncing on its disk, and its files read unknown until Longhorn has made it again (which then reuses them). Delete it only once none of its files is in progress (the command below shows their states): kubectl -n %s delete pod %s; %s.",
			ref, ns, name, goal), fmt.Sprintf("kubectl -n %s get backingimagemanagers.longhorn.io %s -o yaml", ns, name)
	case virtLauncher:
		vm := vmOf(p)
		return fmt.Sprintf("%s runs virtual machine %s/%s: deleting it stops the VM as a power cut would. Do not delete it. Live-migrate the VM instead (Harvester: Virtual Machines > Migrate; the command below does the same): the VM moves to a new pod, a new sandbox, and %s.",
			ref, ns, vm, goal), fmt.Sprintf(`kubectl -n %s create -f - <<< '{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstanceMigration","metadata":{"generateName":"%s-"},"spec":{"vmiName":"%s"}}'`, ns, vm, vm)
	}
	if p != nil {
		if o := metav1Controller(p); o != "" {
			return fmt.Sprintf("Deleting %s stops its containers, and what it serves is down until its %s makes another pod, whose sandbox is new: %s. If it serves something that cannot stop now, move that away first.",
				ref, o, goal), deletePod(ref)
		}
		return fmt.Sprintf("No controller owns %s: deleting it stops its containers for good, until you make it again (its new sandbox then: %s). Keep its manifest first (kubectl -n %s get pod %s -o yaml).",
			ref, goal, ns, name), deletePod(ref)
	}
	return fmt.Sprintf("Deleting %s stops its containers until its controller, if it has one, makes another pod, whose sandbox is new: %s.", ref, goal), deletePod(ref)
}

// remedyShort is one clause of remedy: how the pod may be given a new
// sandbox, where a finding names two pods and the operator chooses.
func (x *index) remedyShort(ref string) string {
	p := x.pods[ref]
	switch podKind(p) {
	case instanceManager:
		return ref + " (a Longhorn instance manager: by its node's maintenance, never by deleting it)"
	case shareManager:
		return ref + " (a Longhorn share manager: by stopping its RWX volume's workloads until the volume detaches, never by deleting it)"
	case backingImageManager:
		return ref + " (a Longhorn backing-image manager: by deleting it once none of its files is in progress)"
	case virtLauncher:
		return ref + " (virtual machine " + vmOf(p) + "'s pod: by live-migrating the VM, never by deleting the pod)"
	}
	if p != nil && metav1Controller(p) == "" {
		return ref + " (no controller owns it: deleting it is for good)"
	}
	return ref + " (by deleting it: its containers stop until its controller makes another)"
}

// metav1Controller is "Kind name" of the pod's controller, "" when none
// owns it.
func metav1Controller(p *corev1.Pod) string {
	for _, o := range p.OwnerReferences {
		if o.Controller != nil && *o.Controller {
			return o.Kind + " " + o.Name
		}
	}
	return ""
}

func nodeSaid(node string) string {
	if node == "its node" {
		return node
	}
	return "node " + node
}

// cordon is the first step of a node's maintenance, harmless alone: no pod
// is stopped, none new is scheduled there.
func cordon(node, ref string) string {
	if node == "its node" {
		ns, name, _ := strings.Cut(ref, "/")
		return fmt.Sprintf("kubectl -n %s get pod %s -o wide", ns, name)
	}
	return "kubectl cordon " + node
}

// remediesShort is remedyShort of each pod, joined.
func (x *index) remediesShort(refs []string) string {
	out := make([]string, 0, len(refs))
	for _, r := range dedupe(refs) {
		out = append(out, x.remedyShort(r))
	}
	return strings.Join(out, "; ")
}
