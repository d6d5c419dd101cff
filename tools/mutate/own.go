package main

// The pass of the project's own operators (ops.go): each mutant is written
// into a scratch copy of the module (never the work tree), and the
// package's own unit tests run against it with a timeout.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/build"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ownResult is one mutant of the own pass, as -out keeps it.
type ownResult struct {
	File    string `json:"file"` // module-relative
	Line    int    `json:"line"`
	Column  int    `json:"column"`
	Op      string `json:"op"`
	Orig    string `json:"orig"`
	Mutated string `json:"mutated"`
	Text    string `json:"text"`   // the source line, trimmed
	Status  string `json:"status"` // gremlins' words: KILLED, LIVED, TIMED OUT, NOT COVERED, NOT VIABLE
	Seconds float64
}

// key names a mutant by what it rewrote, wherever its line moved.
func (m ownResult) key() string {
	return strings.Join([]string{m.File, m.Op, strconv.Itoa(m.Column), m.Text, m.Orig, m.Mutated}, "\x00")
}

type ownRun struct {
	Elapsed float64     `json:"elapsed"`
	Mutants []ownResult `json:"mutants"`
}

// ownFiles are pkg's Go files that its unit tests build: not its tests,
// not a file behind a build tag.
func ownFiles(root, pkg string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(root, pkg, "*.go"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		base := filepath.Base(n)
		if strings.HasSuffix(base, "_test.go") {
			continue
		}
		if ok, err := build.Default.MatchFile(filepath.Join(root, pkg), base); err != nil {
			return nil, err
		} else if ok {
			out = append(out, pkg+"/"+base)
		}
	}
	return out, nil
}

// ownMutants are the mutants of pkg's files.
func ownMutants(root, pkg string) ([]ownResult, map[string][][]byte, error) {
	files, err := ownFiles(root, pkg)
	if err != nil {
		return nil, nil, err
	}
	var out []ownResult
	srcs := map[string][][]byte{}
	consts := map[string]bool{}
	for _, file := range files {
		src, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, nil, err
		}
		cs, err := constNames(file, src)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		for c := range cs {
			consts[c] = true
		}
	}
	for _, file := range files {
		src, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, nil, err
		}
		ms, err := mutate(file, src, consts)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		lines := strings.Split(string(src), "\n")
		for _, m := range ms {
			r := ownResult{File: file, Line: m.Line, Column: m.Column, Op: m.Op, Orig: m.Orig, Mutated: m.Mutated}
			if m.Line >= 1 && m.Line <= len(lines) {
				r.Text = strings.TrimSpace(lines[m.Line-1])
			}
			out = append(out, r)
			srcs[file] = append(srcs[file], m.Src)
		}
	}
	return out, srcs, nil
}

// scratchCopy copies the module at root into dir: its files, without .git
// and bin.
func scratchCopy(root, dir string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == ".git" || rel == "bin" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, info.Mode().Perm())
	})
}

// coverage is which lines of the package's files its tests run: per file,
// the blocks with their counts.
type coverage map[string][]coverBlock

type coverBlock struct {
	startLine, startCol, endLine, endCol, count int
}

// parseCoverProfile reads a -coverprofile of the module modPath.
func parseCoverProfile(r io.Reader, modPath string) (coverage, error) {
	cov := coverage{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") || line == "" {
			continue
		}
		// module/pkg/file.go:12.3,15.4 2 1
		name, rest, ok := strings.Cut(line, ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) != 3 {
			return nil, fmt.Errorf("cover profile line %q", line)
		}
		var b coverBlock
		if _, err := fmt.Sscanf(fields[0], "%d.%d,%d.%d", &b.startLine, &b.startCol, &b.endLine, &b.endCol); err != nil {
			return nil, fmt.Errorf("cover profile line %q: %w", line, err)
		}
		n, err := strconv.Atoi(fields[2])
		if err != nil {
			return nil, fmt.Errorf("cover profile line %q: %w", line, err)
		}
		b.count = n
		file := strings.TrimPrefix(name, modPath+"/")
		cov[file] = append(cov[file], b)
	}
	return cov, sc.Err()
}

// covered says whether the tests run the position: false only when it is
// in a block they never ran. A position in no block (a case expression, a
// declaration) is run: coverage cannot tell.
func (c coverage) covered(file string, line, col int) bool {
	in := false
	for _, b := range c[file] {
		after := line > b.startLine || line == b.startLine && col >= b.startCol
		before := line < b.endLine || line == b.endLine && col <= b.endCol
		if after && before {
			if b.count > 0 {
				return true
			}
			in = true
		}
	}
	return !in
}

func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.TrimSpace(rest), nil
		}
	}
	return "", errors.New("go.mod names no module")
}

// goTest runs the package's unit tests in the module copy at dir, bound
// by timeout: its status in gremlins' words, and the output.
func goTest(dir, pkg string, with []string, timeout time.Duration, extra ...string) (string, []byte) {
	// The test binary's own timeout panics with its stacks; the outer
	// bound (twice it: the build comes first) kills what still runs.
	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
	defer cancel()
	args := append([]string{"test", "-count=1", "-vet=off", "-failfast", "-timeout", timeout.String()}, extra...)
	args = append(args, "./"+pkg)
	for _, o := range with {
		args = append(args, "./"+o)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return testStatus(err, ctx.Err() != nil, out.Bytes()), out.Bytes()
}

// testStatus classifies a test run of a mutant.
func testStatus(err error, outerTimeout bool, out []byte) string {
	switch {
	case err == nil:
		return "LIVED"
	case outerTimeout, bytes.Contains(out, []byte("panic: test timed out after")):
		return "TIMED OUT"
	case bytes.Contains(out, []byte("[build failed]")), bytes.Contains(out, []byte("[setup failed]")):
		return "NOT VIABLE"
	}
	return "KILLED"
}

// runOwn runs the own pass on pkg: every mutant against the package's
// unit tests in scratch copies of the module under scratch (one per
// worker), on the lines the tests cover.
//
// With prev (an earlier run of the package, -again), a mutant it killed is
// taken as it was, and only the others are run again: the tests written
// since are to kill them (and a mutant that did not compile may now).
func runOwn(root, pkg string, with []string, scratch string, workers, coeff int, minTimeout time.Duration, prev *ownRun, progress io.Writer) (*ownRun, error) {
	start := time.Now()
	copies := make([]string, max(1, workers))
	for i := range copies {
		copies[i] = filepath.Join(scratch, fmt.Sprintf("module-%d", i))
		if _, err := os.Stat(copies[i]); err != nil {
			if err := scratchCopy(root, copies[i]); err != nil {
				return nil, err
			}
		}
	}
	// Everything from the copies, made once: the work tree may change while
	// this runs.
	muts, srcs, err := ownMutants(copies[0], pkg)
	if err != nil {
		return nil, err
	}
	modPath, err := modulePath(copies[0])
	if err != nil {
		return nil, err
	}
	// The package's tests as they are: they must pass, and how long they
	// take (build included) sets each mutant's timeout.
	profile := filepath.Join(scratch, strings.ReplaceAll(pkg, "/", "_")+".cover")
	t0 := time.Now()
	status, out := goTest(copies[0], pkg, with, 30*time.Minute, "-coverprofile", profile, "-coverpkg", "./"+pkg)
	if status != "LIVED" {
		return nil, fmt.Errorf("the tests of %s fail before any mutant:\n%s", pkg, out)
	}
	timeout := max(minTimeout, time.Duration(coeff)*time.Since(t0))
	f, err := os.Open(profile)
	if err != nil {
		return nil, err
	}
	cov, err := parseCoverProfile(f, modPath)
	f.Close()
	if err != nil {
		return nil, err
	}

	type job struct {
		i   int
		src []byte
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for w := range copies {
		wg.Add(1)
		go func(dir string) {
			defer wg.Done()
			for j := range jobs {
				m := &muts[j.i]
				file := filepath.Join(dir, m.File)
				orig, err := os.ReadFile(file)
				if err == nil {
					err = os.WriteFile(file, j.src, 0o644)
				}
				t := time.Now()
				if err != nil {
					m.Status = "NOT VIABLE"
				} else {
					m.Status, _ = goTest(dir, pkg, with, timeout)
				}
				m.Seconds = time.Since(t).Seconds()
				if err := os.WriteFile(file, orig, 0o644); err != nil {
					panic(fmt.Sprintf("restore %s in the scratch copy: %v", file, err))
				}
				mu.Lock()
				done++
				fmt.Fprintf(progress, "  own %s [%d/%d] %s:%d:%d %s %s\n", pkg, done, len(muts), m.File, m.Line, m.Column, m.Op, m.Status)
				mu.Unlock()
			}
		}(copies[w])
	}
	settled := map[string]string{}
	if prev != nil {
		for _, m := range prev.Mutants {
			if m.Status == "KILLED" {
				settled[m.key()] = m.Status
			}
		}
	}
	next := map[string]int{}
	for i := range muts {
		m := &muts[i]
		src := srcs[m.File][next[m.File]]
		next[m.File]++
		if st, ok := settled[m.key()]; ok {
			m.Status = st
			continue
		}
		if !cov.covered(m.File, m.Line, m.Column) {
			m.Status = "NOT COVERED"
			continue
		}
		jobs <- job{i, src}
	}
	close(jobs)
	wg.Wait()
	sort.SliceStable(muts, func(i, j int) bool {
		if muts[i].File != muts[j].File {
			return muts[i].File < muts[j].File
		}
		if muts[i].Line != muts[j].Line {
			return muts[i].Line < muts[j].Line
		}
		return muts[i].Column < muts[j].Column
	})
	return &ownRun{Elapsed: time.Since(start).Seconds(), Mutants: muts}, nil
}

// tallyOwn counts an own run as tally counts gremlins'.
func tallyOwn(root, pkg string, run *ownRun, eqs *equivalents) (row, error) {
	r := row{pkg: pkg, unbuilt: map[string]int{}, elapsed: time.Duration(run.Elapsed * float64(time.Second))}
	lines := map[string][]string{}
	for _, m := range run.Mutants {
		mu := mutant{file: m.File, line: m.Line, column: m.Column, mutator: m.Op, status: m.Status, orig: m.Orig, mutated: m.Mutated, text: m.Text}
		if mu.text == "" {
			src, ok := lines[m.File]
			if !ok {
				b, err := os.ReadFile(filepath.Join(root, m.File))
				if err != nil {
					return r, err
				}
				src = strings.Split(string(b), "\n")
				lines[m.File] = src
			}
			if m.Line >= 1 && m.Line <= len(src) {
				mu.text = strings.TrimSpace(src[m.Line-1])
			}
		}
		r.count(mu, eqs)
	}
	return r, nil
}

func writeOwn(path string, run *ownRun) error {
	b, err := json.MarshalIndent(run, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readOwn(path string) (*ownRun, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r ownRun
	return &r, json.Unmarshal(b, &r)
}
