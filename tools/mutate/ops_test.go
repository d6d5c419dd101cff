package main

import (
	"fmt"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each operator, on a small file: the mutants it makes (what it rewrote,
// into what, where), and each mutated file parses and holds the rewrite.
func TestOwnOperators(t *testing.T) {
	for _, tt := range []struct {
		name string
		body string // the body of func f(x int, s []string, e []string) ..., on line 4
		want []string
	}{{
		name: "a count compared with zero or one, shifted by one",
		body: "_ = len(s) == 0\n_ = x != 0\n_ = len(s) > 0\n_ = x >= 1\n_ = x < 1\n_ = x <= 0",
		want: []string{
			"4:12 COUNT_SHIFT `len(s) == 0` made `len(s) <= 1`",
			"5:7 COUNT_SHIFT `x != 0` made `x > 1`",
			"6:12 COUNT_SHIFT `len(s) > 0` made `len(s) > 1`",
			"7:7 COUNT_SHIFT `x >= 1` made `x >= 2`",
			"8:7 COUNT_SHIFT `x < 1` made `x < 2`",
			"9:7 COUNT_SHIFT `x <= 0` made `x <= 1`",
		},
	}, {
		name: "the constant on the left: the comparison turned round",
		body: "_ = 0 < len(s)\n_ = 2 == x",
		want: []string{
			"4:7 COUNT_SHIFT `0 < len(s)` made `len(s) > 1`",
			"5:7 COUNT_SHIFT `2 == x` made `x <= 3`",
		},
	}, {
		name: "no count: a mask's bit, two variables, a string, a constant",
		body: "_ = x&4 != 0\n_ = x == len(s)\n_ = e[0] == \"0\"\nconst c = len(\"ab\") > 0\n_ = c",
		want: nil,
	}, {
		// An element that uses a variable is moved to the end and cut off:
		// dropped from the source, the loop's v would be unused.
		name: "an element dropped from an append, each in turn; a spread dropped",
		body: "s = append(s, \"a\", \"b\")\ns = append(s, e...)\n_ = append(s)\nfor _, v := range e { s = append(s, v, K, strings.ToLower(\"B\")) }",
		want: []string{
			"4:15 DROP_ELEMENT `append(s, \"a\", \"b\")` made `append(s, \"b\")`",
			"4:20 DROP_ELEMENT `append(s, \"a\", \"b\")` made `append(s, \"a\")`",
			"5:15 DROP_ELEMENT `append(s, e...)` made `append(s, e...)[:len(s)]`",
			"7:37 DROP_ELEMENT `append(s, v, K, strings.ToLower(\"B\"))` made `append(s, K, strings.ToLower(\"B\"), v)[:len(s)+2]`",
			"7:40 DROP_ELEMENT `append(s, v, K, strings.ToLower(\"B\"))` made `append(s, v, strings.ToLower(\"B\"))`",
			"7:43 DROP_ELEMENT `append(s, v, K, strings.ToLower(\"B\"))` made `append(s, v, K)`",
			"7:43 RETURN_INPUT `strings.ToLower(\"B\")` made `\"B\"`",
		},
	}, {
		name: "an element dropped from an environment list",
		body: "e = []string{\"A=1\", \"B=2\"}\n_ = []int{1, 2}\ne = []string{\"A=1\", e[0]}",
		want: []string{
			"4:14 DROP_ELEMENT `[]string{\"A=1\", \"B=2\"}` made `[]string{\"B=2\"}`",
			"4:21 DROP_ELEMENT `[]string{\"A=1\", \"B=2\"}` made `[]string{\"A=1\"}`",
			"6:14 DROP_ELEMENT `[]string{\"A=1\", e[0]}` made `[]string{e[0]}`",
			"6:21 DROP_ELEMENT `[]string{\"A=1\", e[0]}` made `[]string{\"A=1\", e[0]}[:1]`",
		},
	}, {
		name: "a flag dropped from a bit mask, each side",
		body: "x = x | 4 | 8",
		want: []string{
			"4:13 DROP_FLAG `x | 4 | 8` made `x | 4`",
			"4:11 DROP_FLAG `x | 4 | 8` made `8`",
			"4:9 DROP_FLAG `x | 4` made `x`",
			"4:7 DROP_FLAG `x | 4` made `4`",
		},
	}, {
		name: "a standard call that returns its argument's type replaced by the argument",
		body: "_ = strings.TrimSpace(\"a\")\n_ = strings.Split(\"a\", \",\")\nstrings.ToLower(\"a\")",
		want: []string{
			"4:5 RETURN_INPUT `strings.TrimSpace(\"a\")` made `\"a\"`",
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			src := "package p\nimport \"strings\"\nfunc f(x int, s []string, e []string) {\n" + tt.body + "\n}\nvar _ = strings.ToLower\nconst K = \"k\"\n"
			ms, err := mutate("p.go", []byte(src), map[string]bool{"K": true})
			require.NoError(t, err)
			var got []string
			for _, m := range ms {
				got = append(got, describe(m))
				_, err := parser.ParseFile(token.NewFileSet(), "m.go", m.Src, 0)
				require.NoError(t, err, "the mutant parses:\n%s", m.Src)
				assert.Contains(t, squash(string(m.Src)), m.Mutated, "the mutant holds its rewrite")
				assert.NotEqual(t, src, string(m.Src))
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// A function whose first parameter has its result's type returns it; so do
// calls of it, replaced by their first argument. Not one whose first
// parameter is of another type, or is variadic, or unnamed.
func TestOwnOperatorsReturnTheInput(t *testing.T) {
	src := `package p

func guarded(env []string) []string {
	return append(env, "G=1")
}

func clean(p string, strict bool) (string, error) {
	return p + "/", nil
}

func other(n int) string { return "" }

func variadic(xs ...string) []string { return xs }

func use() {
	_ = guarded(nil)
	_, _ = clean("a", true)
}
`
	ms, err := mutate("p.go", []byte(src), map[string]bool{"K": true})
	require.NoError(t, err)
	var got []string
	for _, m := range ms {
		if m.Op == opReturnInput {
			got = append(got, describe(m))
		}
	}
	assert.Equal(t, []string{
		"3:6 RETURN_INPUT `func guarded { ... }` made `return env`",
		"7:6 RETURN_INPUT `func clean { ... }` made `return p, nil`",
		"16:6 RETURN_INPUT `guarded(nil)` made `nil`",
	}, got, "clean returns two values: its calls are not single expressions to replace")
	for _, m := range ms {
		if m.Mutated == "return env" {
			assert.Contains(t, squash(string(m.Src)), `func guarded(env []string) []string { return env return append(env, "G=1") }`, "the body stays, unreachable: what it uses is still used")
		}
	}
}

// A standard call replaced by its argument leaves its import used, whether
// or not the file uses it elsewhere: the mutant compiles.
func TestACallReplacedKeepsItsImportUsed(t *testing.T) {
	src := "package p\n\nimport \"strings\"\n\nfunc f(s string) int {\n\tswitch strings.ToLower(s) {\n\tcase \"a\":\n\t\treturn 1\n\t}\n\treturn 2\n}\n"
	ms, err := mutate("p.go", []byte(src), nil)
	require.NoError(t, err)
	require.Len(t, ms, 1)
	assert.Contains(t, string(ms[0].Src), "switch s {")
	assert.Contains(t, string(ms[0].Src), "var _ = strings.ToLower")
	_, err = parser.ParseFile(token.NewFileSet(), "m.go", ms[0].Src, 0)
	require.NoError(t, err)
}

// A call that is a statement of its own is left alone: a bare value is no
// statement, so the mutant would not compile.
func TestReplaceExprLeavesStatements(t *testing.T) {
	src := "package p\nimport \"strings\"\nfunc f() {\n\tstrings.ToLower(\"a\")\n}\n"
	ms, err := mutate("p.go", []byte(src), map[string]bool{"K": true})
	require.NoError(t, err)
	assert.Empty(t, ms)
}

func describe(m ownMutant) string {
	return fmt.Sprintf("%d:%d %s `%s` made `%s`", m.Line, m.Column, m.Op, m.Orig, m.Mutated)
}

func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// The coverage profile tells which positions the tests ran: in a block run,
// covered; in blocks never run, not; in none (a case expression), covered,
// since coverage cannot tell.
func TestCoverage(t *testing.T) {
	cov, err := parseCoverProfile(strings.NewReader(`mode: set
m/x/a.go:10.2,12.3 2 1
m/x/a.go:13.2,15.3 1 0
m/x/a.go:14.5,14.9 1 1
`), "m")
	require.NoError(t, err)
	for _, tt := range []struct {
		line, col int
		want      bool
	}{{11, 1, true}, {13, 5, false}, {14, 5, true}, {15, 3, false}, {15, 4, true}, {20, 1, true}} {
		assert.Equal(t, tt.want, cov.covered("x/a.go", tt.line, tt.col), "%d.%d", tt.line, tt.col)
	}
	_, err = parseCoverProfile(strings.NewReader("m/x/a.go:10.2,12.3 2\n"), "m")
	assert.Error(t, err)
}

// A mutant's test run, classified: passing lives, failing kills, a build
// failure is not viable, a test binary's timeout or the outer bound is a
// timeout.
func TestTestStatus(t *testing.T) {
	failed := assert.AnError
	assert.Equal(t, "LIVED", testStatus(nil, false, []byte("ok  m/x 0.1s")))
	assert.Equal(t, "KILLED", testStatus(failed, false, []byte("--- FAIL: TestX\nFAIL\tm/x\t0.1s")))
	assert.Equal(t, "NOT VIABLE", testStatus(failed, false, []byte("# m/x\nx/a.go:3:2: undefined: y\nFAIL\tm/x [build failed]")))
	assert.Equal(t, "TIMED OUT", testStatus(failed, false, []byte("panic: test timed out after 2m0s")))
	assert.Equal(t, "TIMED OUT", testStatus(failed, true, nil))
}
