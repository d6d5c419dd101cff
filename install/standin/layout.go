// Package standin lets harvester-ipam stand in for whereabouts on a node: it
// takes whereabouts' name in the CNI bin dir, so that every NAD naming
// whereabouts reaches harvester-ipam and none is edited, and keeps the real
// binary aside, where harvester-ipam finds its delegate.
package standin

import (
	"debug/buildinfo"
	"os"
)

// RealSuffix names the file that holds the real binary while harvester-ipam
// stands in at its name: <bin dir>/whereabouts.real beside <bin dir>/whereabouts.
const RealSuffix = ".real"

// Aside is where the real binary of the plugin at path is kept while
// harvester-ipam stands in for it.
func Aside(path string) string { return path + RealSuffix }

// MainPackage is the main package of every harvester-ipam build, whatever its
// version: how a binary is told to be harvester-ipam and not the real one.
const MainPackage = "github.com/harvester/harvester-ipam/cmd/harvester-ipam"

// IsHarvesterIPAM says whether the file at path is a build of harvester-ipam:
// this very program, or any release of it. A file whose Go build info cannot
// be read (the real binary may be any program) is not.
func IsHarvesterIPAM(path string) bool {
	if self, err := os.Executable(); err == nil {
		a, errA := os.Stat(self)
		b, errB := os.Stat(path)
		if errA == nil && errB == nil && os.SameFile(a, b) {
			return true
		}
	}
	info, err := buildinfo.ReadFile(path)
	return err == nil && info.Path == MainPackage
}
