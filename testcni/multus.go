package testcni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// MultusCacheDir is where the Multus thin plugin keeps each sandbox's
// delegates (and libcni its results): a private tmpfs inside the rig.
const MultusCacheDir = "/var/lib/cni/multus"

// MultusModule is the Multus the rig runs (tools.sh builds the same version).
const MultusModule = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@v4.3.0"

// Annotations Multus reads and writes on pods.
const (
	NetworksAnnotation      = "k8s.v1.cni.cncf.io/networks"
	NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"
)

// NADResource is the NetworkAttachmentDefinition resource.
var NADResource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}

// InstallNADCRD installs the NetworkAttachmentDefinition CRD from the Multus
// module's own deployment manifest (the first document of
// deployments/multus-daemonset.yml), and waits until it serves. tools.sh
// copies that document beside the Multus binary: the rig runs in a network
// namespace of its own, where a cold module cache cannot be filled.
func (r *Rig) InstallNADCRD(ctx context.Context) error {
	manifest := r.Tools["multus-nad-crd"]
	if _, err := os.Stat(manifest); err != nil {
		// A cache filled before tools.sh copied the CRD: the module cache may have it.
		dir, err := moduleDir(ctx, MultusModule)
		if err != nil {
			return fmt.Errorf("the NAD CRD: run testcni/tools.sh multus (it copies it to %s): %w", manifest, err)
		}
		manifest = filepath.Join(dir, "deployments", "multus-daemonset.yml")
	}
	b, err := os.ReadFile(manifest)
	if err != nil {
		return fmt.Errorf("the NAD CRD: %w", err)
	}
	crd, err := PickDoc(b, "CustomResourceDefinition", "network-attachment-definitions.k8s.cni.cncf.io")
	if err != nil {
		return fmt.Errorf("%s: %w", manifest, err)
	}
	if err := r.Apply(ctx, crd, false); err != nil {
		return fmt.Errorf("install the NAD CRD: %w", err)
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = r.Dynamic.Resource(NADResource).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the NAD CRD is not served: %w (%v)", err, last)
	}
	return nil
}

// moduleDir downloads (or finds in the module cache) one module version,
// outside this module so that its go.mod is left alone.
func moduleDir(ctx context.Context, modVersion string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", modVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod", "GO111MODULE=on")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr == nil && info.Error != "" {
		return "", fmt.Errorf("go mod download %s: %s", modVersion, info.Error)
	}
	if err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v: %s", modVersion, err, out)
	}
	return info.Dir, nil
}

// PickDoc returns the document of a YAML stream with that kind and name
// (the first of that kind when name is "").
func PickDoc(stream []byte, kind, name string) ([]byte, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("no %s %s in it", kind, name)
			}
			return nil, err
		}
		if obj.GetKind() == kind && (name == "" || obj.GetName() == name) {
			return obj.MarshalJSON()
		}
	}
}

// NADConfig is the CNI config a NAD of the storage network holds, as
// Harvester generates it (but the VLAN, see writeConf), with n's IPAM.
func (n *Network) NADConfig() string {
	b, _ := json.Marshal(map[string]any{
		"cniVersion": n.CNIVersion, "type": "bridge", "bridge": n.bridge(), "promiscMode": true, "ipam": n.ipam(n.Tenant.FlatFile),
	})
	return string(b)
}

// MultusNetwork is the Multus thin plugin as the runtime's CNI network: a
// default network (a bridge with host-local) and, for pods that ask for it
// in their networks annotation, the storage network from a NAD object.
type MultusNetwork struct {
	*Network        // cnitool's network (Name: Multus'); Range, IPAM: the storage network's
	NADNamespace    string
	NADName         string
	LogFile         string // Multus' debug log
	defaultBridge   string
	defaultSubnet   string
	storageIfName   string
	networksRequest string
}

// AddMultusNetwork writes the Multus conf where cnitool finds it (named
// n.Name), and creates the NAD nadNamespace/nadName whose config is the
// storage network n. Pods join the NAD on interface ifName. defaultSubnet is
// the default network's host-local subnet.
func (r *Rig) AddMultusNetwork(ctx context.Context, n Network, nadNamespace, nadName, ifName, defaultSubnet string) (*MultusNetwork, error) {
	n = n.withDefaults(r)
	m := &MultusNetwork{
		Network: &n, NADNamespace: nadNamespace, NADName: nadName,
		LogFile:       filepath.Join(r.Dir, "multus-"+n.Name+".log"),
		defaultBridge: "mdef0", defaultSubnet: defaultSubnet, storageIfName: ifName,
	}
	req, _ := json.Marshal([]map[string]string{{"namespace": nadNamespace, "name": nadName, "interface": ifName}})
	m.networksRequest = string(req)
	if err := r.EnsureNamespace(ctx, nadNamespace); err != nil {
		return nil, err
	}
	if err := m.SetNAD(ctx, n.NADConfig()); err != nil {
		return nil, err
	}
	// The thin plugin's conf, as its entrypoint writes 00-multus.conf: the
	// default network inline as the first delegate, and a kubeconfig.
	conf := map[string]any{
		"cniVersion": "0.3.1", "name": n.Name, "type": "multus",
		"kubeconfig": r.Kubeconfig,
		"binDir":     n.binDir(),
		"cniDir":     MultusCacheDir,
		"logFile":    m.LogFile, "logLevel": "debug",
		"delegates": []any{map[string]any{
			"cniVersion": "0.3.1", "name": n.Name + "-default", "type": "bridge", "bridge": m.defaultBridge,
			"ipam": map[string]any{"type": "host-local", "subnet": defaultSubnet},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return m, writeFile(filepath.Join(r.NetConfDir, n.Name+".conf"), b)
}

// SetNAD creates or updates the NAD with a config.
func (m *MultusNetwork) SetNAD(ctx context.Context, config string) error {
	res := m.rig.Dynamic.Resource(NADResource).Namespace(m.NADNamespace)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": m.NADName, "namespace": m.NADNamespace},
		"spec":     map[string]any{"config": config},
	}}
	old, err := res.Get(ctx, m.NADName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = res.Create(ctx, obj, metav1.CreateOptions{})
	case err == nil:
		obj.SetResourceVersion(old.GetResourceVersion())
		_, err = res.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("NAD %s/%s: %w", m.NADNamespace, m.NADName, err)
	}
	return nil
}

// DeleteNAD deletes the NAD, as disabling the storage network does.
func (m *MultusNetwork) DeleteNAD(ctx context.Context) error {
	err := m.rig.Dynamic.Resource(NADResource).Namespace(m.NADNamespace).Delete(ctx, m.NADName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NAD %s/%s: %w", m.NADNamespace, m.NADName, err)
	}
	return nil
}

// CreatePod creates the pod object with the networks annotation that asks
// for the NAD. No scheduler or kubelet runs: it is an object Multus reads.
func (m *MultusNetwork) CreatePod(ctx context.Context, pod Pod) error {
	if err := m.rig.EnsureNamespace(ctx, pod.Namespace); err != nil {
		return err
	}
	_, err := m.rig.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace,
			Annotations: map[string]string{NetworksAnnotation: m.networksRequest}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/longhorn-instance-manager"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Ref(), err)
	}
	return nil
}

// DeletePod deletes the pod object at once.
func (m *MultusNetwork) DeletePod(ctx context.Context, pod Pod) error {
	err := m.rig.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", pod.Ref(), err)
	}
	return nil
}

// NetworkStatus is the network-status annotation Multus wrote on the pod.
func (m *MultusNetwork) NetworkStatus(ctx context.Context, pod Pod) ([]NetworkStatus, error) {
	p, err := m.rig.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read pod %s: %w", pod.Ref(), err)
	}
	raw := p.Annotations[NetworkStatusAnnotation]
	if raw == "" {
		return nil, nil
	}
	var st []NetworkStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return nil, fmt.Errorf("pod %s: %s: %w", pod.Ref(), NetworkStatusAnnotation, err)
	}
	return st, nil
}

// NetworkStatus is one entry of the network-status annotation.
type NetworkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
	Default   bool     `json:"default"`
}

// NewSandbox is a new sandbox of pod on the Multus network: the runtime
// hands Multus eth0, and Multus gives the storage network its own ifname.
func (m *MultusNetwork) NewSandbox(pod Pod) (*Sandbox, error) {
	return m.rig.NewSandbox(m.Network, pod, "eth0")
}

// StorageIfName is the interface the pods' networks annotation asks for.
func (m *MultusNetwork) StorageIfName() string { return m.storageIfName }

// ForgetCache deletes what Multus (and libcni under it) cached for a
// sandbox: a node whose /var/lib/cni was wiped, or a lost cache file.
func (m *MultusNetwork) ForgetCache(s *Sandbox) ([]string, error) {
	var removed []string
	err := filepath.WalkDir(MultusCacheDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.Contains(d.Name(), s.ContainerID) {
			if err := os.Remove(p); err != nil {
				return err
			}
			removed = append(removed, p)
		}
		return nil
	})
	if err != nil {
		return removed, fmt.Errorf("forget Multus' cache of %s: %w", s.ContainerID, err)
	}
	return removed, nil
}

// Log is Multus' log so far.
func (m *MultusNetwork) Log() string {
	b, _ := os.ReadFile(m.LogFile)
	return string(b)
}
