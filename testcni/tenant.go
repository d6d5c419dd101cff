package testcni

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Tenant is a slice of the rig of its own: a pool namespace (the namespace
// of its kubeconfig's context, where whereabouts and harvester-ipam keep the
// IPPools, reservations and the Lease of its networks), a whereabouts flat
// file naming that kubeconfig, and a namespace for its pods. Tests in
// different tenants share no pool, reservation, lease or pod, so they run side
// by side, and a reconciler pass in one sees nothing of another.
type Tenant struct {
	Name          string
	PoolNamespace string
	PodNamespace  string
	Kubeconfig    string
	FlatFile      string

	rig *Rig
}

// NewTenant makes a tenant named name (a DNS label, unique in the rig).
func (r *Rig) NewTenant(ctx context.Context, name string) (*Tenant, error) {
	t := &Tenant{Name: name, PoolNamespace: "pools-" + name, PodNamespace: "longhorn-" + name, rig: r}
	for _, ns := range []string{t.PoolNamespace, t.PodNamespace} {
		if err := r.EnsureNamespace(ctx, ns); err != nil {
			return nil, fmt.Errorf("tenant %s: %w", name, err)
		}
	}
	dir := filepath.Join(r.Dir, "tenants", name)
	if err := t.write(dir, r.cluster.kubeconfig(t.PoolNamespace)); err != nil {
		return nil, err
	}
	return t, nil
}

// write puts the tenant's kubeconfig and flat file under dir.
func (t *Tenant) write(dir, kubeconfig string) error {
	t.Kubeconfig = filepath.Join(dir, "whereabouts.kubeconfig")
	if err := writeFile(t.Kubeconfig, []byte(kubeconfig)); err != nil {
		return err
	}
	t.FlatFile = filepath.Join(dir, "whereabouts.d", "whereabouts.conf")
	flat, _ := json.Marshal(map[string]any{"datastore": "kubernetes", "kubernetes": map[string]string{"kubeconfig": t.Kubeconfig}})
	return writeFile(t.FlatFile, flat)
}

// Pod is a pod of this tenant's pod namespace.
func (t *Tenant) Pod(name string) Pod { return Pod{Namespace: t.PodNamespace, Name: name} }

// Node is a node name of this tenant's own (nodes are cluster-wide objects).
func (t *Tenant) Node(name string) string { return t.Name + "-" + name }

// Reconciler runs harvester-ipam-reconciler on this tenant's pools; args are
// its own ("inspect", "--grace", "--dry-run", ...).
func (t *Tenant) Reconciler(ctx context.Context, args ...string) (Run, error) {
	return t.rig.reconciler(ctx, t.Kubeconfig, t.PoolNamespace, args...)
}

// Remove deletes the tenant's files (its namespaces go with the rig).
func (t *Tenant) Remove() { _ = os.RemoveAll(filepath.Dir(t.Kubeconfig)) }
