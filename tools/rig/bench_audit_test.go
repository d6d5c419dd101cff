package main

import (
	"os"
	"testing"
)

func TestProcCostReadsThisProcess(t *testing.T) {
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	cpu, hwm, err := procCost(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if cpu <= 0 || hwm < 64<<10 {
		t.Errorf("procCost = %s, %d KiB; want some CPU and at least the 64 MiB touched", cpu, hwm)
	}
	if _, _, err := procCost(0); err == nil {
		t.Errorf("procCost(0): no error")
	}
}

func TestOpenFindingsSumsTheSeries(t *testing.T) {
	m := `# HELP harvester_ipam_audit_findings Open audit findings
harvester_ipam_audit_findings{kind="Headroom",network="a/b"} 0
harvester_ipam_audit_findings{kind="MissingAddress",network="a/b"} 2
harvester_ipam_audit_findings{kind="SharedAddress",network="a/c"} 1
harvester_ipam_audit_free{network="a/b"} 7
harvester_ipam_reconciler_passes_total 3
`
	if n := openFindings(m); n != 3 {
		t.Errorf("openFindings = %d, want 3", n)
	}
	if v := firstValue(m, "harvester_ipam_reconciler_passes_total"); v != "3" {
		t.Errorf("passes = %q, want 3", v)
	}
	if v := firstValue(m, "harvester_ipam_audit_free"); v != "7" {
		t.Errorf("free = %q, want 7", v)
	}
}
