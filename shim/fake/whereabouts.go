package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/iphelpers"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// Whereabouts versions the model knows, as their source reads:
//   - v0.7.0 writes no ifname, allocates a new address for every sandbox,
//     skips an address whose reservation exists for anyone, and deallocates
//     the first entry of the container ID it finds;
//   - v0.8.0 writes the ifname, hands a sandbox the entry its pod and ifname
//     already hold (and keeps that entry's reservation), deallocates the first
//     entry of the container ID it finds;
//   - v0.9.3 as v0.8.0, but deallocates by container ID and ifname.
//
// Every version serialises ADD and DEL on the Lease "whereabouts", writes the
// pool before the reservation, and swallows every error of its DEL.
const (
	V093 = "v0.9.3"
	V080 = "v0.8.0"
	V070 = "v0.7.0"
)

// Whereabouts is whereabouts' ADD and DEL on an API, as Version behaves.
type Whereabouts struct {
	API       *API
	Version   string
	Namespace string
	// Options of the store whose Lease protocol stands for whereabouts'
	// elector (Clock and Random, chiefly); Identity and the Lease timing are
	// whereabouts' own.
	Options shim.Options
	// Pick chooses which of n entries of a container a v0.8.0 or v0.7.0 DEL
	// takes: whereabouts walks a list made from a map, in no set order. Nil
	// takes the lowest offset.
	Pick func(n int) int
	// Unreserved, when set, is told each address an ADD allocated and left
	// without its reservation, reservations on: an earlier range of the
	// ADD found the pod's own reservation at its address (whereabouts'
	// skipOverlappingRangeUpdate, v0.8.0 to v0.9.4), whereabouts' own bug.
	Unreserved func(ip net.IP)
}

// Request is one ADD or DEL, as whereabouts reads it from its config and
// the CNI environment.
type Request struct {
	ContainerID, IfName, PodRef string
	// Range and Exclude are the config's range and its exclude ("" when it
	// has ipRanges alone).
	Range   string
	Exclude []string
	// IPRanges are the config's ipRanges: whereabouts' loader puts Range
	// first, then these (pkg/config LoadIPAMConfig), one pool each.
	IPRanges    []Range
	NetworkName string
	// NoOverlapping is enable_overlapping_ranges: false.
	NoOverlapping bool
}

// Range is one of a config's ipRanges: its CIDR and its own exclude.
type Range struct {
	Range   string   `json:"range"`
	Exclude []string `json:"exclude"`
}

// ranges are the request's ranges in the order whereabouts allocates from
// them.
func (r Request) ranges() []Range {
	var out []Range
	if r.Range != "" {
		out = append(out, Range{Range: r.Range, Exclude: r.Exclude})
	}
	return append(out, r.IPRanges...)
}

func (w *Whereabouts) store(podRef string) *shim.Store {
	o := w.Options
	o.Identity, o.LeaseSeconds, o.LeaseRetry = podRef, 1, 500*time.Millisecond
	return shim.New(w.API, w.Namespace, o)
}

func (w *Whereabouts) newer() bool { return w.Version != V070 }

// ErrRangeFull is the error of an ADD that finds no free address.
const ErrRangeFull = "Could not allocate IP in range"

// Add allocates an address for the request, or fails as whereabouts does:
// the first range's (AddAll has every range's).
func (w *Whereabouts) Add(ctx context.Context, r Request) (net.IP, error) {
	ips, err := w.AddAll(ctx, r)
	if len(ips) == 0 {
		return nil, err
	}
	return ips[0], err
}

// AddAll allocates an address in each of the request's ranges, in order,
// in one turn under the Lease, as whereabouts' IPManagement does: a range
// that fails ends the ADD, and what the ranges before it wrote stays (no
// roll-back). It returns the addresses allocated so far.
func (w *Whereabouts) AddAll(ctx context.Context, r Request) ([]net.IP, error) {
	var ips []net.IP
	err := w.store(r.PodRef).Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
		// whereabouts' skipOverlappingRangeUpdate is one variable for the
		// whole loop over the ranges, never reset: once a range finds the
		// pod's own reservation at its address, no later range creates
		// one (v0.8.0 to v0.9.4).
		skip := false
		for _, rng := range r.ranges() {
			ip, err := w.add(ctx, l, r, rng, &skip)
			if err != nil {
				return err
			}
			ips = append(ips, ip)
		}
		if len(ips) == 0 {
			return errors.New("no range")
		}
		return nil
	})
	return ips, err
}

// add is whereabouts' ADD in one range, holding the Lease (its elector
// renews it meanwhile: l.Keep before each request stands for that);
// skipReservation is its skipOverlappingRangeUpdate, across the ranges.
func (w *Whereabouts) add(ctx context.Context, l *shim.Locked, r Request, rng Range, skipReservation *bool) (net.IP, error) {
	_, ipnet, err := net.ParseCIDR(rng.Range)
	if err != nil {
		return nil, fmt.Errorf("invalid range %q: %w", rng.Range, err)
	}
	poolName := names.Pool(rng.Range, r.NetworkName)
	var chosen net.IP
	var found bool
	for attempt := 0; attempt < 100; attempt++ {
		if err := l.Keep(ctx); err != nil {
			return nil, err
		}
		p, err := w.API.GetPool(ctx, w.Namespace, poolName, shim.Fresh)
		if apierrors.IsNotFound(err) {
			_, err = w.API.CreatePool(context.Background(), w.Namespace, &shim.Pool{ObjectMeta: metav1.ObjectMeta{Name: poolName},
				Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng.Range, Allocations: map[string]whereaboutsv1alpha1.IPAllocation{}}})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("k8s create error: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("k8s get error: %w", err)
		}
		if p.Spec.Allocations == nil {
			p.Spec.Allocations = map[string]whereaboutsv1alpha1.IPAllocation{}
		}
		// found: this range's address has the pod's own reservation.
		chosen, found = nil, false
		reserved := map[string]bool{}
		for _, off := range sortedOffsets(p) {
			a := p.Spec.Allocations[off]
			ip, err := shim.OffsetIP(ipnet.IP, off)
			if err != nil {
				continue
			}
			reserved[ip.String()] = true
			if w.newer() && a.PodRef == r.PodRef && a.IfName == r.IfName && chosen == nil {
				chosen = ip // the pod's address on this interface: the sandbox takes it over
				a.ContainerID = r.ContainerID
				p.Spec.Allocations[off] = a
			}
		}
		for ip := iphelpers.IncIP(ipnet.IP); chosen == nil && ipnet.Contains(ip) && !isBroadcast(ip, ipnet); ip = iphelpers.IncIP(ip) {
			if reserved[ip.String()] || excluded(ip, rng.Exclude) {
				continue
			}
			if !r.NoOverlapping {
				if err := l.Keep(ctx); err != nil {
					return nil, err
				}
				o, err := w.API.GetReservation(ctx, w.Namespace, names.Reservation(ip, r.NetworkName))
				if err != nil && !apierrors.IsNotFound(err) {
					return nil, fmt.Errorf("k8s get OverlappingRangeIPReservation error: %w", err)
				}
				if o != nil && (!w.newer() || o.Spec.PodRef != r.PodRef) {
					continue // held in an overlapping range
				}
				found = o != nil
			}
			chosen = ip
			off, _ := iphelpers.IPGetOffset(ip, ipnet.IP)
			a := whereaboutsv1alpha1.IPAllocation{ContainerID: r.ContainerID, PodRef: r.PodRef}
			if w.newer() {
				a.IfName = r.IfName
			}
			p.Spec.Allocations[strconv.FormatUint(off, 10)] = a
		}
		if chosen == nil {
			return nil, fmt.Errorf("%s %s", ErrRangeFull, rng.Range)
		}
		if w.newer() && !r.NoOverlapping && !found {
			// whereabouts looks at the reservation of a reused address too.
			o, err := w.API.GetReservation(ctx, w.Namespace, names.Reservation(chosen, r.NetworkName))
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("k8s get OverlappingRangeIPReservation error: %w", err)
			}
			found = o != nil && o.Spec.PodRef == r.PodRef
		}
		if err := l.Keep(ctx); err != nil {
			return nil, err
		}
		_, err = w.API.UpdatePool(w.Namespace, p)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("IPAM error updating pool: %w", err)
		}
		break
	}
	if chosen == nil {
		return nil, fmt.Errorf("%s %s: the pool kept changing", ErrRangeFull, rng.Range)
	}
	if !r.NoOverlapping && *skipReservation && !found && w.Unreserved != nil {
		// An earlier range found the pod's own reservation: this range's
		// address gets none.
		w.Unreserved(chosen)
	}
	*skipReservation = *skipReservation || found
	if !r.NoOverlapping && !*skipReservation {
		if err := l.Keep(ctx); err != nil {
			return nil, err
		}
		spec := whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: r.PodRef}
		if w.newer() {
			spec.IfName = r.IfName
		} else {
			spec.ContainerID = r.ContainerID
		}
		_, err := w.API.CreateReservation(context.Background(), w.Namespace, &shim.Reservation{ObjectMeta: metav1.ObjectMeta{Name: names.Reservation(chosen, r.NetworkName)}, Spec: spec})
		if err != nil {
			// whereabouts does not undo the pool write: the entry stays.
			return nil, fmt.Errorf("error performing UpdateOverlappingRangeAllocation: %w", err)
		}
	}
	return chosen, nil
}

// Del deallocates the request's entry in each range, in order; like
// whereabouts it never fails, and it stops at the first range without an
// entry of the container ("Do not fail if allocation was not found":
// IPManagement returns there, the later ranges' entries left).
func (w *Whereabouts) Del(ctx context.Context, r Request) {
	_ = w.store(r.PodRef).Locked(ctx, func(ctx context.Context, l *shim.Locked) error {
		for _, rng := range r.ranges() {
			if !w.del(ctx, l, r, rng) {
				break
			}
		}
		return nil
	})
}

// del deallocates in one range; false when whereabouts' DEL ends there.
func (w *Whereabouts) del(ctx context.Context, l *shim.Locked, r Request, rng Range) bool {
	_, ipnet, err := net.ParseCIDR(rng.Range)
	if err != nil {
		return false
	}
	poolName := names.Pool(rng.Range, r.NetworkName)
	var gone net.IP
	for attempt := 0; attempt < 100; attempt++ {
		if l.Keep(ctx) != nil {
			return false // swallowed
		}
		p, err := w.API.GetPool(ctx, w.Namespace, poolName, shim.Fresh)
		if err != nil {
			return false // swallowed
		}
		var matches []string
		for _, off := range sortedOffsets(p) {
			a := p.Spec.Allocations[off]
			if a.ContainerID == r.ContainerID && (w.Version != V093 || a.IfName == r.IfName) {
				matches = append(matches, off)
			}
		}
		if len(matches) == 0 {
			return false
		}
		i := 0
		if w.Pick != nil && w.Version != V093 {
			i = w.Pick(len(matches))
		}
		off := matches[i]
		gone, _ = shim.OffsetIP(ipnet.IP, off)
		delete(p.Spec.Allocations, off)
		if l.Keep(ctx) != nil {
			return false // swallowed
		}
		_, err = w.API.UpdatePool(w.Namespace, p)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return false // swallowed
		}
		break
	}
	if gone != nil && !r.NoOverlapping {
		if l.Keep(ctx) != nil {
			return false
		}
		_ = w.API.DeleteReservation(ctx, w.Namespace, names.Reservation(gone, r.NetworkName), shim.Preconditions{}) // swallowed
	}
	return true
}

func sortedOffsets(p *shim.Pool) []string {
	offs := make([]string, 0, len(p.Spec.Allocations))
	for off := range p.Spec.Allocations {
		offs = append(offs, off)
	}
	sort.Slice(offs, func(i, j int) bool {
		a, _ := strconv.ParseUint(offs[i], 10, 64)
		b, _ := strconv.ParseUint(offs[j], 10, 64)
		return a < b
	})
	return offs
}

func isBroadcast(ip net.IP, n *net.IPNet) bool {
	if ip.To4() == nil {
		return false
	}
	b := make(net.IP, 4)
	for i := range b {
		b[i] = n.IP.To4()[i] | ^n.Mask[len(n.Mask)-4+i]
	}
	return ip.Equal(b)
}

func excluded(ip net.IP, excludes []string) bool {
	for _, x := range excludes {
		if _, n, err := net.ParseCIDR(x); err == nil && n.Contains(ip) {
			return true
		}
		if e := net.ParseIP(x); e != nil && e.Equal(ip) {
			return true
		}
	}
	return false
}

// Delegate is whereabouts as a CNI binary the plugin delegates to
// (invoke.Exec): it reads its config and environment as whereabouts does.
type Delegate struct {
	WB *Whereabouts
	// Calls are "VERB name" of every call, in order.
	Calls []string
	// Stdins are the config bytes of every call, in order.
	Stdins [][]byte
	// Before, when set, runs at the start of every call: a test's knob.
	Before func(verb string) error
	// Skip, when it says so, makes a call succeed without doing anything:
	// whereabouts' DEL when its storage fails.
	Skip func(verb string) bool
}

func (d *Delegate) FindInPath(plugin string, _ []string) (string, error) {
	return "/opt/cni/bin/" + plugin, nil
}

func (d *Delegate) Decode([]byte) (version.PluginInfo, error) {
	// whereabouts answers every version (version.All), as the plugin does.
	return version.All, nil
}

func (d *Delegate) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	verb := env["CNI_COMMAND"]
	d.Calls = append(d.Calls, verb+" "+path[strings.LastIndex(path, "/")+1:])
	d.Stdins = append(d.Stdins, stdin)
	if d.Before != nil {
		if err := d.Before(verb); err != nil {
			return nil, err
		}
	}
	if d.Skip != nil && d.Skip(verb) {
		return nil, nil
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		IPAM       struct {
			Type        string   `json:"type"`
			Range       string   `json:"range"`
			Exclude     []string `json:"exclude"`
			IPRanges    []Range  `json:"ipRanges"`
			NetworkName string   `json:"network_name"`
			Overlapping *bool    `json:"enable_overlapping_ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, &types.Error{Code: types.ErrDecodingFailure, Msg: err.Error()}
	}
	r := Request{ContainerID: env["CNI_CONTAINERID"], IfName: env["CNI_IFNAME"], Range: conf.IPAM.Range,
		Exclude: conf.IPAM.Exclude, IPRanges: conf.IPAM.IPRanges, NetworkName: conf.IPAM.NetworkName,
		NoOverlapping: conf.IPAM.Overlapping != nil && !*conf.IPAM.Overlapping}
	var ns, name string
	for _, kv := range strings.Split(env["CNI_ARGS"], ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			ns = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	r.PodRef = ns + "/" + name
	switch verb {
	case "ADD":
		if name == "" {
			return nil, &types.Error{Code: types.ErrInternal, Msg: "IPAM client initialization error: no pod name"}
		}
		ips, err := d.WB.AddAll(ctx, r)
		if err != nil {
			return nil, &types.Error{Code: types.ErrInternal, Msg: err.Error()}
		}
		res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
		for i, rng := range r.ranges() {
			_, n, _ := net.ParseCIDR(rng.Range)
			res.IPs = append(res.IPs, &current.IPConfig{Address: net.IPNet{IP: ips[i], Mask: n.Mask}})
		}
		out, err := res.GetAsVersion(conf.CNIVersion) // as whereabouts prints it
		if err != nil {
			return nil, &types.Error{Code: types.ErrIncompatibleCNIVersion, Msg: err.Error()}
		}
		return json.Marshal(out)
	case "DEL":
		d.WB.Del(ctx, r)
		return nil, nil
	case "CHECK":
		return nil, &types.Error{Code: types.ErrInternal, Msg: "CNI CHECK method is not implemented"}
	}
	return nil, nil // STATUS and GC: no-ops
}
