package delegate

import (
	"debug/buildinfo"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/install/standin"
)

// GuardEnv is set in every delegate's environment. A harvester-ipam that
// starts with it set was run as its own delegate: it fails at once rather
// than starting itself again, which would hang every sandbox.
const GuardEnv = "HARVESTER_IPAM_DELEGATE"

// mainPath is the main package of every harvester-ipam build, whatever its
// version: how a binary at the delegate's name is known to be harvester-ipam.
const mainPath = "github.com/harvester/harvester-ipam/cmd/harvester-ipam"

// Find finds the delegate named name on paths as invoke does. Where
// harvester-ipam stands in for it (the file found is harvester-ipam), the
// delegate is the real binary kept beside it at standin.Aside; if that is
// missing, Find fails with an error that says so, and never returns
// harvester-ipam itself.
func Find(name string, paths []string) (string, error) {
	path, err := invoke.FindInPath(name, paths)
	if err != nil {
		return "", err
	}
	if !isHarvesterIPAM(path) {
		return path, nil
	}
	aside := standin.Aside(path)
	if st, err := os.Stat(aside); err == nil && st.Mode().IsRegular() {
		return aside, nil
	}
	return "", types.NewError(types.ErrTryAgainLater,
		fmt.Sprintf("harvester-ipam stands in for %s at %s, but the real %s is missing at %s", name, path, name, aside),
		fmt.Sprintf("restart %s's DaemonSet pod on this node (it writes its binary again and harvester-ipam's installer keeps it at %s), or harvester-ipam's", name, aside))
}

// isHarvesterIPAM says whether the file at path is a build of harvester-ipam:
// this very program (the common case, when it stands in), or any other
// version of it. A binary whose build info cannot be read is not.
func isHarvesterIPAM(path string) bool {
	if self, err := os.Executable(); err == nil {
		a, errA := os.Stat(self)
		b, errB := os.Stat(path)
		if errA == nil && errB == nil && os.SameFile(a, b) {
			return true
		}
	}
	info, err := buildinfo.ReadFile(path)
	return err == nil && info.Path == mainPath
}

// SelfError is the error of a harvester-ipam started as its own delegate.
func SelfError() error {
	self, _ := os.Executable()
	return types.NewError(types.ErrTryAgainLater,
		fmt.Sprintf("harvester-ipam (%s) was started as the delegate of harvester-ipam", self),
		"the real whereabouts must be on CNI_PATH under its name, or beside harvester-ipam at <name>"+standin.RealSuffix+" where harvester-ipam stands in for it")
}
