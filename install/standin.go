package install

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/harvester/harvester-ipam/install/standin"
)

// standInDir is the stand-in for name in opt's bin dir, probing as Install
// does: harvester-ipam must support opt.Require, the real binary only answer.
func standInDir(opt Options, name string, atStep func(string)) (standin.Dir, error) {
	if err := opt.defaults(); err != nil {
		return standin.Dir{}, err
	}
	if name == "" || name != filepath.Base(name) || name == opt.Name {
		return standin.Dir{}, fmt.Errorf("stand-in name %q: want the plain file name of another plugin (whereabouts)", name)
	}
	return standin.Dir{
		Path: opt.BinDir, Name: name, Self: opt.Source, AtStep: atStep,
		Probe: func(ctx context.Context, path string) error {
			o := opt
			o.Require = []string{}
			_, _, err := probe(ctx, path, o)
			return err
		},
	}, nil
}

// StandIn puts harvester-ipam at BinDir/name and keeps the real binary at
// standin.Aside, under the installers' lock; see standin.Dir.Take. With no
// real binary anywhere yet it writes nothing and returns standin.ErrNoReal:
// its own installer has not run; Watch sees it when it does.
func StandIn(ctx context.Context, opt Options, name string) (changed bool, err error) {
	d, err := standInDir(opt, name, nil)
	if err != nil {
		return false, err
	}
	unlock, err := lockDir(ctx, opt.BinDir)
	if err != nil {
		return false, err
	}
	defer unlock()
	return d.Take(ctx)
}

// GiveBack puts the real binary back at BinDir/name, byte for byte, and
// removes the aside, under the installers' lock.
func GiveBack(ctx context.Context, opt Options, name string) error {
	d, err := standInDir(opt, name, nil)
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
// harvester-ipam from Source at the name, a real binary aside, both run.
func VerifyStandIn(ctx context.Context, opt Options, name string) error {
	d, err := standInDir(opt, name, nil)
	if err != nil {
		return err
	}
	at := filepath.Join(opt.BinDir, name)
	o := opt
	o.Name = name
	if _, err := Verify(ctx, o); err != nil {
		return fmt.Errorf("not standing in for %s: %w", name, err)
	}
	aside := standin.Aside(at)
	if standin.IsHarvesterIPAM(aside) {
		return fmt.Errorf("%s is harvester-ipam, not the real %s", aside, name)
	}
	if err := d.Probe(ctx, aside); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("the real %s is missing at %s", name, aside)
		}
		return fmt.Errorf("the real %s at %s does not run: %w", name, aside, err)
	}
	return nil
}
