package main

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"
)

// order is the order of the sides for sandbox i: the (i mod n!)-th
// permutation of the n sides, so that over n! sandboxes each side runs at
// each place, and right after each other side, equally often. What a call
// leaves behind (the API server's work after its response) slows whichever
// call comes next: a rotation, which puts each side always after the same
// one, charged one side's aftermath to another and moved a ratio by points.
func order[T any](i int, sides ...T) []T {
	rest := append([]T{}, sides...)
	out := make([]T, 0, len(sides))
	for n := len(rest); n > 0; n-- {
		k := i % n
		i /= n
		out = append(out, rest[k])
		rest = append(rest[:k], rest[k+1:]...)
	}
	return out
}

func median(d []time.Duration) time.Duration { return pct(d, 0.5) }
func p95(d []time.Duration) time.Duration    { return pct(d, 0.95) }

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1)+0.5)]
}

func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func medianInt(v []int64) int64 {
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func maxInt(v []int64) int64 {
	var m int64
	for _, x := range v {
		if x > m {
			m = x
		}
	}
	return m
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

func cpuModel() string {
	out, err := exec.Command("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").Output()
	if err != nil {
		return "unknown CPU"
	}
	return strings.TrimSpace(string(out))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// phase is one step's time in ADD id, from the plugin's debug log.
func phase(logFile, id, name string) (time.Duration, error) {
	steps, err := stepsOf(logFile, "ADD", id)
	if err != nil {
		return 0, err
	}
	for _, st := range steps {
		if st.name == name {
			return st.d, nil
		}
	}
	return 0, fmt.Errorf("no %s time for ADD %s in %s", name, id, logFile)
}
