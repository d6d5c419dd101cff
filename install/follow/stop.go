package follow

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// StopDeployment scales the Deployment ns/name to 0 replicas and waits,
// up to wait, until none of its pods is left. Unfollow runs after it: a
// follower still running would switch each NAD straight back (the switch
// back is itself a change it watches). A Deployment that does not exist
// is nothing to stop.
func StopDeployment(ctx context.Context, kube kubernetes.Interface, ns, name string, timeout, wait time.Duration, logf func(string, ...any)) error {
	deployments := kube.AppsV1().Deployments(ns)
	var selector string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		d, err := deployments.Get(cctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return fmt.Errorf("its selector: %w", err)
		}
		selector = sel.String()
		s, err := deployments.GetScale(cctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Spec.Replicas == 0 {
			return nil
		}
		s.Spec.Replicas = 0
		_, err = deployments.UpdateScale(cctx, name, s, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		logf("deployment %s/%s not found: no follower to stop", ns, name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("scale deployment %s/%s to 0: %w", ns, name, err)
	}
	logf("deployment %s/%s scaled to 0; waiting for its pods to go", ns, name)
	deadline := time.Now().Add(wait)
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		pods, err := kube.CoreV1().Pods(ns).List(cctx, metav1.ListOptions{LabelSelector: selector})
		cancel()
		if err != nil {
			return fmt.Errorf("list the pods of deployment %s/%s: %w", ns, name, err)
		}
		if len(pods.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deployment %s/%s still has %d pods (%s, ...) after %s: its follower may still switch NADs",
				ns, name, len(pods.Items), pods.Items[0].Name, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
