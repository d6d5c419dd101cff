package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	whereaboutsv1alpha1 "github.com/k8snetworkplumbingwg/whereabouts/pkg/api/whereabouts.cni.cncf.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
	"github.com/harvester/harvester-ipam/testcni"
)

// auditWorld is the watch section's cluster: pods Longhorn instance
// managers, each on every network (a NAD of whereabouts, one pool each),
// its entry and its reservation in each, its network-status naming them: a
// world in agreement, as BenchmarkJudge's.
type auditWorld struct {
	pods, nets int
	node       string
}

const auditBenchNS = "longhorn-system"

// net is network n: its NAD and range. No network_name: whereabouts'
// reconciler reads a named reservation's address from its name with the
// name's dashes as colons, finds no live pod at that, and deletes the
// reservations of live pods (docs/history/testing-log-2026.md; the audit
// reports each, EntryReservationMismatch): a world whereabouts keeps in
// agreement has none.
func (w auditWorld) net(n int) (nad, rng string) {
	return fmt.Sprintf("bench-audit-net%d", n), fmt.Sprintf("10.%d.0.0/18", 200+n)
}

func (w auditWorld) pod(i int) string { return fmt.Sprintf("ab-im-%05d", i) }

// auditWatch runs harvester-ipam's reconciler as the chart's Deployment
// does (a pass every --interval, the audit watching pods, pools,
// reservations and NADs) beside whereabouts v0.9.4's own controllers as
// Harvester runs them (ip-control-loop, its DaemonSet's, watching the
// node's pods; its reconciler, its Deployment's, on a cron of every minute
// here, its default being daily), on one auditWorld: quiet for a while
// from their start, then with one pod a second touched (a label changed:
// an update every watcher sees). Each process's CPU seconds (utime+stime)
// in each phase and its peak RSS (VmHWM), and the ratios.
func (b *bencher) auditWatch(ctx context.Context) error {
	w := auditWorld{pods: envInt("BENCH_AUDIT_PODS", 1000), nets: envInt("BENCH_AUDIT_NETWORKS", 10), node: "bench-audit-node"}
	quiet := time.Duration(envInt("BENCH_AUDIT_QUIET_SECONDS", 120)) * time.Second
	churn := time.Duration(envInt("BENCH_AUDIT_CHURN_SECONDS", 120)) * time.Second
	fmt.Printf("## The audit's watch: the reconciler's Deployment beside whereabouts v0.9.4's controllers (%d pods on %d networks: %d entries, %d reservations)\n\n",
		w.pods, w.nets, w.pods*w.nets, w.pods*w.nets)
	built := time.Now()
	if err := b.buildAuditWorld(ctx, w); err != nil {
		return fmt.Errorf("audit watch: the world: %w", err)
	}
	fmt.Printf("(the world built in %s)\n\n", time.Since(built).Round(time.Second))
	parts, err := b.rig.StartWhereaboutsParts(ctx, testcni.PartsOptions{Version: testcni.V094, Node: w.node, Cron: "* * * * *"})
	if err != nil {
		return err
	}
	defer parts.Stop()
	ours, metrics, err := b.startWatchingReconciler(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = ours.Process.Kill(); _ = ours.Wait() }()
	start := time.Now()
	for !strings.Contains(metrics(), "harvester_ipam_audit_findings{") {
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("audit watch: the audit did not look within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("(the audit's first look %s after the reconciler started)\n\n", time.Since(start).Round(100*time.Millisecond))
	pids := []int{ours.Process.Pid, parts.Pid("ip-control-loop"), parts.Pid("reconciler")}
	time.Sleep(time.Until(start.Add(quiet)))
	atQuiet, _, err := procCosts(pids)
	if err != nil {
		return err
	}
	for i := 0; time.Since(start) < quiet+churn; i++ {
		patch := fmt.Sprintf(`{"metadata":{"labels":{"bench-touch":"%d"}}}`, i)
		if _, err := b.rig.Kube.CoreV1().Pods(auditBenchNS).Patch(ctx, w.pod(i%w.pods), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return err
		}
		time.Sleep(time.Second)
	}
	atEnd, hwm, err := procCosts(pids)
	if err != nil {
		return err
	}
	m := metrics()
	if n := openFindings(m); n != 0 {
		return fmt.Errorf("audit watch: %d audit findings open on a world in agreement: the figures are of something else; the first:\n%s\nwhereabouts' reconciler's log ends:\n%s",
			n, b.openLines(10), tail(parts.Log("reconciler"), 15))
	}
	printAuditWatch(quiet, time.Since(start)-quiet, atQuiet, atEnd, hwm)
	fmt.Printf("harvester-ipam's passes: %s, the last %s s and %s API requests; no audit finding open (a world in agreement).\n\n",
		firstValue(m, "harvester_ipam_reconciler_passes_total"), firstValue(m, "harvester_ipam_reconciler_pass_duration_seconds"), firstValue(m, "harvester_ipam_reconciler_api_requests"))
	// Alone on the machine's cores now.
	parts.Stop()
	_ = ours.Process.Kill()
	return b.judgeBench(ctx)
}

// judgeBench prints audit's BenchmarkJudge: one look of the audit over
// 1,000 pods each on 10 networks (10,000 entries and reservations), a pure
// function of what it read.
func (b *bencher) judgeBench(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^$", "-bench", "^BenchmarkJudge$", "-benchmem", "./reconcile/audit")
	cmd.Dir = b.rig.Root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("audit's BenchmarkJudge: %w: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "BenchmarkJudge") {
			f := strings.Fields(line)
			if len(f) >= 8 {
				fmt.Printf("One look of the audit (`audit` BenchmarkJudge: 1,000 pods each on 10 networks, 10,000 entries and reservations): %.1f ms, %.1f MB, %s allocations.\n\n",
					parseFloat(f[2])/1e6, parseFloat(f[4])/1e6, f[6])
				return nil
			}
		}
	}
	return fmt.Errorf("audit's BenchmarkJudge printed no result: %s", out)
}

func parseFloat(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
}

// printAuditWatch prints the watch section's table and ratios: harvester-
// ipam's reconciler (0) against whereabouts' ip-control-loop (1) and
// reconciler (2).
func printAuditWatch(quiet, churn time.Duration, atQuiet, atEnd []time.Duration, hwm []int64) {
	whats := []string{"harvester-ipam-reconciler, Deployment mode (a pass every 1m, the audit watching)",
		"whereabouts v0.9.4 ip-control-loop (its DaemonSet's, one node's pods)",
		"whereabouts v0.9.4 reconciler (its Deployment's, cron every minute)"}
	fmt.Printf("| process | CPU, its start and %s quiet | CPU, %s with a pod touched a second | CPU, all %s | peak RSS |\n", quiet.Round(time.Second), churn.Round(time.Second), (quiet + churn).Round(time.Second))
	fmt.Println("|---|---|---|---|---|")
	row := func(what string, q, e time.Duration, h int64) {
		fmt.Printf("| %s | %.1f s | %.1f s (%.1f%% of a core) | %.1f s | %.1f MiB |\n", what, q.Seconds(), (e - q).Seconds(), 100*(e-q).Seconds()/churn.Seconds(), e.Seconds(), float64(h)/1024)
	}
	for i, what := range whats {
		row(what, atQuiet[i], atEnd[i], hwm[i])
	}
	wbQ, wbE, wbH := atQuiet[1]+atQuiet[2], atEnd[1]+atEnd[2], hwm[1]+hwm[2]
	row("whereabouts' two together", wbQ, wbE, wbH)
	fmt.Printf("\nRatios, harvester-ipam's reconciler to whereabouts' two: CPU %.2fx quiet, %.2fx with the churn, %.2fx in all; peak RSS %.2fx (to its reconciler alone: %.2fx).\n\n",
		ratio(atQuiet[0], wbQ), ratio(atEnd[0]-atQuiet[0], wbE-wbQ), ratio(atEnd[0], wbE), float64(hwm[0])/float64(wbH), float64(hwm[0])/float64(hwm[2]))
}

// procCosts is procCost of each pid.
func procCosts(pids []int) ([]time.Duration, []int64, error) {
	cpu, hwm := make([]time.Duration, len(pids)), make([]int64, len(pids))
	for i, pid := range pids {
		var err error
		if cpu[i], hwm[i], err = procCost(pid); err != nil {
			return nil, nil, fmt.Errorf("audit watch: process %d: %w", pid, err)
		}
	}
	return cpu, hwm, nil
}

// openLines are the first n "audit: open:" lines of the reconciler's log.
func (b *bencher) openLines(n int) string {
	logged, _ := os.ReadFile(filepath.Join(b.rig.Dir, "bench-audit-reconciler.log"))
	var open []string
	for _, line := range strings.Split(string(logged), "\n") {
		if strings.Contains(line, "audit: open:") && len(open) < n {
			open = append(open, line)
		}
	}
	return strings.Join(open, "\n")
}

// buildAuditWorld creates w's node, NADs, pools, reservations and pods.
func (b *bencher) buildAuditWorld(ctx context.Context, w auditWorld) error {
	if err := b.rig.CreateNode(ctx, w.node); err != nil {
		return err
	}
	for _, ns := range []string{testcni.HarvesterNamespace, auditBenchNS} {
		if err := b.rig.EnsureNamespace(ctx, ns); err != nil {
			return err
		}
	}
	type att struct{ nad, ip string }
	status := make([][]att, w.pods)
	var orips []whereaboutsv1alpha1.OverlappingRangeIPReservation
	for n := 0; n < w.nets; n++ {
		nad, rng := w.net(n)
		conf := fmt.Sprintf(`{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","ipam":{"type":"whereabouts","range":%q}}`, rng)
		if _, err := b.rig.Dynamic.Resource(testcni.NADResource).Namespace(testcni.HarvesterNamespace).Create(ctx, testcni.StorageNetworkNAD(nad, conf), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		first, _, _ := net.ParseCIDR(rng)
		allocs := make(map[string]whereaboutsv1alpha1.IPAllocation, w.pods)
		for i := 0; i < w.pods; i++ {
			off := strconv.Itoa(i + 1)
			a := whereaboutsv1alpha1.IPAllocation{PodRef: auditBenchNS + "/" + w.pod(i), ContainerID: fmt.Sprintf("ab-c%05d", i), IfName: "lhnet1"}
			allocs[off] = a
			ip, err := shim.OffsetIP(first, off)
			if err != nil {
				return err
			}
			orips = append(orips, whereaboutsv1alpha1.OverlappingRangeIPReservation{ObjectMeta: metav1.ObjectMeta{Name: names.Reservation(ip, "")},
				Spec: whereaboutsv1alpha1.OverlappingRangeIPReservationSpec{PodRef: a.PodRef, ContainerID: a.ContainerID, IfName: a.IfName}})
			status[i] = append(status[i], att{testcni.HarvesterNamespace + "/" + nad, ip.String()})
		}
		if _, err := b.rig.WB.WhereaboutsV1alpha1().IPPools(testcni.PoolNamespace).Create(ctx, &whereaboutsv1alpha1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: names.Pool(rng, "")}, Spec: whereaboutsv1alpha1.IPPoolSpec{Range: rng, Allocations: allocs}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	err := parallel(ctx, len(orips), 8, func(i int) error {
		_, err := b.rig.WB.WhereaboutsV1alpha1().OverlappingRangeIPReservations(testcni.PoolNamespace).Create(ctx, &orips[i], metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	return parallel(ctx, w.pods, 8, func(i int) error {
		asks := []map[string]string{}
		st := []map[string]any{{"name": "k8s-pod-network", "interface": "eth0", "ips": []string{"10.42.0.9"}, "default": true}}
		for _, a := range status[i] {
			ns, name, _ := strings.Cut(a.nad, "/")
			asks = append(asks, map[string]string{"namespace": ns, "name": name, "interface": "lhnet1"})
			st = append(st, map[string]any{"name": a.nad, "interface": "lhnet1", "ips": []string{a.ip}})
		}
		ab, _ := json.Marshal(asks)
		sb, _ := json.Marshal(st)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: auditBenchNS, Name: w.pod(i), Labels: map[string]string{"longhorn.io/component": "instance-manager"},
				Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": string(ab), testcni.NetworkStatusAnnotation: string(sb)}},
			Spec: corev1.PodSpec{NodeName: w.node, Containers: []corev1.Container{{Name: "m", Image: "registry.invalid/longhorn-instance-manager"}}},
		}
		created, err := b.rig.Kube.CoreV1().Pods(auditBenchNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.Phase = corev1.PodRunning
		_, err = b.rig.Kube.CoreV1().Pods(auditBenchNS).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
}

// startWatchingReconciler starts the reconciler as the chart's Deployment
// runs it (--interval 1m, metrics served), its log in the rig's dir; it
// returns the process and what its /metrics says now.
func (b *bencher) startWatchingReconciler(ctx context.Context) (*exec.Cmd, func() string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	log, err := os.Create(filepath.Join(b.rig.Dir, "bench-audit-reconciler.log"))
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, b.rig.ReconcilerBinary(), "--kubeconfig", b.rig.Kubeconfig, "--namespace", testcni.PoolNamespace,
		"--interval", "1m", "--metrics-addr", addr)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	metrics := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	return cmd, metrics, nil
}

// procCost is a running process's CPU time (utime+stime, at 100 ticks a
// second) and its peak RSS (VmHWM, KiB).
func procCost(pid int) (time.Duration, int64, error) {
	if pid == 0 {
		return 0, 0, fmt.Errorf("no process")
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command's name, which is in parentheses.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %q", pid, stat)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var hwm int64
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, hwm, nil
}

var findingRE = regexp.MustCompile(`(?m)^harvester_ipam_audit_findings\{[^}]*\} (\S+)$`)

// openFindings is the sum of harvester_ipam_audit_findings in a scrape.
func openFindings(metrics string) int {
	n := 0
	for _, m := range findingRE.FindAllStringSubmatch(metrics, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		n += int(v)
	}
	return n
}

// firstValue is the value of the first sample of name in a scrape.
func firstValue(metrics, name string) string {
	m := regexp.MustCompile(`(?m)^` + name + `(\{[^}]*\})? (\S+)$`).FindStringSubmatch(metrics)
	if m == nil {
		return "none"
	}
	return m[2]
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
