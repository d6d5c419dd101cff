package testcni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// A tenant's identities as on a Harvester node with the chart: the plugin
// (and whereabouts' binary, which it runs) logged in as whereabouts' own
// ServiceAccount, bound to whereabouts' ClusterRole as Harvester's chart
// writes it and to this chart's plugin Role; the node agent as the chart's
// agent ServiceAccount with only the chart's agent Role. The Roles' rules are
// the chart's own, rendered by helm; nothing of the rig's admin is in either
// kubeconfig.

// WhereaboutsServiceAccount is the name of a tenant's whereabouts identity
// (in its pool namespace); AgentServiceAccount the chart's agent's.
const (
	WhereaboutsServiceAccount = "whereabouts"
	AgentServiceAccount       = "harvester-ipam-agent"
	// tenantClusterRole holds the rules of Harvester's whereabouts
	// ClusterRole (harvesterWhereaboutsManifest) under a name of the rig's,
	// so that the tests that deploy Harvester's whereabouts own theirs.
	tenantClusterRole = "rig-tenant-whereabouts"
	// chartRelease is the release the chart's Roles are rendered for.
	chartRelease = "harvester-ipam"
	// tokenLife is how long the tenants' tokens are valid: longer than any run.
	tokenLife = 6 * time.Hour
)

// chartRoles are the RBAC rules the identities carry, read once per rig.
type chartRoles struct {
	once        sync.Once
	err         error
	whereabouts []rbacv1.PolicyRule // Harvester's whereabouts ClusterRole
	plugin      []rbacv1.PolicyRule // the chart's plugin Role
	agent       []rbacv1.PolicyRule // the chart's agent Role
}

// roles renders the chart's plugin and agent Roles (helm template) and reads
// whereabouts' ClusterRole from Harvester's manifest, and makes the
// ClusterRole the tenants' whereabouts identities are bound to.
func (r *Rig) roles(ctx context.Context) (*chartRoles, error) {
	c := &r.chartRoles
	c.once.Do(func() {
		c.err = func() error {
			out, err := r.Helm(ctx, "template", chartRelease, filepath.Join(r.Root, "install/chart/harvester-ipam"),
				"--namespace", "rig-placeholder", "--set", "whereabouts.poolNamespace=rig-placeholder",
				"--show-only", "templates/rbac.yaml", "--show-only", "templates/node-agent.yaml")
			if err != nil {
				return err
			}
			roles, err := decodeRoles(out)
			if err != nil {
				return err
			}
			if c.plugin = roles["Role/"+chartRelease+"-plugin"]; c.plugin == nil {
				return fmt.Errorf("the chart renders no %s-plugin Role", chartRelease)
			}
			if c.agent = roles["Role/"+chartRelease+"-agent"]; c.agent == nil {
				return fmt.Errorf("the chart renders no %s-agent Role", chartRelease)
			}
			script, env := whereaboutsScript(V093)
			wb, err := decodeRoles([]byte(fmt.Sprintf(harvesterWhereaboutsManifest, "image", script, env)))
			if err != nil {
				return err
			}
			if c.whereabouts = wb["ClusterRole/"+HarvesterWhereabouts]; c.whereabouts == nil {
				return fmt.Errorf("Harvester's whereabouts manifest has no ClusterRole %s", HarvesterWhereabouts)
			}
			_, err = r.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: tenantClusterRole}, Rules: c.whereabouts}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("ClusterRole %s: %w", tenantClusterRole, err)
			}
			return nil
		}()
	})
	return c, c.err
}

// decodeRoles reads the rules of every Role and ClusterRole of a manifest,
// keyed "Kind/name".
func decodeRoles(manifest []byte) (map[string][]rbacv1.PolicyRule, error) {
	out := map[string][]rbacv1.PolicyRule{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var o struct {
			Kind     string              `json:"kind"`
			Metadata metav1.ObjectMeta   `json:"metadata"`
			Rules    []rbacv1.PolicyRule `json:"rules"`
		}
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("decode manifest: %w", err)
		}
		if o.Kind == "Role" || o.Kind == "ClusterRole" {
			out[o.Kind+"/"+o.Metadata.Name] = o.Rules
		}
	}
}

// identities gives t its two identities and writes their kubeconfigs under
// dir: WhereaboutsKubeconfig (which t's flat file names) and
// AgentKubeconfig. It returns once the API server authenticates and
// authorizes each.
func (r *Rig) identities(ctx context.Context, t *Tenant, dir string) error {
	roles, err := r.roles(ctx)
	if err != nil {
		return err
	}
	ns := t.PoolNamespace
	for _, id := range []struct {
		sa    string
		rules []rbacv1.PolicyRule
		file  *string
		// check is what the identity must be allowed before it is used.
		check authorizationv1.ResourceAttributes
	}{
		{WhereaboutsServiceAccount, roles.plugin, &t.WhereaboutsKubeconfig,
			authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "whereabouts.cni.cncf.io", Resource: "ippools"}},
		{AgentServiceAccount, roles.agent, &t.AgentKubeconfig,
			authorizationv1.ResourceAttributes{Namespace: ns, Verb: "watch", Group: "whereabouts.cni.cncf.io", Resource: "overlappingrangeipreservations"}},
	} {
		if err := r.bindRole(ctx, ns, id.sa, id.rules); err != nil {
			return err
		}
		if id.sa == WhereaboutsServiceAccount {
			_, err := r.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: tenantClusterRole + "-" + ns},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: tenantClusterRole},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: id.sa, Namespace: ns}},
			}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("bind %s/%s to %s: %w", ns, id.sa, tenantClusterRole, err)
			}
		}
		tr, err := r.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, id.sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(tokenLife / time.Second))},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("token of %s/%s: %w", ns, id.sa, err)
		}
		kc := strings.Replace(r.cluster.kubeconfig(ns), "token: "+r.cluster.token, "token: "+tr.Status.Token, 1)
		*id.file = filepath.Join(dir, id.sa+".kubeconfig")
		if err := writeFile(*id.file, []byte(kc)); err != nil {
			return err
		}
		if err := waitAllowed(ctx, []byte(kc), id.check); err != nil {
			return fmt.Errorf("%s/%s: %w", ns, id.sa, err)
		}
	}
	return nil
}

// bindRole makes the ServiceAccount ns/sa and a Role of rules bound to it.
func (r *Rig) bindRole(ctx context.Context, ns, sa string, rules []rbacv1.PolicyRule) error {
	_, err := r.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ServiceAccount %s/%s: %w", ns, sa, err)
	}
	_, err = r.Kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: rules}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("Role %s/%s: %w", ns, sa, err)
	}
	_, err = r.Kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("RoleBinding %s/%s: %w", ns, sa, err)
	}
	return nil
}

// waitAllowed waits until kubeconfig's identity is authenticated (a new
// ServiceAccount's token is refused until the authenticator has seen the
// account) and allowed what attrs says (the RBAC authorizer sees new
// bindings through its informers, moments after they are stored).
func waitAllowed(ctx context.Context, kubeconfig []byte, attrs authorizationv1.ResourceAttributes) error {
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := kc.AuthorizationV1().SelfSubjectAccessReviews().Create(cctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}, metav1.CreateOptions{})
		cancel()
		switch {
		case err != nil:
			last = err
		case res.Status.Allowed:
			return nil
		default:
			last = fmt.Errorf("may not %s %s in %s: %s", attrs.Verb, attrs.Resource, attrs.Namespace, res.Status.Reason)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("not logged in and allowed after 30 s: %v", last)
}
