// Package shim releases whereabouts allocations from the IPPool and
// OverlappingRangeIPReservation (ORIP) store, safely next to every other
// writer: each pool write reads the pool fresh, is a JSON patch that tests the
// resourceVersion, and is retried a bounded number of times on 409 and 422; an
// ORIP is deleted only when its podref is the released allocation's, with a
// UID and resourceVersion precondition.
package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	wbclient "github.com/k8snetworkplumbingwg/whereabouts/pkg/client/clientset/versioned/typed/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/iphelpers"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// Allocation is one entry of an IPPool's spec.allocations, with its address.
type Allocation struct {
	Pool   string
	Offset string
	IP     net.IP
	whereaboutsv1alpha1.IPAllocation
}

func (a Allocation) String() string {
	return fmt.Sprintf("%s (pool %s, container %s, pod %s, ifname %q)", a.IP, a.Pool, a.ContainerID, a.PodRef, a.IfName)
}

// Release is an allocation that was removed from its pool.
type Release struct {
	Allocation
	// ORIP is the name of the reservation deleted with it, "" when none was.
	ORIP string
}

// Picker chooses, from a pool's current allocations, the offsets to release.
// It is called again on every fresh read, so it must decide from what it is
// given, not from what an earlier read showed.
type Picker func(allocations map[string]whereaboutsv1alpha1.IPAllocation) []string

// Store is the IPPool/ORIP store of one namespace.
type Store struct {
	client    wbclient.WhereaboutsV1alpha1Interface
	namespace string
	// CallTimeout bounds each API request.
	CallTimeout time.Duration
	// Backoff bounds the retries of a conflicting write.
	Backoff wait.Backoff
	// Retried counts the writes retried after a conflict (409) or failed test (422).
	Retried atomic.Int64
	// Hook, when set, is called at step boundaries ("after-pool-write"): the
	// plugin's test builds crash there to prove that no step loses data.
	Hook func(point string)
}

// DefaultBackoff retries a conflicting write up to 12 times over about 2.5 s:
// enough for a storm of writers on one pool, bounded for the runtime's timeout.
var DefaultBackoff = wait.Backoff{Steps: 12, Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 0.5, Cap: 500 * time.Millisecond}

// New returns the store of namespace behind client.
func New(client wbclient.WhereaboutsV1alpha1Interface, namespace string) *Store {
	return &Store{client: client, namespace: namespace, CallTimeout: 10 * time.Second, Backoff: DefaultBackoff}
}

// NewForConfig builds the typed whereabouts client from a rest config.
func NewForConfig(cfg *rest.Config, namespace string) (*Store, error) {
	c, err := wbclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("whereabouts client: %w", err)
	}
	return New(c, namespace), nil
}

// In is this store's client, settings and hook on another namespace's pools:
// a checkpoint may name pools of a namespace the current kubeconfig does not.
func (s *Store) In(namespace string) *Store {
	if namespace == "" || namespace == s.namespace {
		return s
	}
	o := New(s.client, namespace)
	o.CallTimeout, o.Backoff, o.Hook = s.CallTimeout, s.Backoff, s.Hook
	return o
}

// Namespace is where the pools and ORIPs live.
func (s *Store) Namespace() string { return s.namespace }

// Client is the typed whereabouts client, for readers such as the reconciler.
func (s *Store) Client() wbclient.WhereaboutsV1alpha1Interface { return s.client }

// GetPool reads a pool fresh from the API server; nil, nil when it does not exist.
//
// A GET, on purpose: a LIST by name with no resourceVersion is as fresh, and
// Kubernetes 1.31+ serves it from the watch cache 3x cheaper for a pool of
// 10,000 entries, but it first waits for that cache to catch up with etcd
// (up to ~100 ms whenever anything else changed, such as whereabouts' Lease),
// which doubled a small pool's ADD in the bench.
func (s *Store) GetPool(ctx context.Context, name string) (*whereaboutsv1alpha1.IPPool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
	defer cancel()
	p, err := s.client.IPPools(s.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pool %s/%s: %w", s.namespace, name, err)
	}
	return p, nil
}

// Allocations lists a pool's entries with their addresses, sorted by offset.
func Allocations(p *whereaboutsv1alpha1.IPPool) ([]Allocation, error) {
	first, _, err := net.ParseCIDR(p.Spec.Range)
	if err != nil {
		return nil, fmt.Errorf("pool %s has range %q: %w", p.Name, p.Spec.Range, err)
	}
	out := make([]Allocation, 0, len(p.Spec.Allocations))
	for off, a := range p.Spec.Allocations {
		ip, err := OffsetIP(first, off)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		out = append(out, Allocation{Pool: p.Name, Offset: off, IP: ip, IPAllocation: a})
	}
	sort.Slice(out, func(i, j int) bool { return iphelpers.CompareIPs(out[i].IP, out[j].IP) < 0 })
	return out, nil
}

// OffsetIP is the address at a decimal offset from a pool's first address, as
// whereabouts stores allocations.
func OffsetIP(first net.IP, offset string) (net.IP, error) {
	n, err := strconv.ParseUint(offset, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("allocation offset %q is not a decimal number", offset)
	}
	ip := iphelpers.IPAddOffset(first, n)
	if ip == nil {
		return nil, fmt.Errorf("allocation offset %s is outside the address family of %s", offset, first)
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return ip, nil
}

// ORIPName is the name of the ORIP whereabouts creates for ip: IPv6 colons
// become dashes, and a network_name is prepended. It mirrors whereabouts'
// storage/kubernetes.NormalizeIP (a test holds the two equal).
func ORIPName(ip net.IP, networkName string) string {
	s := ip.String()
	if strings.HasSuffix(s, ":") {
		s += "0"
	}
	s = strings.ReplaceAll(s, ":", "-")
	if networkName != "" {
		s = networkName + "-" + s
	}
	return s
}

// maxRemovals bounds the removals of one patch: the API server refuses a JSON
// patch of more than 10,000 operations, and a huge one holds the pool long.
const maxRemovals = 1000

// Release removes from pool the allocations pick chooses, then the ORIPs that
// belong to them. A pool that does not exist holds nothing: no error. More
// than maxRemovals entries go in several patches, each from a fresh read.
func (s *Store) Release(ctx context.Context, pool, networkName string, pick Picker) ([]Release, error) {
	var released []Release
	for {
		chunk, more, err := s.releaseChunk(ctx, pool, pick)
		released = append(released, chunk...)
		if err != nil {
			return released, err
		}
		if len(chunk) > 0 && s.Hook != nil {
			s.Hook("after-pool-write")
		}
		if !more {
			break
		}
	}
	if err := s.deleteORIPs(ctx, pool, networkName, released); err != nil {
		return released, err
	}
	return released, nil
}

// releaseChunk removes up to maxRemovals picked entries in one guarded patch;
// more says that pick chose more than that.
func (s *Store) releaseChunk(ctx context.Context, pool string, pick Picker) (released []Release, more bool, err error) {
	err = s.retry(func() error {
		released, more = nil, false
		p, err := s.GetPool(ctx, pool)
		if err != nil || p == nil {
			return err
		}
		offsets := pick(p.Spec.Allocations)
		if len(offsets) > maxRemovals {
			offsets, more = offsets[:maxRemovals], true
		}
		if len(offsets) == 0 {
			return nil
		}
		first, _, err := net.ParseCIDR(p.Spec.Range)
		if err != nil {
			return fmt.Errorf("pool %s has range %q: %w", pool, p.Spec.Range, err)
		}
		ops := []patchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: p.ResourceVersion}}
		for _, off := range offsets {
			a, ok := p.Spec.Allocations[off]
			if !ok {
				continue
			}
			ip, err := OffsetIP(first, off)
			if err != nil {
				return fmt.Errorf("pool %s: %w", pool, err)
			}
			ops = append(ops, patchOp{Op: "remove", Path: "/spec/allocations/" + escapePointer(off)})
			released = append(released, Release{Allocation: Allocation{Pool: pool, Offset: off, IP: ip, IPAllocation: a}})
		}
		if len(released) == 0 {
			return nil
		}
		body, err := json.Marshal(ops)
		if err != nil {
			return fmt.Errorf("encode patch of pool %s: %w", pool, err)
		}
		cctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
		defer cancel()
		_, err = s.client.IPPools(s.namespace).Patch(cctx, pool, types.JSONPatchType, body, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			released, more = nil, false // deleted under us: nothing left to release
			return nil
		}
		if err != nil {
			return fmt.Errorf("release %s from pool %s/%s: %w", describe(released), s.namespace, pool, err)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return released, more, nil
}

// deleteORIPs deletes the reservations of released allocations that are
// theirs: same podref, and the pod does not hold the address again already
// (a new sandbox may have taken it while we worked; its reservation is live).
// The pool is read once for that check, whatever the number of releases.
func (s *Store) deleteORIPs(ctx context.Context, pool, networkName string, released []Release) error {
	type cand struct {
		i int
		o *whereaboutsv1alpha1.OverlappingRangeIPReservation
	}
	var cands []cand
	for i, r := range released {
		o, err := s.getORIP(ctx, ORIPName(r.IP, networkName))
		if err != nil {
			return err
		}
		if o != nil && ours(o, r.Allocation) {
			cands = append(cands, cand{i, o})
		}
	}
	if len(cands) == 0 {
		return nil
	}
	p, err := s.GetPool(ctx, pool)
	if err != nil {
		return err
	}
	for _, c := range cands {
		r := released[c.i]
		if p != nil {
			if cur, ok := p.Spec.Allocations[r.Offset]; ok && cur.PodRef == c.o.Spec.PodRef {
				continue
			}
		}
		name, err := s.deleteORIP(ctx, c.o, r.Allocation)
		if err != nil {
			return fmt.Errorf("delete reservation %s/%s of %s: %w", s.namespace, c.o.Name, r.PodRef, err)
		}
		released[c.i].ORIP = name
	}
	return nil
}

// deleteORIP deletes o if it is unchanged; when it changed (409), it reads it
// again and deletes it only while it is still the allocation's. It returns
// the name deleted, "" when the reservation is not (or no longer) ours.
func (s *Store) deleteORIP(ctx context.Context, o *whereaboutsv1alpha1.OverlappingRangeIPReservation, a Allocation) (string, error) {
	for attempt := 1; ; attempt++ {
		err := s.deleteIfUnchanged(ctx, o)
		if err == nil {
			return o.Name, nil
		}
		if !apierrors.IsConflict(err) || attempt >= s.Backoff.Steps {
			return "", err
		}
		s.Retried.Add(1)
		if o, err = s.getORIP(ctx, o.Name); err != nil || o == nil || !ours(o, a) {
			return "", err
		}
	}
}

// ours says whether a reservation is the released allocation's.
func ours(o *whereaboutsv1alpha1.OverlappingRangeIPReservation, a Allocation) bool {
	return o.Spec.PodRef == a.PodRef && (o.Spec.ContainerID == "" || o.Spec.ContainerID == a.ContainerID)
}

func (s *Store) getORIP(ctx context.Context, name string) (*whereaboutsv1alpha1.OverlappingRangeIPReservation, error) {
	cctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
	defer cancel()
	o, err := s.client.OverlappingRangeIPReservations(s.namespace).Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get reservation %s/%s: %w", s.namespace, name, err)
	}
	return o, nil
}

// deleteIfUnchanged deletes with UID and resourceVersion preconditions; gone
// already is success.
func (s *Store) deleteIfUnchanged(ctx context.Context, o *whereaboutsv1alpha1.OverlappingRangeIPReservation) error {
	cctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
	defer cancel()
	uid, rv := o.UID, o.ResourceVersion
	err := s.client.OverlappingRangeIPReservations(s.namespace).Delete(cctx, o.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// DeleteORIP deletes an ORIP only if it is unchanged since it was read (UID
// and resourceVersion preconditions): for a reconciler that judged it orphaned.
func (s *Store) DeleteORIP(ctx context.Context, o *whereaboutsv1alpha1.OverlappingRangeIPReservation) error {
	if err := s.deleteIfUnchanged(ctx, o); err != nil {
		return fmt.Errorf("delete reservation %s/%s: %w", s.namespace, o.Name, err)
	}
	return nil
}

// retry runs fn again, after a fresh read, while it fails with a conflict
// (409) or a failed patch test (422), up to s.Backoff.Steps times.
func (s *Store) retry(fn func() error) error {
	return retry.OnError(s.Backoff, func(err error) bool {
		ok := apierrors.IsConflict(err) || apierrors.IsInvalid(err)
		if ok {
			s.Retried.Add(1)
		}
		return ok
	}, fn)
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// escapePointer escapes a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// describe names the released addresses, the first few of many.
func describe(rs []Release) string {
	const show = 8
	var ips []string
	for i, r := range rs {
		if i == show {
			ips = append(ips, fmt.Sprintf("and %d more", len(rs)-show))
			break
		}
		ips = append(ips, r.IP.String())
	}
	return strings.Join(ips, ", ")
}

// Ping asks the API server for one pool: it answers when the store is usable.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
	defer cancel()
	if _, err := s.client.IPPools(s.namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("list pools in %s: %w", s.namespace, err)
	}
	return nil
}

// SetPoolAnnotation sets (or, with "", removes) one annotation of a pool from
// its fresh state: value computes it from the pool as read. The write tests
// the resourceVersion like every other pool write, and is retried the same way.
func (s *Store) SetPoolAnnotation(ctx context.Context, pool, key string, value func(*whereaboutsv1alpha1.IPPool) string) error {
	return s.retry(func() error {
		p, err := s.GetPool(ctx, pool)
		if err != nil || p == nil {
			return err
		}
		want := value(p)
		have, ok := p.Annotations[key]
		if want == have && (ok || want == "") {
			return nil
		}
		ops := []patchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: p.ResourceVersion}}
		switch {
		case want == "":
			ops = append(ops, patchOp{Op: "remove", Path: "/metadata/annotations/" + escapePointer(key)})
		case p.Annotations == nil:
			ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{key: want}})
		default:
			ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations/" + escapePointer(key), Value: want})
		}
		body, err := json.Marshal(ops)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
		defer cancel()
		_, err = s.client.IPPools(s.namespace).Patch(cctx, pool, types.JSONPatchType, body, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("annotate pool %s/%s: %w", s.namespace, pool, err)
		}
		return nil
	})
}

// ReleaseReservation deletes the ORIP of ip when it is podRef's and the pool,
// read fresh, does not hold ip for podRef: what a DEL killed between its pool
// write and its ORIP delete leaves behind. It returns the name deleted, or "".
func (s *Store) ReleaseReservation(ctx context.Context, pool, networkName string, ip net.IP, podRef, containerID string) (string, error) {
	a := Allocation{Pool: pool, IP: ip, IPAllocation: whereaboutsv1alpha1.IPAllocation{PodRef: podRef, ContainerID: containerID}}
	o, err := s.getORIP(ctx, ORIPName(ip, networkName))
	if err != nil || o == nil || !ours(o, a) {
		return "", err
	}
	p, err := s.GetPool(ctx, pool)
	if err != nil {
		return "", err
	}
	if p != nil {
		if allocs, err := Allocations(p); err == nil {
			for _, cur := range allocs {
				if cur.IP.Equal(ip) && cur.PodRef == podRef {
					return "", nil // the pod holds the address again: its reservation is live
				}
			}
		}
	}
	return s.deleteORIP(ctx, o, a)
}
