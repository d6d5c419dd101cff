// Package standin lets harvester-ipam stand in for whereabouts on a node: it
// takes whereabouts' name in the CNI bin dir, so that every NAD naming
// whereabouts reaches harvester-ipam and none is edited, and keeps the real
// binary aside, where harvester-ipam finds its delegate. SAFETY.md beside
// this file is the argument that no step loses, downgrades or gives away the
// real binary; model/ explores every interleaving against it.
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

// GuardEnv is set in the environment of every delegate harvester-ipam runs.
// A harvester-ipam that starts with it set was run as its own delegate: it
// fails at once rather than starting itself again, which would hang every
// sandbox.
const GuardEnv = "HARVESTER_IPAM_DELEGATE"

// Mark is the guard as every build of harvester-ipam sets it in its
// delegates' environment (plugin/delegate). Every build carries these bytes,
// whatever its main package path, module path or version, because every
// build must guard its delegates; no other program does. It is how the
// installer tells harvester-ipam from the real binary (IsHarvesterIPAM).
const Mark = GuardEnv + "=harvester-ipam"

// Module is harvester-ipam's Go module path.
const Module = "github.com/harvester/harvester-ipam"

// IsHarvesterIPAM says whether the file at path is a build of harvester-ipam,
// whole or in part: this very program, or any file that carries Mark. It
// reads the whole file: for the installer, not for every sandbox (see
// IsBuildOfThisModule).
func IsHarvesterIPAM(path string) bool {
	ours, err := isOurs(OS{}, path)
	return err == nil && ours
}

// isOurs says whether the file at path carries Mark.
func isOurs(fsys FS, path string) (bool, error) {
	return contains(fsys, path, []byte(Mark))
}

// IsBuildOfThisModule is the plugin's cheap look at the file on CNI_PATH,
// made for every sandbox: this very program, or a build whose Go build info
// names harvester-ipam's module (any main package path). It reads the build
// info, not the file: a build of a renamed fork is missed, and then the guard
// stops it at once when it is run as the delegate.
func IsBuildOfThisModule(path string) bool {
	if self, err := os.Executable(); err == nil {
		a, errA := os.Stat(self)
		b, errB := os.Stat(path)
		if errA == nil && errB == nil && os.SameFile(a, b) {
			return true
		}
	}
	info, err := buildinfo.ReadFile(path)
	return err == nil && info.Main.Path == Module
}
