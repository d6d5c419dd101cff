//go:build crashpoints

package main

import (
	"os"
	"syscall"
)

// crashHook kills the agent with SIGKILL at the step of the allocator or of
// the plugin's verbs it runs that HARVESTER_IPAM_CRASH_AT names, once: the first time that step is reached
// while the directory HARVESTER_IPAM_CRASH_ONCE can be made (unset: every
// time). No deferred call runs, as when the node loses power.
func crashHook() func(string) {
	want := os.Getenv("HARVESTER_IPAM_CRASH_AT")
	if want == "" {
		return nil
	}
	once := os.Getenv("HARVESTER_IPAM_CRASH_ONCE")
	return func(step string) {
		if step != want || (once != "" && os.Mkdir(once, 0o700) != nil) {
			return
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
