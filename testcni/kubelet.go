package testcni

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Sync is what the kubelet's pod worker did for one pod.
type Sync struct {
	Sandbox *PodSandbox
	// Failures are the steps that failed and were retried, oldest first.
	Failures []error
}

// syncBackoff spaces the retries of a failed sync: the kubelet's pod worker
// retries after 10 to 15 s; the tests start at a second and grow to that,
// so that a failure costs little but a node that fails many sandbox starts
// at once (Multus' reads of the pod time out on a loaded machine) is not
// hammered by their retries.
var syncBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.5, Steps: 10, Cap: 10 * time.Second}

// SyncPod does what the kubelet's pod worker does for a pod bound to this
// node that should run: it keeps a READY sandbox, else stops and removes the
// pod's sandboxes that are not ready, runs a new one and marks the pod
// running. A failed step is retried, as the kubelet's next sync would,
// until timeout; containerd has already torn down a sandbox whose start
// failed (CNI DEL), or lists it NOTREADY for the next sync.
func (nd *Node) SyncPod(ctx context.Context, pod Pod, timeout time.Duration) (Sync, error) {
	var s Sync
	var last error
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := syncBackoff.DelayFunc().Until(ctx, true, false, func(ctx context.Context) (bool, error) {
		sb, err := nd.syncOnce(ctx, pod)
		if err != nil {
			last = err
			s.Failures = append(s.Failures, err)
			return false, nil
		}
		s.Sandbox = sb
		return true, nil
	})
	if err != nil {
		return s, fmt.Errorf("sync pod %s on %s: %w; last failure: %v", pod.Ref(), nd.Name, err, last)
	}
	return s, nil
}

func (nd *Node) syncOnce(ctx context.Context, pod Pod) (*PodSandbox, error) {
	sbs, err := nd.SandboxesOf(ctx, pod)
	if err != nil {
		return nil, err
	}
	var ready *PodSandbox
	for _, s := range sbs {
		if s.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			st, err := nd.PodSandboxStatus(ctx, s.Id)
			if err != nil {
				return nil, err
			}
			ready = &PodSandbox{ID: s.Id, Pod: pod, UID: s.Metadata.GetUid(), Attempt: s.Metadata.GetAttempt(), IP: st.GetNetwork().GetIp()}
			break
		}
	}
	if ready == nil {
		// The kubelet kills the pod, every sandbox of it, before it makes a new one.
		var errs []error
		for _, s := range sbs {
			if err := nd.StopPodSandbox(ctx, s.Id); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		if ready, err = nd.RunPodSandbox(ctx, pod); err != nil {
			return nil, err
		}
		if err := nd.MarkRunning(ctx, ready); err != nil {
			return nil, err
		}
	}
	// Its garbage collector removes the pod's sandboxes that are neither
	// ready nor its newest (containerd tears their network down once more).
	for _, s := range sbs {
		if s.Id != ready.ID && s.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			if err := nd.RemovePodSandbox(ctx, s.Id); err != nil {
				return nil, err
			}
		}
	}
	return ready, nil
}

// KillPodSandbox does what the kubelet does for a pod that is deleted: it
// stops the sandbox (CNI DEL) and removes it, and a failed step (a DEL that
// answered "try again", as a plugin must while the API server cannot be
// reached) is retried, as the pod worker's next sync would, until timeout.
func (nd *Node) KillPodSandbox(ctx context.Context, id string, timeout time.Duration) (failures []error, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = syncBackoff.DelayFunc().Until(ctx, true, false, func(ctx context.Context) (bool, error) {
		err := nd.StopPodSandbox(ctx, id)
		if err == nil {
			err = nd.RemovePodSandbox(ctx, id)
		}
		if err != nil {
			failures = append(failures, err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return failures, fmt.Errorf("kill sandbox %.12s on %s: %w; %d failures, the last: %v", id, nd.Name, err, len(failures), failures[len(failures)-1])
	}
	return failures, nil
}
