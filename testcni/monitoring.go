package testcni

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// PrometheusOperatorModule holds the monitoring.coreos.com CRDs the chart's
// monitoring objects are checked against (example/prometheus-operator-crd).
const PrometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.76.2"

// InstallMonitoringCRDs installs the ServiceMonitor and PrometheusRule CRDs
// from the Prometheus Operator module, and waits until they serve.
func (r *Rig) InstallMonitoringCRDs(ctx context.Context) error {
	// tools.sh copies them into the tool cache: the rig's namespace has no
	// network, and a cold module cache cannot be filled from there.
	dir := r.Tools["monitoring-crds"]
	if _, err := os.Stat(filepath.Join(dir, "monitoring.coreos.com_prometheusrules.yaml")); err != nil {
		return fmt.Errorf("the monitoring.coreos.com CRDs of %s: run testcni/tools.sh all (it copies them to %s): %w", PrometheusOperatorModule, dir, err)
	}
	for _, res := range []string{"servicemonitors", "prometheusrules"} {
		f := filepath.Join(dir, "monitoring.coreos.com_"+res+".yaml")
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("the %s CRD: %w", res, err)
		}
		if err := r.Apply(ctx, b, false); err != nil {
			return fmt.Errorf("install %s: %w", f, err)
		}
		gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: res}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, err := r.Dynamic.Resource(gvr).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the %s CRD is not served: %w", res, err)
			}
		}
	}
	return nil
}
