package install

import (
	"fmt"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Place is where an installer stands in: the plugin's name, in the CNI bin
// dir at HostDir on the node Node ("" when not known: then that part is
// not checked).
type Place struct {
	Name, HostDir, Node string
}

// Verdict is whether the chart still stands in at a Place: what a stopping
// installer must know before it gives the name back.
type Verdict struct {
	// StandsIn: the chart's DaemonSet (its newest revision) still runs an
	// installer that stands in at the place, on this node.
	StandsIn bool
	Why      string
}

// Judge says whether ds, in namespace ns, stands in at p on node: ds nil is
// a DaemonSet that is gone; ns or node nil were not read (not checked).
func Judge(ds *appsv1.DaemonSet, ns *corev1.Namespace, node *corev1.Node, p Place) Verdict {
	switch {
	case ds == nil:
		return Verdict{false, "its DaemonSet is gone"}
	case ds.DeletionTimestamp != nil:
		return Verdict{false, fmt.Sprintf("its DaemonSet %s/%s is being deleted", ds.Namespace, ds.Name)}
	case ns != nil && ns.DeletionTimestamp != nil:
		return Verdict{false, fmt.Sprintf("its namespace %s is being deleted", ns.Name)}
	}
	what := fmt.Sprintf("DaemonSet %s/%s", ds.Namespace, ds.Name)
	name, dir := StandsInAt(ds.Spec.Template.Spec)
	switch {
	case name == "":
		return Verdict{false, what + " no longer stands in (its installer runs without --stand-in)"}
	case name != p.Name:
		return Verdict{false, fmt.Sprintf("%s stands in for %s now, not %s", what, name, p.Name)}
	case p.HostDir != "" && dir != "" && dir != filepath.Clean(p.HostDir):
		return Verdict{false, fmt.Sprintf("%s stands in in %s now, not %s", what, dir, p.HostDir)}
	}
	if node != nil {
		if ok, why := RunsOn(ds.Spec.Template.Spec, node); !ok {
			return Verdict{false, fmt.Sprintf("%s no longer runs on node %s (%s)", what, node.Name, why)}
		}
	}
	return Verdict{true, what + " still stands in for " + p.Name + " here"}
}

// StandsInAt reads a pod template as the chart renders it: the name its
// installer (harvester-ipam-install) stands in for ("" none), and the bin
// dir on the host it does so in ("" when it is not a hostPath).
func StandsInAt(spec corev1.PodSpec) (name, hostDir string) {
	for _, c := range spec.Containers {
		argv := append(append([]string{}, c.Command...), c.Args...)
		if !strings.Contains(strings.Join(argv, " "), "harvester-ipam-install") {
			continue
		}
		name = flagValue(argv, "stand-in")
		binDir := flagValue(argv, "cni-bin-dir")
		if binDir == "" {
			binDir = "/host/opt/cni/bin"
		}
		return name, hostPathOf(spec, c, binDir)
	}
	return "", ""
}

// flagValue is the last value of --flag (-flag, =value or a separate
// argument) in argv, as Go's flag package reads it.
func flagValue(argv []string, flag string) string {
	v := ""
	for i, a := range argv {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		switch {
		case strings.HasPrefix(a, flag+"="):
			v = strings.TrimPrefix(a, flag+"=")
		case a == flag && i+1 < len(argv):
			v = argv[i+1]
		}
	}
	return v
}

// hostPathOf is the host's path (clean) of path in container c: the
// hostPath volume mounted at it or at the deepest dir above it.
func hostPathOf(spec corev1.PodSpec, c corev1.Container, path string) string {
	best, rel, steps := "", "", -1
	for _, m := range c.VolumeMounts {
		r, err := filepath.Rel(m.MountPath, path) // cleans both
		if err != nil || r == ".." || strings.HasPrefix(r, "../") {
			continue
		}
		n := 0 // how far below the mount path is
		if r != "." {
			n = strings.Count(r, "/") + 1
		}
		if steps < 0 || n < steps {
			best, rel, steps = m.Name, r, n
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == best && v.HostPath != nil {
			return filepath.Join(v.HostPath.Path, rel)
		}
	}
	return ""
}

// RunsOn says whether the DaemonSet controller keeps a pod of a template on
// node (its NodeShouldRunDaemonPod's second answer): the template's node
// name, nodeSelector and required node affinity match the node, and no
// NoExecute taint of the node goes untolerated (every daemon pod tolerates
// not-ready and unreachable). A NoSchedule taint does not remove a pod
// that runs. why says what does not match.
func RunsOn(spec corev1.PodSpec, node *corev1.Node) (ok bool, why string) {
	if spec.NodeName != "" && spec.NodeName != node.Name {
		return false, "its pods are bound to node " + spec.NodeName
	}
	for k, v := range spec.NodeSelector {
		if got, ok := node.Labels[k]; !ok || got != v {
			return false, fmt.Sprintf("nodeSelector %s=%s", k, v)
		}
	}
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if !anyTermMatches(terms, node) {
			return false, "its required node affinity"
		}
	}
	tolerations := append(append([]corev1.Toleration{}, spec.Tolerations...),
		corev1.Toleration{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		corev1.Toleration{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	for _, taint := range node.Spec.Taints {
		if taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		tolerated := false
		for _, tol := range tolerations {
			if tol.ToleratesTaint(&taint) {
				tolerated = true
				break
			}
		}
		if !tolerated {
			return false, fmt.Sprintf("taint %s=%s:%s is not tolerated", taint.Key, taint.Value, taint.Effect)
		}
	}
	return true, ""
}

// anyTermMatches: node selector terms are ORed; a term's requirements are
// ANDed, and a term with none matches no node.
func anyTermMatches(terms []corev1.NodeSelectorTerm, node *corev1.Node) bool {
	for _, t := range terms {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			continue
		}
		ok := true
		for _, r := range t.MatchExpressions {
			ok = ok && requirementMatches(r, labels.Set(node.Labels))
		}
		for _, r := range t.MatchFields {
			ok = ok && requirementMatches(r, labels.Set{"metadata.name": node.Name})
		}
		if ok {
			return true
		}
	}
	return false
}

var operators = map[corev1.NodeSelectorOperator]selection.Operator{
	corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
	corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
}

// requirementMatches: a requirement that does not parse matches nothing,
// as the scheduler's does.
func requirementMatches(r corev1.NodeSelectorRequirement, set labels.Set) bool {
	op, ok := operators[r.Operator]
	if !ok {
		return false
	}
	req, err := labels.NewRequirement(r.Key, op, r.Values)
	return err == nil && req.Matches(set)
}
