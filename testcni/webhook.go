package testcni

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

// HarvesterNamespace is where Harvester keeps its system objects, the
// storage network's NADs among them.
const HarvesterNamespace = "harvester-system"

// webhookService is the Service Harvester's network webhook registers itself
// behind.
const webhookService = "harvester-network-webhook"

// ClusterNetworkResource is Harvester's ClusterNetwork.
var ClusterNetworkResource = schema.GroupVersionResource{Group: "network.harvesterhci.io", Version: "v1beta1", Resource: "clusternetworks"}

// kubevirtCRDs are the least of KubeVirt's VirtualMachine and
// VirtualMachineInstance CRDs that the webhook's informers need: served, and
// keeping whatever fields an object has.
const kubevirtCRDs = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: virtualmachines.kubevirt.io}
spec:
  group: kubevirt.io
  scope: Namespaced
  names: {kind: VirtualMachine, listKind: VirtualMachineList, plural: virtualmachines, singular: virtualmachine}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: virtualmachineinstances.kubevirt.io}
spec:
  group: kubevirt.io
  scope: Namespaced
  names: {kind: VirtualMachineInstance, listKind: VirtualMachineInstanceList, plural: virtualmachineinstances, singular: virtualmachineinstance}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

// startWebhook runs Harvester's network webhook (harvester-network-controller's
// cmd/webhook) against the rig's API server as Harvester deploys it: the CRDs
// and objects it waits for, the Service it registers behind (an ExternalName
// to localhost, where it listens on 443), and it then registers itself. It
// returns once a storage-network NAD's config change is refused.
func (r *Rig) startWebhook(ctx context.Context) error {
	start := time.Now()
	if err := r.Apply(ctx, []byte(kubevirtCRDs), false); err != nil {
		return fmt.Errorf("kubevirt CRDs: %w", err)
	}
	crds, err := filepath.Glob(filepath.Join(r.Tools["webhook-crds"], "*.yaml"))
	if err != nil || len(crds) == 0 {
		return fmt.Errorf("no network.harvesterhci.io CRDs in %s (testcni/tools.sh webhook copies them): %v", r.Tools["webhook-crds"], err)
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := r.Apply(ctx, b, false); err != nil {
			return fmt.Errorf("install %s: %w", f, err)
		}
	}
	if err := r.EnsureNamespace(ctx, HarvesterNamespace); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: webhookService, Namespace: HarvesterNamespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
	if _, err := r.Kube.CoreV1().Services(HarvesterNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the webhook's Service: %w", err)
	}
	// The cluster network every Harvester has; a NAD on mgmt-br names it.
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cn := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "network.harvesterhci.io/v1beta1", "kind": "ClusterNetwork",
			"metadata": map[string]any{"name": "mgmt"},
		}}
		_, last = r.Dynamic.Resource(ClusterNetworkResource).Create(ctx, cn, metav1.CreateOptions{})
		return last == nil || apierrors.IsAlreadyExists(last), nil
	})
	if err != nil {
		return fmt.Errorf("the ClusterNetwork mgmt: %w (%v)", err, last)
	}
	// It registers itself at its Service's port 443. On the rig's own
	// network namespace it listens there itself; on a machine, whose 443 is
	// the kubernetes Service's ClusterIP's too (a port a wildcard listener
	// would take from every address), it listens on 8443, as its pod does
	// behind its Service on Harvester, and the machine serves the Service.
	port := "443"
	if m := r.machine; m != nil {
		port = "8443"
		if err := m.serve("127.0.0.1:443", net.JoinHostPort(m.IP, port)); err != nil {
			return err
		}
		// localhost is ::1 too, where the machine has IPv6.
		_ = m.serve("[::1]:443", net.JoinHostPort(m.IP, port))
	}
	p, err := r.machine.startProc(r.Dir, "harvester-network-webhook", r.Tools["webhook"],
		append(os.Environ(), "KUBECONFIG="+r.Kubeconfig),
		"--https-port", port, "--namespace", HarvesterNamespace, "--threadiness", "2")
	if err != nil {
		return err
	}
	r.webhook = p
	if err := r.waitWebhookRefuses(ctx); err != nil {
		return fmt.Errorf("%w\n%s", err, p.tail())
	}
	fmt.Fprintf(r.progress, "rig: Harvester's network webhook judges NADs (ready in %s)\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// waitWebhookRefuses waits until the webhook has registered itself and
// refuses a change of a storage-network NAD's config, as on Harvester.
func (r *Rig) waitWebhookRefuses(ctx context.Context) error {
	nads := r.Dynamic.Resource(NADResource).Namespace(HarvesterNamespace)
	probe := StorageNetworkNAD("storagenetwork-rig-probe", `{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","promiscMode":true,"ipam":{"type":"whereabouts","range":"192.0.2.0/24"}}`)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if r.webhook.exited() {
			return false, fmt.Errorf("harvester-network-webhook exited")
		}
		obj, err := nads.Get(ctx, probe.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			obj, err = nads.Create(ctx, probe, metav1.CreateOptions{})
		}
		if err != nil {
			last = err
			return false, nil
		}
		cfg, _, _ := unstructured.NestedString(obj.Object, "spec", "config")
		_ = unstructured.SetNestedField(obj.Object, strings.Replace(cfg, `"whereabouts"`, `"harvester-ipam"`, 1), "spec", "config")
		_, err = nads.Update(ctx, obj, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "it is used by storagenetwork") {
			return true, nil
		}
		last = fmt.Errorf("a change of the storage network's ipam.type was not refused (%v)", err)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("Harvester's network webhook did not start judging NADs: %w (%v)", err, last)
	}
	return nads.Delete(ctx, probe.GetName(), metav1.DeleteOptions{})
}

// StorageNetworkNAD is a NAD as Harvester's storage-network controller writes
// it, in harvester-system, labelled with the setting's hash.
func StorageNetworkNAD(name, config string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{
			"name": name, "namespace": HarvesterNamespace,
			"labels": map[string]any{"storage-network.settings.harvesterhci.io/hash": "0123456789abcdef0123456789abcdef01234567"},
		},
		"spec": map[string]any{"config": config},
	}}
}
