package delegate

import (
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/harvester/harvester-ipam/install/standin"
)

// GuardEnv is set in every delegate's environment (standin.GuardEnv).
const GuardEnv = standin.GuardEnv

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
	if !standin.IsBuildOfThisModule(path) {
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

// SelfError is the error of a harvester-ipam started as its own delegate.
func SelfError() error {
	self, _ := os.Executable()
	return types.NewError(types.ErrTryAgainLater,
		fmt.Sprintf("harvester-ipam (%s) was started as the delegate of harvester-ipam", self),
		"the real whereabouts must be on CNI_PATH under its name, or beside harvester-ipam at <name>"+standin.RealSuffix+" where harvester-ipam stands in for it")
}
