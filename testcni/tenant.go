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
	// Kubeconfig logs in as the rig's admin, its context's namespace the
	// pool namespace: the tests' reads and harvester-ipam's reconciler.
	Kubeconfig string
	// FlatFile is whereabouts' flat file; it names WhereaboutsKubeconfig.
	FlatFile string
	// WhereaboutsKubeconfig is the identity of the plugin and of the
	// whereabouts binary it runs: with TenantOptions.RBAC, whereabouts' own
	// ServiceAccount (WhereaboutsServiceAccount in the pool namespace) bound
	// to whereabouts' ClusterRole as Harvester's chart writes it and to this
	// chart's plugin Role; else Kubeconfig.
	WhereaboutsKubeconfig string
	// AgentKubeconfig, with TenantOptions.RBAC, is the node agent's identity:
	// the chart's agent ServiceAccount with the chart's agent Role only
	// (Rig.StartAgent's default for the tenant); else empty.
	AgentKubeconfig string

	rig *Rig
}

// TenantOptions shape a tenant.
type TenantOptions struct {
	// RBAC logs the plugin (and whereabouts) in as whereabouts' own
	// identity and the node agent as the chart's agent, each with only the
	// rights those carry on a Harvester node with the chart (Tenant's
	// WhereaboutsKubeconfig and AgentKubeconfig); else both are the admin.
	RBAC bool
}

// NewTenant makes a tenant named name (a DNS label, unique in the rig),
// whose plugin runs as the rig's admin.
func (r *Rig) NewTenant(ctx context.Context, name string) (*Tenant, error) {
	return r.NewTenantWith(ctx, name, TenantOptions{})
}

// NewTenantWith makes a tenant named name shaped by o.
func (r *Rig) NewTenantWith(ctx context.Context, name string, o TenantOptions) (*Tenant, error) {
	t := &Tenant{Name: name, PoolNamespace: "pools-" + name, PodNamespace: "longhorn-" + name, rig: r}
	for _, ns := range []string{t.PoolNamespace, t.PodNamespace} {
		if err := r.EnsureNamespace(ctx, ns); err != nil {
			return nil, fmt.Errorf("tenant %s: %w", name, err)
		}
	}
	dir := filepath.Join(r.Dir, "tenants", name)
	if o.RBAC {
		if err := r.identities(ctx, t, dir); err != nil {
			return nil, fmt.Errorf("tenant %s: %w", name, err)
		}
	}
	if err := t.write(dir, r.cluster.kubeconfig(t.PoolNamespace)); err != nil {
		return nil, err
	}
	return t, nil
}

// write puts the tenant's admin kubeconfig and its flat file under dir; the
// flat file names WhereaboutsKubeconfig, the admin's unless set.
func (t *Tenant) write(dir, kubeconfig string) error {
	t.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := writeFile(t.Kubeconfig, []byte(kubeconfig)); err != nil {
		return err
	}
	if t.WhereaboutsKubeconfig == "" {
		t.WhereaboutsKubeconfig = t.Kubeconfig
	}
	t.FlatFile = filepath.Join(dir, "whereabouts.d", "whereabouts.conf")
	flat, _ := json.Marshal(map[string]any{"datastore": "kubernetes", "kubernetes": map[string]string{"kubeconfig": t.WhereaboutsKubeconfig}})
	return writeFile(t.FlatFile, flat)
}

// Rig is the rig (or the rig's cluster of its own) that holds the tenant.
func (t *Tenant) Rig() *Rig { return t.rig }

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
