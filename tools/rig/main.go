// Command harvester-ipam-rig runs the test rig from the command line: a local
// API server, the real whereabouts and bridge plugins, cnitool and network
// namespaces, all in a network namespace of its own.
//
//	harvester-ipam-rig demo    the leaks whereabouts v0.9.3 alone keeps (and v0.7.0's crash loop and reboot), beside harvester-ipam
//	harvester-ipam-rig bench   harvester-ipam against whereabouts alone: latency, storm, large pool, reconciler, RSS
//	harvester-ipam-rig up      start the rig, print how to reach it, wait for Ctrl-C
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/harvester/harvester-ipam/testcni"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	run := map[string]func(context.Context, *testcni.Rig) error{
		"demo":  demo,
		"bench": bench,
		"up":    up,
	}[os.Args[1]]
	if run == nil {
		usage()
	}
	// The demo builds and runs only its own tools (testcni/tools.sh set
	// demo), and no network webhook: none of its NADs is edited.
	opt := testcni.Options{}
	if os.Args[1] == "demo" {
		opt = testcni.Options{ToolSet: "demo", NoWebhook: true}
	}
	if err := testcni.IsolateFor(opt.ToolSet); err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rig, err := testcni.Start(ctx, opt)
	if err != nil {
		fail(fmt.Errorf("the rig did not start: %w", err))
	}
	err = run(ctx, rig)
	rig.Close()
	if err != nil {
		fail(err)
	}
}

func up(ctx context.Context, rig *testcni.Rig) error {
	fmt.Printf("rig up: kube-apiserver %s\n  KUBECONFIG=%s\n  whereabouts flat file %s\n  NETCONFPATH=%s\n(inside the rig's own network namespace; Ctrl-C stops it and removes everything)\n",
		rig.APIServerURL(), rig.Kubeconfig, rig.FlatFile, rig.NetConfDir)
	<-ctx.Done()
	return nil
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: harvester-ipam-rig demo|bench|up")
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "harvester-ipam-rig:", err)
	os.Exit(1)
}
