// Command pause is the rig's pod sandbox image: the sandbox's first process,
// which holds the pod's namespaces and waits for SIGTERM, as Kubernetes'
// pause image does. The rig builds it statically and packs it as an OCI
// image, since no registry is reachable from the rig.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of the sandbox, it also reaps any orphan: a zombie would
	// otherwise stay until the sandbox stops.
	signal.Notify(sig, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
