package install

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// VerifyStandIn checks what a readiness probe asks of the stand-in:
// harvester-ipam from Source at the name and a real binary aside that runs
// (it stands in), or no real binary on the node at all (nothing to stand in
// for: whereabouts' DaemonSet does not run here, or has not yet). It says
// which. It writes nothing.
func VerifyStandIn(ctx context.Context, opt Options, name string) (string, error) {
	d, err := StandInDir(opt, name)
	if err != nil {
		return "", err
	}
	at := filepath.Join(opt.BinDir, name)
	aside := standin.Aside(at)
	_, errAt := os.Stat(at)
	_, errAside := os.Stat(aside)
	if errors.Is(errAt, os.ErrNotExist) && errors.Is(errAside, os.ErrNotExist) {
		return fmt.Sprintf("nothing to stand in for: no %s at %s (whereabouts' DaemonSet has not installed it on this node)", name, at), nil
	}
	o := opt
	o.Name = name
	if _, err := Verify(ctx, o); err != nil {
		return "", fmt.Errorf("not standing in for %s: %w", name, err)
	}
	if standin.IsHarvesterIPAM(aside) {
		return "", fmt.Errorf("%s is harvester-ipam, not the real %s", aside, name)
	}
	if err := d.Probe(ctx, aside); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("the real %s is missing at %s", name, aside)
		}
		return "", fmt.Errorf("the real %s at %s does not run: %w", name, aside, err)
	}
	return fmt.Sprintf("harvester-ipam stands in at %s; the real %s is at %s", at, name, aside), nil
}
