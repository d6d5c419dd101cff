//go:build crashpoints

package plugin

import (
	"os"
	"syscall"
)

// crashHook kills the process with SIGKILL at the step HARVESTER_IPAM_CRASH_AT
// names: no deferred call, no flush, as when the node loses power.
func crashHook() func(string) {
	want := os.Getenv("HARVESTER_IPAM_CRASH_AT")
	if want == "" {
		return nil
	}
	return func(point string) {
		if point == want {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
