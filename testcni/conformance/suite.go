// Package conformance runs whereabouts' own end-to-end suites, compiled from
// whereabouts' module as released (testcni/tools.sh conformance), against
// clusters of the rig's own: whereabouts alone (the baseline) and
// harvester-ipam standing in for it by the chart, on the exec path and with
// its node agent serving. Every spec runs alone (ginkgo's focus on its whole
// text) in its side's cluster, so that one spec's failure is that spec's;
// the sides share nothing and run side by side.
package conformance

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Suite is one of whereabouts' end-to-end suites of one version: a test
// binary of its e2e/ (Name "e2e") or e2e/e2e_node_slice ("e2e_node_slice").
type Suite struct {
	Name    string
	Version string
	Binary  string
}

func (s Suite) String() string { return "whereabouts " + s.Version + " " + s.Name }

// Spec is one spec of a suite: its whole text (its containers' texts and
// its own, joined by spaces, as ginkgo matches a focus against) and where
// it is in whereabouts' source.
type Spec struct {
	Text     string
	Location string
}

// Specs lists the suite's specs in the order the binary lists them (a dry
// run: nothing runs, no cluster is needed).
func (s Suite) Specs(ctx context.Context) ([]Spec, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Binary, "-ginkgo.dryRun", "-ginkgo.v", "-ginkgo.noColor")
	// Its BeforeEach reads KUBECONFIG only when a spec runs.
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: list its specs (%s -ginkgo.dryRun): %w: %s", s, s.Binary, err, tail(out, 20))
	}
	specs, err := parseSpecs(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, err)
	}
	return specs, nil
}

// parseSpecs reads ginkgo v1's verbose dry run: each spec a block between
// separator lines, its containers' texts on the first line, its own text
// indented on the next, then its location.
func parseSpecs(out []byte) ([]Spec, error) {
	var specs []Spec
	var block []string
	flush := func() {
		defer func() { block = block[:0] }()
		if len(block) < 3 || !strings.HasPrefix(block[1], "  ") || !strings.HasPrefix(block[2], "  ") {
			return
		}
		specs = append(specs, Spec{
			Text:     strings.TrimSpace(block[0]) + " " + strings.TrimSpace(block[1]),
			Location: strings.TrimSpace(block[2]),
		})
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	started := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Will run "):
			started = true
			block = block[:0]
		case !started:
		case strings.HasPrefix(line, "-----"):
			flush()
		case strings.HasPrefix(line, "Ran "):
			flush()
			started = false
		case line == "" && len(block) == 0:
		default:
			block = append(block, line)
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no spec in its dry run:\n%s", tail(out, 20))
	}
	want := regexp.MustCompile(`Will run (\d+) of (\d+) specs`).FindSubmatch(out)
	if want != nil {
		if n, _ := strconv.Atoi(string(want[1])); n != len(specs) {
			return nil, fmt.Errorf("its dry run says it would run %d specs, %d read from it:\n%s", n, len(specs), tail(out, 20))
		}
	}
	return specs, nil
}

// Outcome is what one spec's run came to.
type Outcome string

const (
	Passed Outcome = "passed"
	Failed Outcome = "failed"
)

// Result is one spec's run on one side.
type Result struct {
	Spec    Spec
	Outcome Outcome
	// Why is the failure's first line (ginkgo's message), or what kept the
	// spec from running.
	Why  string
	Took time.Duration
	Log  string // the run's whole output, a file
	// Again says why the spec ran a second time on every side ("": once).
	Again string
}

// suiteConflict is the API server's answer to an update of an object that
// changed since it was read.
const suiteConflict = "Operation cannot be fulfilled on statefulsets.apps"

// LostItsOwnRace says whether a failed run is the suite's own write losing a
// race, not an assertion failing: whereabouts' test client scales a
// StatefulSet by reading it and updating it with no retry on a conflict
// (ScaleStatefulSet), and the StatefulSet controller's status write between
// the two makes the API server refuse the update (409). The spec's claim
// was not put to the test on that side; it runs again, on every side, once.
func LostItsOwnRace(r Result) bool {
	if r.Outcome != Failed {
		return false
	}
	if strings.Contains(r.Why, suiteConflict) {
		return true
	}
	out, err := os.ReadFile(r.Log)
	return err == nil && strings.Contains(failureReasonFull(out), suiteConflict)
}

// Run runs one spec alone against the cluster whose kubeconfig env names,
// and writes its output to a file in logDir.
func (s Suite) Run(ctx context.Context, spec Spec, env []string, logDir string, limit time.Duration) Result {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	// ginkgo v1 matches a focus against the suite's description, then
	// "[Top Level]", then the spec's whole text.
	focus := `\[Top Level\] ` + regexp.QuoteMeta(spec.Text) + "$"
	cmd := exec.CommandContext(ctx, s.Binary, "-ginkgo.focus="+focus, "-ginkgo.v", "-ginkgo.noColor", "-test.timeout="+limit.String())
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	r := Result{Spec: spec, Took: time.Since(start)}
	r.Log = filepath.Join(logDir, logName(spec.Text)+".log")
	if werr := os.WriteFile(r.Log, out, 0o644); werr != nil {
		err = errors.Join(err, werr)
	}
	r.Outcome, r.Why = judge(out, err, ctx.Err())
	return r
}

// judge reads one focused run: it passed when the binary exited 0 having
// run exactly one spec, which passed.
func judge(out []byte, err, ctxErr error) (Outcome, string) {
	sum := regexp.MustCompile(`(?m)^Ran (\d+) of (\d+) Specs?`).FindSubmatch(out)
	counts := regexp.MustCompile(`(\d+) Passed \| (\d+) Failed`).FindSubmatch(out)
	switch {
	case ctxErr != nil:
		return Failed, fmt.Sprintf("did not finish: %v", ctxErr)
	case sum == nil || counts == nil:
		return Failed, fmt.Sprintf("no ginkgo summary (%v): %s", err, firstLine(tail(out, 3)))
	case string(sum[1]) != "1":
		return Failed, fmt.Sprintf("the focus ran %s specs, not 1", sum[1])
	case err == nil && string(counts[1]) == "1" && string(counts[2]) == "0":
		return Passed, ""
	}
	return Failed, failureReason(out)
}

// failureReasonFull is failureReason unclipped.
func failureReasonFull(out []byte) string { return failureReasonN(out, 1<<20) }

// failureReason is ginkgo's failure message, on one line: the paragraph
// after the failed spec's texts and locations under "• Failure", else the
// last lines of the output.
func failureReason(out []byte) string { return failureReasonN(out, 240) }

func failureReasonN(out []byte, n int) string {
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if !strings.HasPrefix(t, "• Failure") && !strings.HasPrefix(t, "• [FAILED]") && !strings.HasPrefix(t, "• [PANICKED]") {
			continue
		}
		var msg []string
		blank := false
		for _, m := range lines[i+1:] {
			m = strings.TrimSpace(m)
			switch {
			case !blank:
				blank = m == ""
			case m == "" && len(msg) > 0:
				return clip(strings.Join(msg, " "), n)
			case m != "":
				msg = append(msg, m)
			}
		}
		if len(msg) > 0 {
			return clip(strings.Join(msg, " "), n)
		}
	}
	return clip(strings.ReplaceAll(tail(out, 3), "\n", " "), n)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func logName(text string) string {
	s := regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(text, "-")
	if len(s) > 120 {
		s = s[len(s)-120:]
	}
	return strings.Trim(s, "-")
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}
