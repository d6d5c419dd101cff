# harvester-ipam: make build | test | unit | demo | bench | deps | tools | fuzz | sim | image | mutate
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO      ?= go
export GOTOOLCHAIN := local
# One set of flags for every build of the project, its tests and the rig's
# builds of its binaries (testcni builds them with -trimpath and cgo off), so
# that each package compiles once: with two sets, a cold run compiled the
# Kubernetes client twice.
export GOFLAGS     := -mod=mod -trimpath
export CGO_ENABLED := 0

LDFLAGS := -s -w -X main.Version=$(VERSION)

.PHONY: build test unit e2e demo bench deps tools fuzz clean sim image mutate

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/harvester-ipam ./cmd/harvester-ipam

# The whole suite: unit tests and the end-to-end tests on the real rig
# (etcd, kube-apiserver, whereabouts, bridge, cnitool; built on first use).
# The end-to-end tests run last, alone: beside other packages' builds and
# tests, their API server answered too slowly for a DEL's 2 s Lease call.
# The real-kubelet tests (TestKubelet*) run after the others, for the same
# reason: each starts a cluster and a node of its own, and beside the rest
# they pushed the rig's API server past its callers' timeouts. Both parts
# run whatever the first's result; either failing fails the target.
test: deps build tools
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /testcni/e2e)
	rc=0; \
	$(GO) test -count=1 -timeout 40m -parallel 8 -skip '^TestKubelet' ./testcni/e2e || rc=1; \
	$(GO) test -count=1 -timeout 20m -run '^TestKubelet' ./testcni/e2e || rc=1; \
	exit $$rc

# Unit tests only: no rig, no root.
unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /testcni)

# What the rig runs from Debian's packages (iproute2, containerd and runc,
# bindfs): installed as root, else the command to run, in the first second.
deps:
	testcni/deps.sh

# The third-party binaries the rig runs, pinned and cached by version.
tools:
	testcni/tools.sh all

clean:
	rm -rf bin

# The chart's image, rancher/harvester-ipam:$(VERSION), as an OCI image archive
# that `docker load` and `ctr images import` accept; no container engine.
# Reproducible for a commit (install/README.md). A release builds on its tag,
# which is the chart's appVersion and so its default image.tag.
IMAGE ?= bin/harvester-ipam-image.tar
image:
	$(GO) run ./cmd/harvester-ipam-image -version $(VERSION) -o $(IMAGE)

# The main job on an embedded default: the leaks whereabouts v0.9.3 alone
# keeps and harvester-ipam -> v0.9.3 releases (and v0.7.0's crash loop and
# node reboot), side by side on a local API server; fails if one does not.
demo: deps tools
	$(GO) run ./cmd/harvester-ipam-rig demo

# harvester-ipam against whereabouts alone, in one run on the rig: a table.
bench: deps tools
	$(GO) run ./cmd/harvester-ipam-rig bench

# Each fuzz target for FUZZTIME with one worker; an input that fails is
# written to the package's testdata/fuzz/, where it stays as a regression.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./conf:FuzzLoad ./conf:FuzzParseArgs ./plugin/checkpoint:FuzzDecode ./plugin/checkpoint:FuzzPaths
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -parallel 1 $$pkg; \
	done

# The deterministic simulation for SIM_DURATION (1m) on every whereabouts
# version; it closes with "N schedules, M violations". A violation prints its
# seed and trace; replay one with go run ./cmd/harvester-ipam-sim -seed N -whereabouts v0.9.3 -trace
SIM_DURATION ?= 1m
sim:
	GOGC=400 $(GO) run ./cmd/harvester-ipam-sim -duration $(SIM_DURATION)

# Mutation testing, in two passes, each planting one bug at a time in each
# package and running that package's own unit tests (and, for a package in
# MUTATE_WITH, the tests of the packages that run its code too): gremlins'
# operators (pinned in testcni/tools.sh), and the project's own (a count
# shifted by one, an element dropped from an append or a list, a function
# that returns its input, a flag dropped from a mask;
# cmd/harvester-ipam-mutate/ops.go), which run in scratch copies of the
# module. The tables give test efficacy (bugs caught) and mutator coverage
# (bugs the tests reach) per package and pass, and the target fails below
# MUTATE_EFFICACY or MUTATE_COVERAGE. Equivalent mutants (no behaviour to
# catch) are listed with a reason in mutate/equivalent.txt. MUTATE_PASSES=own
# runs the second alone (no gremlins needed); MUTATE_OWN_PKGS get the second
# alone. About an hour on 2 cores, and as long again for the stand-in's
# package, each of whose mutants runs the model (docs/testing.md).
MUTATE_PKGS        ?= conf plugin plugin/checkpoint plugin/delegate shim shim/names shim/reconcile install install/standin
MUTATE_OWN_PKGS    ?=
# Most of the stand-in's Take and GiveBack is run by the bin-dir model, a
# package of its own: its tests count for the stand-in's mutants, in
# coverage and in each mutant's run.
MUTATE_WITH        ?= install/standin=install/standin/model
MUTATE_WORKERS     ?= 2
MUTATE_COEFFICIENT ?= 10
MUTATE_MIN_TIMEOUT ?= 2m
MUTATE_EFFICACY    ?= 90
MUTATE_COVERAGE    ?= 85
MUTATE_PASSES      ?= gremlins,own
mutate:
	case ,$(MUTATE_PASSES), in *,gremlins,*) testcni/tools.sh gremlins;; esac
	$(GO) run ./cmd/harvester-ipam-mutate -passes $(MUTATE_PASSES) -gremlins "$$(testcni/tools.sh dir)/gremlins-v0.5.0" \
		-workers $(MUTATE_WORKERS) -timeout-coefficient $(MUTATE_COEFFICIENT) -min-timeout $(MUTATE_MIN_TIMEOUT) \
		-efficacy $(MUTATE_EFFICACY) -coverage $(MUTATE_COVERAGE) -with '$(MUTATE_WITH)' \
		-equivalent mutate/equivalent.txt $(MUTATE_OUT) $(MUTATE_PKGS)
	case ",$(MUTATE_PASSES),$(strip $(MUTATE_OWN_PKGS))" in *,own,?*) \
	$(GO) run ./cmd/harvester-ipam-mutate -passes own \
		-workers $(MUTATE_WORKERS) -timeout-coefficient $(MUTATE_COEFFICIENT) -min-timeout $(MUTATE_MIN_TIMEOUT) \
		-efficacy $(MUTATE_EFFICACY) -coverage $(MUTATE_COVERAGE) -with '$(MUTATE_WITH)' \
		-equivalent mutate/equivalent.txt $(MUTATE_OUT) $(MUTATE_OWN_PKGS);; esac
