// Command harvester-ipam-mutate runs mutation testing over packages one at
// a time, each against its own unit tests, in two passes: gremlins' operators
// (a boundary moved, a condition negated, arithmetic swapped), and the
// project's own (ops.go: a count shifted by one, an element dropped from an
// append or a []string list, a function or call that returns its input, a
// flag dropped from a bit mask), which gremlins never plants. It prints a
// table of test efficacy and mutator coverage per package and pass, and
// fails when a package is below the thresholds. `make mutate` runs it.
//
// A mutant that lives because it cannot change behaviour (an equivalent
// mutant) is listed, with a reason, in the equivalents file
// (tools/mutate/equivalent.txt). Each line there names a mutant by file, mutator
// and the source text of its line, so that it still matches when lines move:
//
//	shim/clock.go  CONDITIONALS_BOUNDARY  `if b.Cap > 0 && d > float64(b.Cap) {`  reason...
//
// MUTATOR:COLUMN (gremlins' column; the own operators', that of the
// comparison's or the or's operator, of the dropped element, of the call or
// of the function's name) excuses only the mutant at that column,
// for a line whose other mutant of that mutator a test kills.
//
// An excused mutant is taken out of the counts (it is no bug a test could
// catch) and the table says how many were; an entry that matches no mutant is
// reported as stale.
//
// How a package is measured: gremlins v0.5.0 gathers coverage with
// `go test -cover ./PKG/...` and mutates every file under PKG, subpackages
// too. A `go` wrapper first on PATH narrows that coverage run to `./PKG`, so
// that a subpackage's files are "not covered" and never run, and the table
// counts only PKG's own files. Each mutant is then tested by gremlins with
// `go test PKG` (the wrapper adds -vet=off): the package's own tests only.
//
// The own pass writes each mutant into a scratch copy of the module (one per
// worker, never the work tree) and runs `go test -vet=off -failfast PKG`
// there with a timeout (the package's test run times -timeout-coefficient, at
// least -min-timeout); a mutant on a line the package's tests never run (its
// cover profile) is not covered, and not run.
//
// Conventions (gremlins'): efficacy is killed / (killed + lived), coverage
// (killed + lived) / (killed + lived + not covered). A mutant whose test run
// timed out, or that does not compile (not viable), counts in neither, and is
// shown in its own column: on a loaded machine a slow build times out, and
// that is no test catching a bug (raise -timeout-coefficient then).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/build"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	var (
		gremlins   = flag.String("gremlins", "gremlins", "the gremlins v0.5.0 binary")
		workers    = flag.Int("workers", 2, "gremlins workers (go test runs at once)")
		coeff      = flag.Int("timeout-coefficient", 10, "a mutant's test run may take this many times the coverage run")
		minTimeout = flag.Duration("min-timeout", 2*time.Minute, "the least time a mutant's test run is given, however fast the coverage run was")
		equivFile  = flag.String("equivalent", "tools/mutate/equivalent.txt", "the equivalent mutants")
		efficacy   = flag.Float64("efficacy", 90, "the lowest test efficacy a package may have (percent)")
		coverage   = flag.Float64("coverage", 85, "the lowest mutator coverage a package may have (percent)")
		outDir     = flag.String("out", "", "keep each package's gremlins JSON and log here (default: a temporary dir)")
		listLived  = flag.Bool("lived", true, "list the mutants that lived or were not covered")
		moduleRoot = flag.String("root", ".", "the module's root")
		from       = flag.String("from", "", "tally the JSON an earlier run kept with -out in this dir, without running any mutant")
		again      = flag.String("again", "", "the own pass: take the mutants an earlier run kept with -out in this dir killed as killed, and run the others again")
		list       = flag.Bool("list", false, "list the own operators' mutants of the packages, and run nothing")
		passes     = flag.String("passes", "gremlins,own", "the passes to run: gremlins' operators, the project's own (COUNT_SHIFT, DROP_ELEMENT, RETURN_INPUT, DROP_FLAG), or both")
		withFlag   = flag.String("with", "", "packages whose tests run with a package's own, for both passes: PKG=OTHER+OTHER,... (install/standin=install/standin/model: the model runs the stand-in's code)")
	)
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s [flags] PKGDIR...\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	root, err := filepath.Abs(*moduleRoot)
	check(err)
	eqs, err := readEquivalents(filepath.Join(root, *equivFile))
	check(err)
	dir := *outDir
	if dir == "" {
		dir, err = os.MkdirTemp("", "harvester-ipam-mutate-")
		check(err)
		defer os.RemoveAll(dir)
	} else {
		dir, err = filepath.Abs(dir)
		check(err)
		check(os.MkdirAll(dir, 0o755))
	}
	realGo, err := exec.LookPath("go")
	check(err)
	realGo, err = filepath.Abs(realGo)
	check(err)
	with, err := parseWith(*withFlag)
	check(err)
	modPath, err := modulePath(root)
	check(err)
	wrapper, err := writeGoWrapper(dir, realGo, *minTimeout/time.Duration(*coeff), modPath, with)
	check(err)

	start := time.Now()
	var pkgs []string
	for _, pkg := range flag.Args() {
		pkgs = append(pkgs, strings.TrimSuffix(strings.TrimPrefix(filepath.ToSlash(filepath.Clean(pkg)), "./"), "/"))
	}
	if *list {
		for _, pkg := range pkgs {
			muts, _, err := ownMutants(root, pkg)
			check(err)
			for _, m := range muts {
				fmt.Printf("%s:%d:%d %s `%s` made `%s`\n", m.File, m.Line, m.Column, m.Op, m.Orig, m.Mutated)
			}
		}
		return
	}
	var rows, ownRows []row
	if passOn(*passes, "gremlins") {
		for _, pkg := range pkgs {
			t0 := time.Now()
			fmt.Fprintf(os.Stderr, "mutate: %s ...\n", pkg)
			var res *result
			if *from != "" {
				res, err = readResult(filepath.Join(*from, strings.ReplaceAll(pkg, "/", "_")+".json"))
			} else {
				res, err = unleash(*gremlins, root, pkg, wrapper, dir, *workers, *coeff)
			}
			check(err)
			r, err := tally(root, pkg, res, eqs)
			check(err)
			r.elapsed = time.Since(t0)
			if *from != "" {
				r.elapsed = time.Duration(res.ElapsedTime * float64(time.Second))
			}
			fmt.Fprintf(os.Stderr, "mutate: %s done in %s\n", pkg, r.elapsed.Round(time.Second))
			rows = append(rows, r)
		}
	}
	if passOn(*passes, "own") {
		scratch := filepath.Join(dir, "scratch")
		for _, pkg := range pkgs {
			fmt.Fprintf(os.Stderr, "mutate: own operators on %s ...\n", pkg)
			keep := filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_")+".own.json")
			var run *ownRun
			if *from != "" {
				run, err = readOwn(filepath.Join(*from, strings.ReplaceAll(pkg, "/", "_")+".own.json"))
			} else {
				var prev *ownRun
				if *again != "" {
					prev, err = readOwn(filepath.Join(*again, strings.ReplaceAll(pkg, "/", "_")+".own.json"))
					if errors.Is(err, fs.ErrNotExist) {
						// A package the earlier run did not cover: all of it runs.
						fmt.Fprintf(os.Stderr, "mutate: no earlier run of %s in %s: running every mutant\n", pkg, *again)
						prev, err = nil, nil
					}
					check(err)
				}
				run, err = runOwn(root, pkg, with[pkg], scratch, *workers, *coeff, *minTimeout, prev, os.Stderr)
				if err == nil {
					err = writeOwn(keep, run)
				}
			}
			check(err)
			r, err := tallyOwn(root, pkg, run, eqs)
			check(err)
			r.own = true
			fmt.Fprintf(os.Stderr, "mutate: own operators on %s done in %s\n", pkg, r.elapsed.Round(time.Second))
			ownRows = append(ownRows, r)
		}
		_ = os.RemoveAll(scratch)
	}

	failed := false
	if len(rows) > 0 {
		fmt.Println("gremlins' operators (conditionals boundary and negation, arithmetic, increment/decrement, invert negatives):")
		failed = printTable(os.Stdout, rows, *efficacy, *coverage)
	}
	if len(ownRows) > 0 {
		if len(rows) > 0 {
			fmt.Println()
		}
		fmt.Printf("the project's own operators (%s, %s, %s, %s):\n", opCountShift, opDropElement, opReturnInput, opDropFlag)
		failed = printTable(os.Stdout, ownRows, *efficacy, *coverage) || failed
	}
	fmt.Printf("\ntotal time %s (workers %d, timeout coefficient %d)\n", time.Since(start).Round(time.Second), *workers, *coeff)
	all := append(rows, ownRows...)
	if *listLived {
		printMutants(os.Stdout, all)
	}
	if stale := eqs.stale(all); len(stale) > 0 {
		fmt.Printf("\nstale entries in %s (they match no mutant any more; remove or update them):\n", *equivFile)
		for _, e := range stale {
			fmt.Printf("  %s:%d: %s %s `%s`\n", *equivFile, e.lineNo, e.file, e.mutator, e.text)
		}
	}
	if failed {
		fmt.Printf("\nFAIL: a package is below efficacy %.0f%% or mutator coverage %.0f%%\n", *efficacy, *coverage)
		os.Exit(1)
	}
}

// passOn says whether a comma-separated list of passes names pass.
func passOn(passes, pass string) bool {
	for _, p := range strings.Split(passes, ",") {
		if strings.TrimSpace(p) == pass {
			return true
		}
	}
	return false
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(2)
	}
}

// parseWith reads -with: PKG=OTHER+OTHER,PKG2=OTHER.
func parseWith(s string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		pkg, others, ok := strings.Cut(part, "=")
		if !ok || pkg == "" || others == "" {
			return nil, fmt.Errorf("-with %q: want PKG=OTHER+OTHER", part)
		}
		for _, o := range strings.Split(others, "+") {
			out[strings.Trim(pkg, "./")] = append(out[strings.Trim(pkg, "./")], strings.Trim(o, "./"))
		}
	}
	return out, nil
}

// writeGoWrapper writes a `go` that narrows gremlins' coverage run
// (`go test ... -coverprofile F ./PKG/...`) to the package itself, with the
// packages with[PKG] whose tests run its code too (their coverage of PKG
// counted: -coverpkg), turns vet off in test runs, adds with[PKG] to each
// mutant's test run of PKG, and makes the coverage run last at least
// minCoverage: gremlins gives each mutant's test run its coverage run's time
// times the coefficient, and on a loaded machine a fast coverage run would
// leave a mutant too little time to compile (a timeout that no test caused).
func writeGoWrapper(dir, real string, minCoverage time.Duration, module string, with map[string][]string) (string, error) {
	bin := filepath.Join(dir, "gowrap")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	var cases strings.Builder
	for pkg, others := range with {
		fmt.Fprintf(&cases, "    %s) with=(%s) ;;\n", shellQuote(pkg), shellQuote(strings.Join(others, " ")))
	}
	script := `#!/usr/bin/env bash
# Written by harvester-ipam-mutate. gremlins measures coverage over ./PKG/...:
# count only the package's own tests (and those of the packages that run its
# code too, below) on its own code, and take at least MIN_MS ms (a floor
# under each mutant's timeout). And no vet in a mutant's test run: a mutant
# is killed by a failing test, not by vet.
MIN_MS=` + fmt.Sprint(minCoverage.Milliseconds()) + `
MODULE=` + shellQuote(module) + `
companions() { # PKG (module-relative) -> the packages whose tests run its code too
  with=()
  case "$1" in
` + cases.String() + `  esac
  [[ ${#with[@]} -gt 0 ]] && read -r -a with <<<"${with[0]}"
}
args=("$@")
if [[ ${1:-} == test ]]; then
  cover=0
  last=${args[-1]}
  if [[ " $* " == *" -coverprofile "* && $last == ./*/... ]]; then
    pkg=${last%/...}
    args[-1]=$pkg
    cover=1
    companions "${pkg#./}"
    if [[ ${#with[@]} -gt 0 ]]; then
      args=("${args[@]:0:${#args[@]}-1}" "-coverpkg=$pkg" "$pkg")
      for o in "${with[@]}"; do args+=("./$o"); done
    fi
  else
    rel=${last#$MODULE/}
    companions "${rel#./}"
    for o in "${with[@]}"; do
      if [[ $last == "$MODULE/"* ]]; then args+=("$MODULE/$o"); else args+=("./$o"); fi
    done
  fi
  args=(test -vet=off "${args[@]:1}")
  if (( cover )); then
    start=$(date +%s%3N)
    ` + shellQuote(real) + ` "${args[@]}"
    rc=$?
    left=$(( MIN_MS - ($(date +%s%3N) - start) ))
    if (( left > 0 )); then sleep "$(( left / 1000 )).$(printf '%03d' $(( left % 1000 )))"; fi
    exit $rc
  fi
fi
exec ` + shellQuote(real) + ` "${args[@]}"
`
	return bin, os.WriteFile(filepath.Join(bin, "go"), []byte(script), 0o755)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// result is gremlins' JSON output (its internal/report OutputResult).
type result struct {
	ElapsedTime float64 `json:"elapsed_time"` // seconds, gremlins' own (after coverage)
	Files       []struct {
		Filename  string `json:"file_name"`
		Mutations []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Line   int    `json:"line"`
			Column int    `json:"column"`
		} `json:"mutations"`
	} `json:"files"`
}

func unleash(gremlins, root, pkg, wrapper, dir string, workers, coeff int) (*result, error) {
	safe := strings.ReplaceAll(pkg, "/", "_")
	out := filepath.Join(dir, safe+".json")
	logf, err := os.Create(filepath.Join(dir, safe+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(gremlins, "unleash",
		"--workers", fmt.Sprint(workers),
		"--timeout-coefficient", fmt.Sprint(coeff),
		"-o", out)
	cmd.Dir = filepath.Join(root, pkg)
	cmd.Env = append(os.Environ(), "PATH="+wrapper+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("gremlins on %s: %w (see %s)", pkg, err, logf.Name())
	}
	return readResult(out)
}

func readResult(path string) (*result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("gremlins output %s: %w", path, err)
	}
	return &r, nil
}

// mutant is one of a package's mutants.
type mutant struct {
	file    string // module-relative, slash-separated
	line    int
	column  int
	mutator string
	status  string
	text    string // the line's source, trimmed
	// orig and mutated are the rewritten code, before and after (the own
	// operators'; gremlins says only where).
	orig, mutated string
	excused       *equivalent
}

type row struct {
	pkg                                          string
	killed, timedOut, lived, notCovered, viable0 int
	excused                                      int
	unbuilt                                      map[string]int // file -> mutants, of files outside the default build
	own                                          bool           // the project's own operators' pass
	mutants                                      []mutant
	elapsed                                      time.Duration
}

func (r row) caught() int { return r.killed }

func (r row) efficacy() float64 {
	if n := r.caught() + r.lived; n > 0 {
		return 100 * float64(r.caught()) / float64(n)
	}
	return 100
}

func (r row) coverage() float64 {
	if n := r.caught() + r.lived + r.notCovered; n > 0 {
		return 100 * float64(r.caught()+r.lived) / float64(n)
	}
	return 100
}

// tally counts the mutants of pkg's own files (not its subpackages').
func tally(root, pkg string, res *result, eqs *equivalents) (row, error) {
	r := row{pkg: pkg, unbuilt: map[string]int{}}
	lines := map[string][]string{}
	for _, f := range res.Files {
		name := filepath.ToSlash(f.Filename)
		if strings.Contains(name, "/") {
			continue // a subpackage's: measured on its own, if at all
		}
		file := pkg + "/" + name
		// gremlins mutates every .go file, but `go test` builds only those
		// of the default build: a file behind a build tag (plugin/crashpoint/on.go,
		// `crashpoints`) is not what the unit tests run, so it is not
		// counted either way, and the table says so.
		if ok, err := build.Default.MatchFile(filepath.Join(root, pkg), name); err != nil {
			return r, err
		} else if !ok {
			r.unbuilt[file] += len(f.Mutations)
			continue
		}
		src, ok := lines[file]
		if !ok {
			b, err := os.ReadFile(filepath.Join(root, file))
			if err != nil {
				return r, err
			}
			src = strings.Split(string(b), "\n")
			lines[file] = src
		}
		for _, m := range f.Mutations {
			mu := mutant{file: file, line: m.Line, column: m.Column, mutator: m.Type, status: m.Status}
			if m.Line >= 1 && m.Line <= len(src) {
				mu.text = strings.TrimSpace(src[m.Line-1])
			}
			r.count(mu, eqs)
		}
	}
	sort.Slice(r.mutants, func(i, j int) bool {
		a, b := r.mutants[i], r.mutants[j]
		if a.file != b.file {
			return a.file < b.file
		}
		if a.line != b.line {
			return a.line < b.line
		}
		return a.column < b.column
	})
	return r, nil
}

// count adds a mutant to the row: excused, or in its status's column.
func (r *row) count(mu mutant, eqs *equivalents) {
	if e := eqs.match(mu); e != nil {
		mu.excused = e
		r.excused++
		r.mutants = append(r.mutants, mu)
		return
	}
	switch mu.status {
	case "KILLED":
		r.killed++
	case "TIMED OUT":
		r.timedOut++
	case "LIVED":
		r.lived++
	case "NOT COVERED":
		r.notCovered++
	case "NOT VIABLE":
		r.viable0++
	}
	r.mutants = append(r.mutants, mu)
}

func printTable(w io.Writer, rows []row, minEff, minCov float64) (failed bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "package\tkilled\ttimed out\tlived\tnot covered\tnot viable\texcused\tefficacy\tcoverage\ttime\t\t")
	for _, r := range rows {
		verdict := "ok"
		if r.efficacy() < minEff || r.coverage() < minCov {
			verdict, failed = "BELOW", true
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1f%%\t%s\t%s\t\n", r.pkg, r.killed, r.timedOut, r.lived,
			r.notCovered, r.viable0, r.excused, r.efficacy(), r.coverage(), r.elapsed.Round(time.Second), verdict)
	}
	tw.Flush()
	return failed
}

func printMutants(w io.Writer, rows []row) {
	for _, r := range rows {
		files := make([]string, 0, len(r.unbuilt))
		for f := range r.unbuilt {
			files = append(files, f)
		}
		sort.Strings(files)
		for _, f := range files {
			fmt.Fprintf(w, "  not counted  %s: %d mutants in a file outside the default build (a build tag)\n", f, r.unbuilt[f])
		}
		for _, m := range r.mutants {
			switch {
			case m.excused != nil:
				fmt.Fprintf(w, "  excused      %s:%d:%d %s `%s`%s: %s\n", m.file, m.line, m.column, m.mutator, m.text, m.rewrite(), m.excused.reason)
			case m.status == "LIVED" || m.status == "NOT COVERED" || m.status == "TIMED OUT" && m.mutated != "":
				fmt.Fprintf(w, "  %-12s %s:%d:%d %s `%s`%s\n", strings.ToLower(m.status), m.file, m.line, m.column, m.mutator, m.text, m.rewrite())
			}
		}
	}
}

// rewrite says what a mutant of the own operators wrote.
func (m mutant) rewrite() string {
	if m.mutated == "" {
		return ""
	}
	return fmt.Sprintf(" (`%s` made `%s`)", m.orig, m.mutated)
}

// equivalent is one line of the equivalents file.
type equivalent struct {
	lineNo  int
	file    string
	mutator string
	column  int // 0: any column
	text    string
	reason  string
	used    int
}

type equivalents struct{ list []*equivalent }

func pathDir(file string) string {
	if i := strings.LastIndex(file, "/"); i >= 0 {
		return file[:i]
	}
	return "."
}
