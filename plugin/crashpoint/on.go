//go:build crashpoints

package crashpoint

import (
	"os"
	"syscall"
)

// Hook kills the process with SIGKILL at the step HARVESTER_IPAM_CRASH_AT
// names: no deferred call, no flush, as when the node loses power. With
// HARVESTER_IPAM_CRASH_ONCE set, only the first time that step is reached
// while that directory can be made (a node agent that its DaemonSet starts
// again must not die at every start); unset, every time.
func Hook() func(string) {
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
