package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// readEquivalents reads lines of the form
//
//	FILE  MUTATOR  `SOURCE LINE, TRIMMED`  REASON
//
// Blank lines and lines starting with # are skipped. The source text is
// compared after trimming and collapsing runs of blanks.
func readEquivalents(path string) (*equivalents, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return &equivalents{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseEquivalents(f, path)
}

func parseEquivalents(r io.Reader, path string) (*equivalents, error) {
	var out equivalents
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := parseEquivalent(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		e.lineNo = n
		out.list = append(out.list, e)
	}
	return &out, sc.Err()
}

func parseEquivalent(line string) (*equivalent, error) {
	fields := strings.Fields(line)
	if len(fields) < 3 {
		return nil, fmt.Errorf("want FILE MUTATOR `SOURCE` REASON, got %q", line)
	}
	e := &equivalent{file: fields[0], mutator: fields[1]}
	if name, col, ok := strings.Cut(fields[1], ":"); ok {
		n, err := strconv.Atoi(col)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("the column after %s: must be a number from 1: %q", name, line)
		}
		e.mutator, e.column = name, n
	}
	open := strings.Index(line, "`")
	end := -1
	if open >= 0 {
		if i := strings.Index(line[open+1:], "`"); i >= 0 {
			end = open + 1 + i
		}
	}
	if open < 0 || end < 0 {
		return nil, fmt.Errorf("the source line must be quoted in backquotes: %q", line)
	}
	e.text = normalise(line[open+1 : end])
	e.reason = strings.TrimSpace(line[end+1:])
	if e.text == "" || e.reason == "" {
		return nil, fmt.Errorf("an entry needs a source line and a reason: %q", line)
	}
	return e, nil
}

func normalise(s string) string { return strings.Join(strings.Fields(s), " ") }

func (es *equivalents) match(m mutant) *equivalent {
	for _, e := range es.list {
		if e.file == m.file && e.mutator == m.mutator && (e.column == 0 || e.column == m.column) && e.text == normalise(m.text) {
			e.used++
			return e
		}
	}
	return nil
}

// stale are the entries of the packages measured that matched no mutant:
// an entry of an own operator by the own pass, any other by gremlins'.
func (es *equivalents) stale(rows []row) []*equivalent {
	measured := map[string]bool{}
	for _, r := range rows {
		measured[fmt.Sprint(r.own, r.pkg)] = true
	}
	var out []*equivalent
	for _, e := range es.list {
		if e.used == 0 && measured[fmt.Sprint(ownOps[e.mutator], pathDir(e.file))] {
			out = append(out, e)
		}
	}
	return out
}
