package standin

import (
	"context"
	"fmt"
)

// Ready says what a readiness probe asks of the stand-in: harvester-ipam
// from Self at the name and a real binary aside that runs (it stands in),
// or no real binary on the node at all (nothing to stand in for: the
// plugin's own installer has not run here). It writes nothing.
func (d Dir) Ready(ctx context.Context) (string, error) {
	n, err := d.look(ctx, d.name())
	if err != nil {
		return "", err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return "", err
	}
	switch {
	case n.kind == missing && a.kind == missing:
		return fmt.Sprintf("nothing to stand in for: no %s at %s (its DaemonSet has not installed it on this node)", d.Name, d.name()), nil
	case n.kind != ours:
		return "", fmt.Errorf("not standing in for %s: %s is %s", d.Name, d.name(), n.kind)
	case a.kind == ours:
		return "", fmt.Errorf("%s is harvester-ipam, not the real %s", d.aside(), d.Name)
	case a.kind == missing:
		return "", fmt.Errorf("the real %s is missing at %s", d.Name, d.aside())
	case a.kind != runs:
		return "", fmt.Errorf("the real %s at %s does not run: %s (%v)", d.Name, d.aside(), a.kind, a.why)
	}
	same, err := sameContent(d.fs(), d.name(), d.Self)
	if err != nil {
		return "", err
	}
	if !same {
		return "", fmt.Errorf("not standing in for %s: %s is another build of harvester-ipam than %s", d.Name, d.name(), d.Self)
	}
	return fmt.Sprintf("harvester-ipam stands in at %s; the real %s is at %s", d.name(), d.Name, d.aside()), nil
}

// GivenBack says whether the name is the real binary's again, as a stand-in
// turned off leaves it: no harvester-ipam at the name, nothing aside. An
// error says what is not (harvester-ipam still at the name, a binary still
// aside).
func (d Dir) GivenBack(ctx context.Context) (string, error) {
	n, err := d.look(ctx, d.name())
	if err != nil {
		return "", err
	}
	a, err := d.look(ctx, d.aside())
	if err != nil {
		return "", err
	}
	switch {
	case n.kind == ours:
		return "", fmt.Errorf("harvester-ipam still stands in at %s (the real %s at %s is %s)", d.name(), d.Name, d.aside(), a.kind)
	case a.kind != missing:
		return "", fmt.Errorf("%s is still there (%s), beside %s at %s: a give-back not finished", d.aside(), a.kind, n.kind, d.name())
	case n.kind == missing:
		return fmt.Sprintf("nothing to give back: no %s at %s, nothing at %s", d.Name, d.name(), d.aside()), nil
	case n.kind != runs:
		return "", fmt.Errorf("%s at %s is %s (%v)", d.Name, d.name(), n.kind, n.why)
	}
	return fmt.Sprintf("harvester-ipam does not stand in for %s: the real %s is at %s; nothing at %s", d.Name, d.Name, d.name(), d.aside()), nil
}
