package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEquivalentsMatchByFileMutatorAndSource(t *testing.T) {
	es, err := parseEquivalents(strings.NewReader(`
# a comment
shim/clock.go  CONDITIONALS_BOUNDARY  `+"`if b.Cap > 0 &&   d > float64(b.Cap) {`"+`  a reason, with `+"`code`"+` in it
`), "eq.txt")
	require.NoError(t, err)
	require.Len(t, es.list, 1)
	e := es.list[0]
	assert.Equal(t, "if b.Cap > 0 && d > float64(b.Cap) {", e.text)
	assert.Equal(t, "a reason, with `code` in it", e.reason)
	assert.Equal(t, 3, e.lineNo)

	m := mutant{file: "shim/clock.go", line: 99, mutator: "CONDITIONALS_BOUNDARY", text: "if b.Cap > 0 && d > float64(b.Cap) {"}
	assert.Same(t, e, es.match(m), "wherever the line moved")
	for _, other := range []mutant{
		{file: "shim/store.go", mutator: m.mutator, text: m.text},
		{file: m.file, mutator: "CONDITIONALS_NEGATION", text: m.text},
		{file: m.file, mutator: m.mutator, text: "if b.Cap > 0 && d >= float64(b.Cap) {"},
	} {
		assert.Nil(t, es.match(other), "%+v", other)
	}
	assert.Empty(t, es.stale([]row{{pkg: "shim"}}))
	assert.Empty(t, (&equivalents{list: []*equivalent{{file: "conf/x.go"}}}).stale([]row{{pkg: "shim"}}), "not measured: not stale")
	assert.Len(t, (&equivalents{list: []*equivalent{{file: "shim/x.go"}}}).stale([]row{{pkg: "shim"}}), 1)
}

// A line can hold two mutants of one mutator, one equivalent and one a test
// kills: MUTATOR:COLUMN excuses only the one at that column.
func TestEquivalentsMatchAColumnWhenOneIsGiven(t *testing.T) {
	es, err := parseEquivalents(strings.NewReader("reconcile/nads.go  CONDITIONALS_BOUNDARY:37  `if s.Cmp(lo) >= 0 && s.Cmp(hi) <= 0 {`  at s == lo, lo = s changes nothing\n"), "eq.txt")
	require.NoError(t, err)
	require.Len(t, es.list, 1)
	at := func(col int) mutant {
		return mutant{file: "reconcile/nads.go", line: 179, column: col, mutator: "CONDITIONALS_BOUNDARY", text: "if s.Cmp(lo) >= 0 && s.Cmp(hi) <= 0 {"}
	}
	assert.Same(t, es.list[0], es.match(at(37)))
	assert.Nil(t, es.match(at(55)), "the other mutant of the line is not excused")
	for _, bad := range []string{"CONDITIONALS_BOUNDARY:", "CONDITIONALS_BOUNDARY:x", "CONDITIONALS_BOUNDARY:0"} {
		_, err := parseEquivalent("shim/x.go " + bad + " `if x {` why")
		assert.Error(t, err, bad)
	}
}

func TestEquivalentsRefuseWhatTheyCannotMatch(t *testing.T) {
	for _, line := range []string{
		"shim/clock.go CONDITIONALS_BOUNDARY",
		"shim/clock.go CONDITIONALS_BOUNDARY if x { no quotes",
		"shim/clock.go CONDITIONALS_BOUNDARY `if x {`",
	} {
		_, err := parseEquivalent(line)
		assert.Error(t, err, line)
	}
}

func TestScores(t *testing.T) {
	r := row{killed: 9, timedOut: 3, lived: 1, notCovered: 1, viable0: 2}
	assert.InDelta(t, 90.0, r.efficacy(), 0.01, "timed out and not viable count in neither")
	assert.InDelta(t, 100*10/11.0, r.coverage(), 0.01)
	assert.Equal(t, 100.0, row{}.efficacy())
}

// The go wrapper narrows gremlins' coverage run to the package and turns
// vet off in test runs; anything else goes through as it is.
func TestGoWrapper(t *testing.T) {
	dir := t.TempDir()
	// The wrapper over a `go` that prints its arguments.
	fakeGo := filepath.Join(dir, "fake go")
	require.NoError(t, os.WriteFile(fakeGo, []byte("#!/bin/sh\necho \"$@\"\n"), 0o755))
	with, err := parseWith("install/standin=install/standin/model+install/standin/other, shim/x=shim/y")
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"install/standin": {"install/standin/model", "install/standin/other"}, "shim/x": {"shim/y"}}, with)
	_, err = parseWith("install/standin")
	assert.Error(t, err)
	bin, err := writeGoWrapper(dir, fakeGo, 300*time.Millisecond, "github.com/x", with)
	require.NoError(t, err)
	wrapper := filepath.Join(bin, "go")
	for _, tt := range []struct{ args, want string }{
		{"test -cover -coverprofile /tmp/w/coverage ./shim/...", "test -vet=off -cover -coverprofile /tmp/w/coverage ./shim"},
		{"test -timeout 3s -failfast github.com/x/shim", "test -vet=off -timeout 3s -failfast github.com/x/shim"},
		// A package whose code other packages' tests run too: their tests
		// count, in coverage and in each mutant's run.
		{"test -cover -coverprofile /tmp/w/coverage ./install/standin/...",
			"test -vet=off -cover -coverprofile /tmp/w/coverage -coverpkg=./install/standin ./install/standin ./install/standin/model ./install/standin/other"},
		{"test -timeout 3s -failfast github.com/x/install/standin",
			"test -vet=off -timeout 3s -failfast github.com/x/install/standin github.com/x/install/standin/model github.com/x/install/standin/other"},
		{"test -timeout 3s -failfast ./install/standin", "test -vet=off -timeout 3s -failfast ./install/standin ./install/standin/model ./install/standin/other"},
		{"test -timeout 3s -failfast github.com/x/install/standin/model", "test -vet=off -timeout 3s -failfast github.com/x/install/standin/model"},
		{"mod download", "mod download"},
	} {
		start := time.Now()
		out, err := exec.Command(wrapper, strings.Fields(tt.args)...).Output()
		require.NoError(t, err, tt.args)
		assert.Equal(t, tt.want, strings.TrimSpace(string(out)))
		if strings.Contains(tt.args, "-coverprofile") {
			assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "the coverage run lasts the floor")
		}
	}
}
