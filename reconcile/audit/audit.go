// Package audit judges whether the addresses of every network whose IPAM is
// whereabouts agree: the pools' entries, the reservations, and what Multus
// wrote on each pod (its network-status), against what each pod asked for
// (its networks annotation). It reads a Snapshot and returns Findings; it
// never writes anything, anywhere. Releasing leaks stays the reconciler's
// (shim/reconcile), with its own rules.
//
// A finding of one look may be a moment in flight (an ADD between its pool
// entry and Multus' network-status, a DEL between its reservation and its
// entry, a pod being deleted): Tracker keeps only what is seen in two looks
// and for longer than its kind's grace. The rules and graces are in
// docs/audit.md.
package audit

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/harvester/harvester-ipam/reconcile"
	"github.com/harvester/harvester-ipam/shim"
)

// Kind is what a finding says is wrong.
type Kind string

const (
	// SharedAddress: two Running pods hold one address of one network (their
	// pool entries or network-status name it), across overlapping pools too.
	SharedAddress Kind = "SharedAddress"
	// MissingAddress: a Running pod asks for the network in its networks
	// annotation and its network-status has no address on it (Harvester
	// issue #11639: Multus not ready when the pod's sandbox was made).
	MissingAddress Kind = "MissingAddress"
	// PodPoolMismatch: a Running pod's network-status address is not its
	// entry in the network's pools, or its attachments' entries name
	// different sandboxes.
	PodPoolMismatch Kind = "PodPoolMismatch"
	// EntryReservationMismatch: an entry without its reservation, or a
	// reservation held by another pod than the entry at its address.
	EntryReservationMismatch Kind = "EntryReservationMismatch"
	// Headroom: the network's free addresses are no more than its Longhorn
	// pods need (Need).
	Headroom Kind = "Headroom"
)

// Kinds are every kind, in the order they are reported.
var Kinds = []Kind{SharedAddress, MissingAddress, PodPoolMismatch, EntryReservationMismatch, Headroom}

// Finding is one thing wrong, for people: where, who, what to do.
type Finding struct {
	Kind Kind
	// Network is the NAD (namespace/name) whose addresses disagree; NoNAD
	// when no NAD names the pool.
	Network string
	Pool    string
	Address string
	// Pods are the pods concerned (namespace/name); the first is the one an
	// Event goes on. None for Headroom, whose Event goes on the pool.
	Pods []string
	// Message says what is wrong and what to do; Command is the one command
	// to run next.
	Message string
	Command string
	// SubjectUID is the UID of the object an Event on the finding goes on
	// (its first pod, or its pool): kubectl describe selects an object's
	// Events by its UID. Empty when the snapshot did not hold it.
	SubjectUID types.UID
	// Free and Need are Headroom's figures (and, for every network with
	// Longhorn pods on it, Figures'); zero otherwise.
	Free, Need int64
	// detail tells apart two findings of one place whose holders changed
	// (another container, another reservation): a change of hands is seen
	// anew, its grace started again.
	detail string
}

// Key identifies a finding across looks.
func (f Finding) Key() string {
	return strings.Join([]string{string(f.Kind), f.Network, f.Pool, f.Address, strings.Join(f.Pods, ","), f.detail}, "|")
}

// Subject is the pod (namespace, name) an Event on the finding goes on; ""
// when it goes on the pool.
func (f Finding) Subject() (namespace, name string) {
	if len(f.Pods) == 0 {
		return "", ""
	}
	ns, n, _ := strings.Cut(f.Pods[0], "/")
	return ns, n
}

// subjectUID is the UID of the object f's Event goes on.
func (x *index) subjectUID(f Finding) types.UID {
	if len(f.Pods) > 0 {
		if p := x.pods[f.Pods[0]]; p != nil {
			return p.UID
		}
		return ""
	}
	for _, p := range x.pools {
		if p.Name == f.Pool {
			return p.UID
		}
	}
	return ""
}

// NoNAD is the network of a pool no NAD names.
const NoNAD = "none"

// Snapshot is what one look read.
type Snapshot struct {
	// NADs are every NetworkAttachmentDefinition; NADsErr is why they could
	// not be listed (then nothing that needs them is judged).
	NADs    []reconcile.NAD
	NADsErr error
	// PoolNamespace is where Pools and Reservations are: every one of them.
	PoolNamespace string
	Pools         []shim.Pool
	Reservations  []shim.Reservation
	// Pods are every pod of the cluster (what TrimPod keeps of each is enough).
	Pods []*corev1.Pod
	// Nodes counts the nodes; negative when unknown.
	Nodes int
}

// Options are what the judge needs beside the snapshot.
type Options struct {
	// Diagnose is the command that runs harvester-ipam-reconciler where an
	// operator can, without its subcommand; the default is the chart's
	// diagnostics container in kube-system.
	Diagnose string
	// LonghornNamespace is where Longhorn's pods run (longhorn-system).
	LonghornNamespace string
}

// DefaultDiagnose runs the reconciler in the chart's diagnostics container.
const DefaultDiagnose = "kubectl -n kube-system exec ds/harvester-ipam -c diagnostics -- harvester-ipam-reconciler"

func (o Options) withDefaults() Options {
	if o.Diagnose == "" {
		o.Diagnose = DefaultDiagnose
	}
	if o.LonghornNamespace == "" {
		o.LonghornNamespace = "longhorn-system"
	}
	return o
}

// Result is what one look found: the findings, and the figures of each
// network with Longhorn pods on it (Headroom's, shown whether short or not).
type Result struct {
	Findings []Finding
	Figures  []Figures
	// Networks are the NADs whose IPAM is whereabouts, judged.
	Networks []string
	// Errors are what could not be judged (a pool whose entries do not
	// parse, NADs unknown); the rest was.
	Errors []error
}

// Figures are a network's free addresses and what its Longhorn pods need.
type Figures struct {
	Network    string
	Free, Need int64
}

// Judge looks once at a snapshot. Every finding is a candidate: Tracker
// decides when it is open.
func Judge(s Snapshot, o Options) Result {
	o = o.withDefaults()
	x, errs := newIndex(s)
	var out Result
	out.Errors = errs
	out.Findings = append(out.Findings, x.shared(o)...)
	out.Findings = append(out.Findings, x.missing(o)...)
	out.Findings = append(out.Findings, x.mismatched(o)...)
	out.Findings = append(out.Findings, x.reservations(o)...)
	heads, figs := x.headroom(s.Nodes, o)
	out.Findings = append(out.Findings, heads...)
	out.Figures = figs
	for i := range out.Findings {
		out.Findings[i].SubjectUID = x.subjectUID(out.Findings[i])
	}
	for ref := range x.nets {
		out.Networks = append(out.Networks, ref)
	}
	sort.Strings(out.Networks)
	sortFindings(out.Findings)
	return out
}

func sortFindings(fs []Finding) {
	order := map[Kind]int{}
	for i, k := range Kinds {
		order[k] = i
	}
	sort.SliceStable(fs, func(i, j int) bool {
		a, b := fs[i], fs[j]
		if a.Kind != b.Kind {
			return order[a.Kind] < order[b.Kind]
		}
		return a.Key() < b.Key()
	})
}

// deletePod is the command that gives a pod a new sandbox.
func deletePod(ref string) string {
	ns, name, _ := strings.Cut(ref, "/")
	return fmt.Sprintf("kubectl -n %s delete pod %s", ns, name)
}

// Open is a finding seen in two looks and for longer than its grace.
type Open struct {
	Finding
	// Since is its first sighting.
	Since time.Time
}
