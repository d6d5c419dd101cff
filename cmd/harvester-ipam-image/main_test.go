package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A build is tagged with the chart's appVersion, so that the chart's default
// image is the build; a commit tagged for a release must carry that version.
func TestReleaseVersion(t *testing.T) {
	chart := []byte("apiVersion: v2\nname: harvester-ipam\nversion: 0.2.0\nappVersion: v0.2.0\n")
	for _, tc := range []struct {
		name  string
		chart []byte
		tags  []string
		want  string
		err   string
	}{
		{"no tag: the appVersion", chart, nil, "v0.2.0", ""},
		{"the release's tag", chart, []string{"v0.2.0"}, "v0.2.0", ""},
		{"a quoted appVersion", []byte("appVersion: \"v0.2.0\"\n"), nil, "v0.2.0", ""},
		{"tags that are not releases", chart, []string{"demo", "before-refactor"}, "v0.2.0", ""},
		{"a release tag that is not the chart's", chart, []string{"v0.3.0"}, "", "tagged v0.3.0 but install/chart/harvester-ipam/Chart.yaml says appVersion v0.2.0"},
		{"two release tags, one of them the chart's", chart, []string{"v0.1.9", "v0.2.0"}, "v0.2.0", ""},
		{"no appVersion", []byte("version: 0.2.0\n"), nil, "", "has no appVersion"},
	} {
		got, err := releaseVersion(tc.chart, tc.tags)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %q, %v; want an error saying %q", tc.name, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// The repository's chart: its appVersion is the image's default tag and its
// version the same release without the v, so that a release is one number.
func TestTheChartsVersions(t *testing.T) {
	// go test runs in the package's directory.
	b, err := os.ReadFile(filepath.Join("..", "..", chartFile))
	if err != nil {
		t.Fatal(err)
	}
	app, err := releaseVersion(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nversion: "+strings.TrimPrefix(app, "v")+"\n") {
		t.Errorf("the chart's version is not its appVersion %s without the v:\n%s", app, b)
	}
}
