// Command klipperhelm stands in, on the rig, for the entry script of
// klipper-helm, the image RKE2's helm-controller runs its Jobs with (no
// registry is reachable here, so that image cannot be pulled). It does what
// that script does for a HelmChart from a repository, with the real helm
// binary beside it in the rig's image: the Job's environment (NAME, CHART,
// REPO, TARGET_NAMESPACE) and arguments ("install" and helm's flags, or
// "delete") as helm-controller writes them, the values files the Job
// mounts at /config; install adds the repository under NAME's first part,
// updates it, and installs (or upgrades a deployed release) with every
// values file; delete uninstalls a release that exists and waits, and is a
// no-op when none does. What it leaves out: helm v2, charts given inline
// (spec.chartContent), repository credentials and CAs, the failure policies
// beyond reinstalling a failed release, server-side apply.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "klipperhelm:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("want install or delete")
	}
	name, chart, repo, ns := os.Getenv("NAME"), os.Getenv("CHART"), os.Getenv("REPO"), os.Getenv("TARGET_NAMESPACE")
	if name == "" || ns == "" {
		return fmt.Errorf("NAME and TARGET_NAMESPACE must be set (helm-controller sets them)")
	}
	status, revision := release(name, ns)
	if args[0] == "delete" {
		if revision == 0 {
			fmt.Println("No helm chart installed; nothing to delete")
			return nil
		}
		// Like the script: an uninstall that fails is not the Job's failure.
		_ = helm("uninstall", name, "--namespace", ns, "--wait")
		return nil
	}
	if args[0] != "install" {
		return fmt.Errorf("unknown action %q", args[0])
	}
	if repo != "" {
		repoName, _, _ := strings.Cut(name, "/")
		if err := helm("repo", "add", repoName, repo); err != nil {
			return err
		}
		if err := helm("repo", "update"); err != nil {
			return err
		}
	}
	values, _ := filepath.Glob("/config/*.yaml")
	sort.Strings(values)
	var vargs []string
	for _, v := range values {
		vargs = append(vargs, "--values", v)
	}
	switch status {
	case "":
		return helm(append(append(append([]string{}, args...), name, chart), vargs...)...)
	case "deployed":
		return helm(append(append(append([]string{"upgrade"}, args[1:]...), name, chart), vargs...)...)
	default: // failed, or left pending: reinstall, the default failure policy
		if err := helm("uninstall", name, "--namespace", ns, "--wait"); err != nil {
			return err
		}
		return helm(append(append(append([]string{}, args...), name, chart), vargs...)...)
	}
}

// release is the release's status and revision; none when it does not exist.
func release(name, ns string) (string, int) {
	out, err := exec.Command("helm", "status", "--namespace", ns, name, "--output", "json").Output()
	if err != nil {
		return "", 0
	}
	var r struct {
		Info    struct{ Status string } `json:"info"`
		Version int                     `json:"version"`
	}
	if json.Unmarshal(out, &r) != nil {
		return "", 0
	}
	return r.Info.Status, r.Version
}

func helm(args ...string) error {
	fmt.Println("+ helm", strings.Join(args, " "))
	cmd := exec.Command("helm", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
