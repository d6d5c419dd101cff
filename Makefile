# harvester-ipam: make build | test | unit | demo | bench | deps | tools | fuzz | sim | image | chart-repo | mutate
# The release's version is the chart's appVersion: every build is tagged with
# it, so that the chart's default image (rancher/harvester-ipam:<appVersion>)
# is the image `make image` builds; a release tag must equal it (make image
# refuses a commit tagged otherwise). VERSION=... builds under another tag.
CHART_APP_VERSION := $(shell sed -n 's/^appVersion: *//p' install/chart/harvester-ipam/Chart.yaml | tr -d '"')
VERSION ?= $(CHART_APP_VERSION)
GO      ?= go
export GOTOOLCHAIN := local
# One set of flags for every build of the project, its tests and the rig's
# builds of its binaries (testcni builds them with -trimpath and cgo off), so
# that each package compiles once: with two sets, a cold run compiled the
# Kubernetes client twice.
export GOFLAGS     := -mod=mod -trimpath
export CGO_ENABLED := 0

LDFLAGS := -s -w -X main.Version=$(VERSION)

.PHONY: build test unit e2e demo bench deps tools fuzz clean sim image mutate chart-repo conformance

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/harvester-ipam ./cmd/harvester-ipam

# The whole suite: unit tests, the simulation, the end-to-end tests on the
# real rig (etcd, kube-apiserver, whereabouts, bridge, cnitool; built on
# first use) and, last and alone, whereabouts' own suites (make conformance).
# The end-to-end tests run last, alone: beside other packages' builds and
# tests, their API server answered too slowly for a DEL's 2 s Lease call.
# The real-kubelet tests (TestKubelet*) run after the others, for the same
# reason: each starts a cluster and a node of its own, and beside the rest
# they pushed the rig's API server past its callers' timeouts. Both parts
# run whatever the first's result; either failing fails the target. Each
# scenario runs through the plugin alone and through a node agent (the
# matrix); E2E_PATHS=exec runs the plugin alone.
E2E_PATHS ?= exec,agent
test: deps build tools
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /testcni/e2e)
	GOGC=400 $(GO) run ./tools/sim -seeds $(SIM_SEEDS)
	rc=0; \
	HARVESTER_IPAM_E2E_PATHS=$(E2E_PATHS) $(GO) test -count=1 -timeout 40m -parallel 8 -skip '^TestKubelet' ./testcni/e2e || rc=1; \
	$(GO) test -count=1 -timeout 20m -run '^TestKubelet' ./testcni/e2e || rc=1; \
	$(GO) test -count=1 -timeout 75m -v -run '^TestWhereaboutsConformance$$' ./testcni/e2e/conformance || rc=1; \
	exit $$rc

# whereabouts' own end-to-end suites (e2e/ and e2e/e2e_node_slice of each of
# CONFORMANCE_VERSIONS, compiled from its module as released), each spec
# alone, on three clusters side by side: whereabouts alone, harvester-ipam
# standing in with its node agent off, and the chart as it installs. The
# table of specs x sides ends the output (and bin/conformance/table.md),
# then a line a suite; it fails where harvester-ipam fails a spec that
# whereabouts alone passes. v0.9.4's by default (about 20 minutes on 2
# cores; make test runs it last); CONFORMANCE_VERSIONS="v0.9.4 v0.9.3" adds
# v0.9.3's.
CONFORMANCE_VERSIONS ?= v0.9.4
export CONFORMANCE_VERSIONS
conformance: deps tools
	$(GO) test -count=1 -timeout 75m -v -run '^TestWhereaboutsConformance$$' ./testcni/e2e/conformance

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

# The chart's image, rancher/harvester-ipam:$(VERSION) (the chart's appVersion
# unless VERSION is given), as an OCI image archive that `docker load`, `ctr
# images import` and crane accept; no container engine. Reproducible for a
# commit (docs/image.md). On a commit tagged for a release the tag must be the
# chart's appVersion. For linux/amd64 (Harvester's nodes) whatever the build
# machine is; `make image ARCH=arm64` builds for arm64 nodes (only ARCH given
# on make's command line counts: an ARCH in the environment is not this one).
IMAGE ?= bin/harvester-ipam-image.tar
IMAGE_ARCH := $(if $(filter command line,$(origin ARCH)),$(ARCH),amd64)
image:
	$(GO) run ./tools/image $(if $(filter command line environment,$(origin VERSION)),-version $(VERSION)) -arch $(IMAGE_ARCH) -o $(IMAGE)

# A Helm repository of the chart, for a Harvester add-on (install/addon): the
# packaged chart and index.yaml in CHART_REPO, to serve at CHART_REPO_URL (the
# Addon's spec.repo; without it the index's URLs are relative, which helm
# resolves against the repository's URL). HELM defaults to the rig's pinned helm.
# Each run adds the chart's version to the repository (the same version again
# replaces it) and keeps the versions before, so that an Addon's spec.version
# can go back to one. CHART_VERSION=... packages the chart under another
# version (its appVersion, the image, stays).
CHART_REPO     ?= bin/chart-repo
CHART_REPO_URL ?=
CHART_VERSION  ?=
HELM           ?= $(shell testcni/tools.sh paths | sed -n 's/^helm=//p')
chart-repo:
	[ -x "$(HELM)" ] || testcni/tools.sh helm
	mkdir -p $(CHART_REPO)
	$(HELM) package install/chart/harvester-ipam -d $(CHART_REPO) $(if $(CHART_VERSION),--version $(CHART_VERSION))
	$(HELM) repo index $(CHART_REPO) $(if $(CHART_REPO_URL),--url $(CHART_REPO_URL))
	@echo "serve $(CHART_REPO)/ at $(if $(CHART_REPO_URL),$(CHART_REPO_URL),the Addon's spec.repo)"

# The main job on an embedded default: the leaks whereabouts v0.9.3 alone
# keeps and harvester-ipam -> v0.9.3 releases (and v0.7.0's crash loop and
# node reboot), side by side on a local API server; fails if one does not.
# It builds only the tools it runs (testcni/tools.sh demo; make test builds
# the rest), and says first what it will build and about how long.
demo:
	@testcni/tools.sh plan demo
	@echo "demo: then compiles the rig and harvester-ipam (minutes while Go's build cache is cold) and runs (about 3 minutes)"
	testcni/deps.sh
	testcni/tools.sh demo
	$(GO) run ./tools/rig demo

# harvester-ipam against whereabouts alone, in one run on the rig: a table.
bench: deps tools
	$(GO) run ./tools/rig bench

# Each fuzz target for FUZZTIME with one worker; an input that fails is
# written to the package's testdata/fuzz/, where it stays as a regression.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./conf:FuzzLoad ./conf:FuzzParseArgs ./plugin/checkpoint:FuzzDecode ./plugin/checkpoint:FuzzPaths ./wire:FuzzReadRequest
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -parallel 1 $$pkg; \
	done

# The deterministic simulation on every whereabouts version: by default the
# seeds 1 to SIM_SEEDS, the very schedules `make test` plays (so a commit
# that passed make test passes make sim); SIM_DURATION=10m plays new seeds
# for that long instead. It closes with "N schedules, M violations". A
# violation prints its seed and trace; replay one with
# go run ./tools/sim -seed N -whereabouts v0.9.3 -trace
SIM_SEEDS ?= 3000
SIM_DURATION ?=
sim:
	GOGC=400 $(GO) run ./tools/sim $(if $(SIM_DURATION),-duration $(SIM_DURATION),-seeds $(SIM_SEEDS))

# Mutation testing, in two passes, each planting one bug at a time in each
# package and running that package's own unit tests (and, for a package in
# MUTATE_WITH, the tests of the packages that run its code too): gremlins'
# operators (pinned in testcni/tools.sh), and the project's own (a count
# shifted by one, an element dropped from an append or a list, a function
# that returns its input, a flag dropped from a mask;
# tools/mutate/ops.go), which run in scratch copies of the
# module. The tables give test efficacy (bugs caught) and mutator coverage
# (bugs the tests reach) per package and pass, and the target fails below
# MUTATE_EFFICACY or MUTATE_COVERAGE. Equivalent mutants (no behaviour to
# catch) are listed with a reason in tools/mutate/equivalent.txt. MUTATE_PASSES=own
# runs the second alone (no gremlins needed); MUTATE_OWN_PKGS get the second
# alone. About an hour on 2 cores, and as long again for the stand-in's
# package, each of whose mutants runs the model (docs/testing.md).
MUTATE_PKGS        ?= conf plugin plugin/checkpoint plugin/delegate shim shim/batch conf/names reconcile install install/standin
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
	$(GO) run ./tools/mutate -passes $(MUTATE_PASSES) -gremlins "$$(testcni/tools.sh dir)/gremlins-v0.5.0" \
		-workers $(MUTATE_WORKERS) -timeout-coefficient $(MUTATE_COEFFICIENT) -min-timeout $(MUTATE_MIN_TIMEOUT) \
		-efficacy $(MUTATE_EFFICACY) -coverage $(MUTATE_COVERAGE) -with '$(MUTATE_WITH)' \
		-equivalent tools/mutate/equivalent.txt $(MUTATE_OUT) $(MUTATE_PKGS)
	case ",$(MUTATE_PASSES),$(strip $(MUTATE_OWN_PKGS))" in *,own,?*) \
	$(GO) run ./tools/mutate -passes own \
		-workers $(MUTATE_WORKERS) -timeout-coefficient $(MUTATE_COEFFICIENT) -min-timeout $(MUTATE_MIN_TIMEOUT) \
		-efficacy $(MUTATE_EFFICACY) -coverage $(MUTATE_COVERAGE) -with '$(MUTATE_WITH)' \
		-equivalent tools/mutate/equivalent.txt $(MUTATE_OUT) $(MUTATE_OWN_PKGS);; esac
