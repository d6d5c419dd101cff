package testcni

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PluginBinary is the harvester-ipam the rig built and its networks run.
func (r *Rig) PluginBinary() string { return filepath.Join(r.bin, "harvester-ipam") }

// ReconcilerBinary is the harvester-ipam-reconciler the rig built.
func (r *Rig) ReconcilerBinary() string { return filepath.Join(r.bin, "harvester-ipam-reconciler") }

// CNIDir is the rig's CNI_PATH dir for a whereabouts version: whereabouts,
// bridge, host-local, multus and harvester-ipam.
func (r *Rig) CNIDir(whereabouts string) string { return r.cniPaths[whereabouts] }

// StandInDir is the rig's CNI_PATH dir for a whereabouts version where
// harvester-ipam stands in at `whereabouts`, the real one at whereabouts.real.
func (r *Rig) StandInDir(whereabouts string) string { return r.cniPaths[whereabouts+standInKey] }

// BuildCommand builds a main package of this module (./cmd/...) into out, as
// the image does: static, trimmed, with extra -ldflags.
func (r *Rig) BuildCommand(ctx context.Context, pkg, out, ldflags string) error {
	return r.build(ctx, out, pkg, "-ldflags", ldflags)
}

// Helm runs the rig's helm; its stdout, or an error with what it said.
func (r *Rig) Helm(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.Tools["helm"], args...)
	cmd.Dir = r.Root
	// helm keeps caches and config under HOME; none of it is wanted.
	home := filepath.Join(r.Dir, "helm-home")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// ServiceAccountKubeconfig creates the ServiceAccount ns/name if needed and
// returns a kubeconfig that logs in as it (a TokenRequest token), whose
// context's namespace is the pool namespace, as whereabouts' kubeconfig.
func (r *Rig) ServiceAccountKubeconfig(ctx context.Context, ns, name string) ([]byte, error) {
	if err := r.EnsureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	_, err := r.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create ServiceAccount %s/%s: %w", ns, name, err)
	}
	tr, err := r.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for ServiceAccount %s/%s: %w", ns, name, err)
	}
	kc := strings.Replace(r.cluster.kubeconfig(PoolNamespace), "token: "+r.cluster.token, "token: "+tr.Status.Token, 1)
	return []byte(kc), nil
}

// AddNetworkWithFlatFile is AddNetwork, but the network's ipam names a
// whereabouts flat file of its own that names kubeconfig: the identity the
// plugin (and whereabouts) run as on this network.
func (r *Rig) AddNetworkWithFlatFile(n Network, kubeconfig string) (*Network, error) {
	net, err := r.AddNetwork(n)
	if err != nil {
		return nil, err
	}
	flat := filepath.Join(r.Dir, "flat-"+net.Name, "whereabouts.conf")
	b, _ := json.Marshal(map[string]any{"datastore": "kubernetes", "kubernetes": map[string]string{"kubeconfig": kubeconfig}})
	if err := writeFile(flat, b); err != nil {
		return nil, err
	}
	return net, net.writeConf(net.ipam(flat))
}
