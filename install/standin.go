package install

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/harvester/harvester-ipam/install/standin"
)

// StandInDir is the stand-in for name in opt's bin dir. The probe asks a
// binary what the runtime asks it (CNI_COMMAND=VERSION) and no more:
// harvester-ipam was probed fully by Install already, and the real binary
// supports what it supports.
func StandInDir(opt Options, name string) (standin.Dir, error) {
	if err := opt.defaults(); err != nil {
		return standin.Dir{}, err
	}
	if name == "" || name != filepath.Base(name) || name == opt.Name {
		return standin.Dir{}, fmt.Errorf("stand-in name %q: want the plain file name of another plugin (whereabouts)", name)
	}
	return standin.Dir{
		Path: opt.BinDir, Name: name, Self: opt.Source,
		Probe: func(ctx context.Context, path string) error {
			o := opt
			o.Require = []string{}
			_, err := versions(ctx, path, o)
			return err
		},
	}, nil
}

// StandIn puts harvester-ipam at BinDir/name and keeps the real binary at
// standin.Aside, under the installers' lock; see standin.Dir.Take (claim:
// replace another build of harvester-ipam at the name). With no real binary
// anywhere yet it writes nothing and returns standin.ErrNoReal: its own
// installer has not run; Watch sees it when it does.
func StandIn(ctx context.Context, opt Options, name string, claim bool) (changed bool, err error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return false, err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return false, err
	}
	defer unlock()
	return d.Take(ctx, claim)
}

// GiveBack puts the real binary back at BinDir/name, byte for byte, and
// removes the aside, under the installers' lock.
func GiveBack(ctx context.Context, opt Options, name string) error {
	d, err := StandInDir(opt, name)
	if err != nil {
		return err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return err
	}
	defer unlock()
	return d.GiveBack(ctx)
}

// Stop is what the installer does when told to stop (standin.Dir.Stop):
// it gives BinDir/name back, under the installers' lock, only when removing
// says this is an uninstall.
func Stop(ctx context.Context, opt Options, name string, removing func(context.Context) (bool, string)) (gaveBack bool, why string, err error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return false, "", err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return false, "", err
	}
	defer unlock()
	return d.Stop(ctx, removing)
}

// VerifyStandIn checks what a readiness probe asks of the stand-in
// (standin.Dir.Ready): harvester-ipam under its own name is the image's and
// runs, and either it stands in or there is nothing to stand in for. It says
// which, and writes nothing.
func VerifyStandIn(ctx context.Context, opt Options, name string) (string, error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return "", err
	}
	return d.Ready(ctx)
}
