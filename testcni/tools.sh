#!/usr/bin/env bash
# tools.sh builds the third-party binaries the rig runs, pinned by version, from
# the Go module proxy, into a cache outside the work tree. A binary already in
# the cache is reused, so only the first run on a machine pays for the builds.
#
#   testcni/tools.sh [all|etcd|kube-apiserver|kube-node|cnitool|cni-plugins|whereabouts-vX.Y.Z|busybox|multus|helm|webhook|crane|helm-controller|harvester-crds|k3s-crds|promtool|gremlins|conformance|conformance-vX.Y.Z]
#   testcni/tools.sh demo     # only what `make demo` runs (the set demo)
#   testcni/tools.sh dir      # prints the cache's bin dir
#   testcni/tools.sh paths    # prints NAME=PATH of every tool, built or not
#   testcni/tools.sh set SET  # prints the tools of SET (demo), by the names paths prints
#   testcni/tools.sh plan SET # says, in a line, what of SET (demo, all) is still to build, and about how long
set -euo pipefail

ETCD_VERSION=v3.6.16
KUBE_VERSION=v1.37.0
CNI_VERSION=v1.3.1
PLUGINS_VERSION=v1.9.1
MULTUS_VERSION=v4.3.0
HELM_VERSION=v3.14.4
# crane pushes the chart's image to a registry and serves one on the rig
# (the README's registry path).
CRANE_VERSION=v0.20.2
# RKE2's helm-controller, which installs a Harvester add-on's HelmChart: the
# version k3s v1.33.7 (RKE2 v1.33, Harvester v1.6) vendors.
HELM_CONTROLLER_VERSION=v0.16.17
# Harvester's Addon CRD (deploy/charts/harvester-crd), from its v1.6.0 module;
# the checksum database does not know it: its module hash is pinned.
HARVESTER_VERSION=v1.6.0
HARVESTER_SUM=h1:SlC7YQyheSXIeoc/ys/eYZ00HRXJsocHxMUEoXHI+fw=
# k3s' Addon CRD (addons.k3s.cattle.io), which RKE2, and so every Harvester,
# serves beside Harvester's (addons.harvesterhci.io): kubectl's `addon` may
# name either. k3s v1.33.7 (pkg/server/context.go) registers the CRDs of
# github.com/k3s-io/api's pkg/crds, v0.1.4 in its go.mod; pinned by hash.
K3S_API_VERSION=v0.1.4
K3S_API_SUM=h1:mnu1pgtEEwplvDHgjeyekbC96wykUWsq0E5ouJoRkM4=
# gremlins runs the mutation tests (make mutate); not a rig tool, so `all` skips it.
GREMLINS_VERSION=v0.5.0
PROMETHEUS_OPERATOR_VERSION=v0.76.2
# Prometheus' promtool runs the chart's alerts through Prometheus' own rule
# engine (promtool test rules). Module v0.316.0 is Prometheus 3.16.0; built
# without the service discoveries (remove_all_sd), which promtool's rule tests
# never use: about 3 minutes cold on 2 cores, 54 MB.
PROMETHEUS_VERSION=v0.316.0
PROMETHEUS_RELEASE=3.16.0
# The checksum database does not know whereabouts v0.9.3 (Harvester's current
# chart ships it): its module hash is pinned here and checked on download.
WHEREABOUTS_V093_SUM=h1:DbI2Xyst/FTZONuZ/O5EjHw/DaddrzSW2g/jmMXxWdQ=
# v0.9.4, the next release, likewise.
WHEREABOUTS_V094_SUM=h1:P45pLCyZ7iXLPBtlczbzSYV+AQCPCa9j7qfULKJ4ARM=
# v0.9.2 (Harvester v1.7.0 to v1.7.2) the checksum database knows.
WHEREABOUTS_VERSIONS="v0.9.4 v0.9.3 v0.9.2 v0.8.0 v0.7.0"
# The versions whose own end-to-end suites `make conformance` runs, built on
# its first run (testcni/tools.sh conformance; not in all): v0.9.4's by
# default, any other of WHEREABOUTS_VERSIONS on demand
# (CONFORMANCE_VERSIONS="v0.9.4 v0.9.3").
CONFORMANCE_VERSIONS="${CONFORMANCE_VERSIONS:-v0.9.4}"
# Harvester's network controller, whose admission webhook judges NADs. The
# proxy refuses v1.8.2 (Harvester v1.8.2's); v1.8.1's cmd/ and pkg/ are
# v1.8.2's file for file. The checksum database does not know it either.
NETWORK_CONTROLLER_VERSION=v1.8.1
NETWORK_CONTROLLER_SUM=h1:tH41q82zyAZLet5V1weGeMDN6ooqh4m1EeDYNG++/H4=
# The static busybox whereabouts' images carry (as Alpine's and SUSE BCI's
# do): its cp -f is what rewrites the node's bin dir. Debian 12's package,
# pinned by version and by the .deb's sha256.
BUSYBOX_DEB_VERSION=1:1.35.0-4+deb12u1+b1
BUSYBOX_DEB_SHA256=3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744
BUSYBOX_VERSION=${BUSYBOX_DEB_VERSION#*:}

CACHE="${HARVESTER_IPAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harvester-ipam}"
BIN="$CACHE/bin"
SRC="$CACHE/src"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$BIN" "$SRC"

log() { echo "tools: $*" >&2; }

# newmod NAME: a fresh scratch module dir to build one tool from.
newmod() {
  local d="$SRC/$1"
  rm -rf "$d" && mkdir -p "$d"
  printf 'module build/%s\n\ngo 1.26\n' "$1" >"$d/go.mod"
  echo "$d"
}

# install OUT DIR PKG [LDFLAGS]: build PKG inside module DIR into $BIN/OUT atomically.
install_bin() {
  local out="$1" dir="$2" pkg="$3" ldflags="${4:-}"
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$BIN/.$out.tmp" "$pkg")
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  log "built $BIN/$out"
}

have() { [[ -x "$BIN/$1" ]]; }

build_etcd() {
  local out="etcd-$ETCD_VERSION"; have "$out" && return 0
  log "building etcd $ETCD_VERSION (about 80 s cold)"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
  install_bin "$out" "$d" go.etcd.io/etcd/server/v3
}

# kube_module prints the dir of the small module the Kubernetes binaries are
# built from: it requires k8s.io/kubernetes and replaces every staging module
# kubernetes replaces locally with the proxy's at the matching v0.x. Made once;
# kube-apiserver and the node's binaries share it, and so the build cache.
kube_module() {
  local d="$SRC/kubernetes-$KUBE_VERSION"
  if [[ -s "$d/.ready" ]]; then echo "$d"; return 0; fi
  rm -rf "$d" && mkdir -p "$d"
  printf 'module build/kubernetes-%s\n\ngo 1.26\n' "$KUBE_VERSION" >"$d/go.mod"
  local minor="v0.${KUBE_VERSION#v1.}"
  local kdir; kdir=$(cd "$d" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  {
    printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE_VERSION"
    # Every staging module kubernetes replaces locally comes from the proxy at the matching v0.x.
    sed -n 's#^\s*\(k8s.io/[^ ]*\) => \./staging/.*#\t\1 => \1 '"$minor"'#p' "$kdir/go.mod"
    printf ')\n'
  } >>"$d/go.mod"
  (cd "$d" && { go mod tidy -e >/dev/null 2>&1 || true; } && go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" >&2)
  echo ok >"$d/.ready"
  echo "$d"
}

kube_ldflags() {
  echo "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${KUBE_VERSION#v1.}"
}

build_kube_apiserver() {
  local out="kube-apiserver-$KUBE_VERSION"; have "$out" && return 0
  log "building kube-apiserver $KUBE_VERSION (about 7 minutes cold on 2 cores)"
  local d; d=$(kube_module)
  install_bin "$out" "$d" k8s.io/kubernetes/cmd/kube-apiserver "$(kube_ldflags)"
}

# build_kube_node: the kubelet, and the controller manager and scheduler a
# cluster of the rig's own needs for its DaemonSets (the DaemonSet controller
# makes their pods, the scheduler binds them), and kubectl, which runs the
# README's commands. One go build: they share packages with each other and
# with kube-apiserver, whose build cache it uses.
KUBE_NODE_BINARIES="kubelet kube-controller-manager kube-scheduler kubectl"
# build_kube_node [BINARY...]: those of KUBE_NODE_BINARIES (all when none
# named) that the cache lacks.
build_kube_node() {
  local b missing=()
  for b in ${*:-$KUBE_NODE_BINARIES}; do have "$b-$KUBE_VERSION" || missing+=("$b"); done
  ((${#missing[@]})) || return 0
  log "building ${missing[*]} $KUBE_VERSION (minutes, with kube-apiserver's build cache)"
  local d; d=$(kube_module)
  local tmp="$BIN/.kube-node.tmp" pkgs=()
  rm -rf "$tmp" && mkdir -p "$tmp"
  for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$d" && go build -trimpath -ldflags "-s -w $(kube_ldflags)" -o "$tmp/" "${pkgs[@]}")
  for b in "${missing[@]}"; do mv -f "$tmp/$b" "$BIN/$b-$KUBE_VERSION"; log "built $BIN/$b-$KUBE_VERSION"; done
  rm -rf "$tmp"
}

build_cnitool() {
  local out="cnitool-$CNI_VERSION"; have "$out" && return 0
  log "building cnitool $CNI_VERSION"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "github.com/containernetworking/cni@$CNI_VERSION")
  install_bin "$out" "$d" github.com/containernetworking/cni/cnitool
}

build_plugins() {
  local p
  # loopback: containerd's CRI plugin sets up each sandbox's lo with it.
  # macvlan: whereabouts' own end-to-end suite attaches its pods with it.
  for p in bridge host-local loopback macvlan; do
    local out="$p-$PLUGINS_VERSION"; have "$out" && continue
    log "building $p $PLUGINS_VERSION"
    local d; d=$(newmod "$out")
    local path="github.com/containernetworking/plugins/plugins/main/$p"
    [[ $p == host-local ]] && path="github.com/containernetworking/plugins/plugins/ipam/host-local"
    (cd "$d" && go get "github.com/containernetworking/plugins@$PLUGINS_VERSION")
    install_bin "$out" "$d" "$path"
  done
}

# pinned_get DIR MOD VERSION SUM: go get a module the checksum database does
# not know, after checking its module hash against the pinned one. Seeding
# go.sum makes the go command refuse a download of another hash; the check
# says so in words.
pinned_get() {
  local d="$1" mod="$2" v="$3" want="$4" sum
  printf '%s %s %s\n' "$mod" "$v" "$want" >>"$d/go.sum"
  sum=$(cd "$d" && GONOSUMDB=$mod go mod download -json "$mod@$v" | sed -n 's/^\t"Sum": "\(.*\)",$/\1/p')
  if [[ "$sum" != "$want" ]]; then
    echo "tools: $mod@$v has module hash '$sum', want $want: refusing to build it" >&2
    return 1
  fi
  log "$mod@$v module hash $sum matches the pinned one"
  (cd "$d" && GONOSUMDB=$mod go get "$mod@$v")
}

# build_whereabouts V: the plugin, its ip-control-loop (the pod controller its
# DaemonSet runs; up to v0.9.3 its reconciler too), from v0.9.4 its reconciler
# (a Deployment of its own), and its scripts (whereabouts_scripts): one module
# download, built once per version.
build_whereabouts() {
  local v="$1" out="whereabouts-$1"
  have "$out" && have "ip-control-loop-$v" \
    && { [[ $v != v0.9.4 ]] || have "whereabouts-reconciler-$v"; } && return 0
  log "building whereabouts $v"
  local mod=github.com/k8snetworkplumbingwg/whereabouts d
  d=$(whereabouts_module "$v")
  have "$out" || install_bin "$out" "$d" "$mod/cmd"
  install_bin "ip-control-loop-$v" "$d" "$mod/cmd/controlloop"
  if [[ $v == v0.9.4 ]]; then
    install_bin "whereabouts-reconciler-$v" "$d" "$mod/cmd/reconciler"
  fi
  whereabouts_scripts "$v"
}

# whereabouts_module V prints the dir of a scratch module that requires
# whereabouts V (its hash checked where one is pinned), to build its commands in.
whereabouts_module() {
  local v="$1" d mod=github.com/k8snetworkplumbingwg/whereabouts
  d=$(newmod "whereabouts-$v")
  printf '\nreplace github.com/gogo/protobuf => github.com/gogo/protobuf v1.3.2\n' >>"$d/go.mod"
  case $v in
    v0.9.3) pinned_get "$d" "$mod" "$v" "$WHEREABOUTS_V093_SUM" >&2 ;;
    v0.9.4) pinned_get "$d" "$mod" "$v" "$WHEREABOUTS_V094_SUM" >&2 ;;
    *) (cd "$d" && go get "$mod@$v") >&2 ;;
  esac
  echo "$d"
}

# build_whereabouts_plugin V: whereabouts V's CNI plugin alone, what the demo
# runs (build_whereabouts adds its controllers).
build_whereabouts_plugin() {
  local v="$1" out="whereabouts-$1"; have "$out" && return 0
  log "building whereabouts $v's plugin"
  local d; d=$(whereabouts_module "$v")
  install_bin "$out" "$d" github.com/k8snetworkplumbingwg/whereabouts/cmd
}

# whereabouts_source V WHAT prints the directory of whereabouts V's module
# source, downloaded from the module proxy and checked against its pinned
# hash where one is pinned; WHAT names what is taken from it, for the error.
whereabouts_source() {
  local v="$1" what="$2" mod=github.com/k8snetworkplumbingwg/whereabouts want="" info sum
  case $v in
    v0.9.3) want=$WHEREABOUTS_V093_SUM ;;
    v0.9.4) want=$WHEREABOUTS_V094_SUM ;;
  esac
  info=$(cd "$SRC" && GONOSUMDB=$mod go mod download -json "$mod@$v") || return 1
  sum=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  if [[ -n "$want" && "$sum" != "$want" ]]; then
    echo "tools: $mod@$v has module hash '$sum', want $want: refusing its $what" >&2
    return 1
  fi
  sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info"
}

# build_conformance V: whereabouts V's own end-to-end suites, compiled as
# its maintainers run them (`go test` of e2e/ and e2e/e2e_node_slice, their
# code as released, from the module proxy by version, pinned by hash where
# the checksum database does not know the version), and the controllers and
# manifests their specs need beside the DaemonSet: node-slice-controller,
# and the reconciler's and the node-slice controller's Deployments and
# whereabouts' own RBAC (doc/crds). Nothing of it is copied into the
# repository; `make conformance` runs it (testcni/conformance).
build_conformance() {
  local v="$1" out="whereabouts-e2e-$1"
  have "$out" && have "whereabouts-e2e-node-slice-$v" && have "node-slice-controller-$v" \
    && [[ -s "$BIN/whereabouts-$v-manifests/daemonset-install.yaml" ]] && return 0
  log "building whereabouts $v's end-to-end suites and node-slice-controller (about 2 minutes cold)"
  local d; d=$(newmod "$out")
  printf '\nreplace github.com/gogo/protobuf => github.com/gogo/protobuf v1.3.2\n' >>"$d/go.mod"
  local mod=github.com/k8snetworkplumbingwg/whereabouts
  case $v in
    v0.9.3) pinned_get "$d" "$mod" "$v" "$WHEREABOUTS_V093_SUM" ;;
    v0.9.4) pinned_get "$d" "$mod" "$v" "$WHEREABOUTS_V094_SUM" ;;
    *) (cd "$d" && go get "$mod@$v") ;;
  esac
  # The suites' own test dependencies (ginkgo, gomega), at the versions
  # whereabouts' go.mod requires.
  (cd "$d" && GONOSUMDB=$mod go get -t "$mod/e2e" "$mod/e2e/e2e_node_slice" >&2)
  local p
  for p in e2e:whereabouts-e2e-$v e2e/e2e_node_slice:whereabouts-e2e-node-slice-$v; do
    (cd "$d" && GONOSUMDB=$mod go test -c -trimpath -ldflags "-s -w" -o "$BIN/.${p#*:}.tmp" "$mod/${p%%:*}")
    mv -f "$BIN/.${p#*:}.tmp" "$BIN/${p#*:}"
    log "built $BIN/${p#*:}"
  done
  install_bin "node-slice-controller-$v" "$d" "$mod/cmd/nodeslicecontroller"
  local dir; dir=$(whereabouts_source "$v" manifests) || return 1
  rm -rf "$BIN/whereabouts-$v-manifests.tmp" && mkdir -p "$BIN/whereabouts-$v-manifests.tmp"
  for p in daemonset-install.yaml node-slice-controller.yaml reconciler-deployment.yaml; do
    [[ -f "$dir/doc/crds/$p" ]] && cp "$dir/doc/crds/$p" "$BIN/whereabouts-$v-manifests.tmp/"
  done
  cp "$dir"/doc/crds/whereabouts.cni.cncf.io_*.yaml "$BIN/whereabouts-$v-manifests.tmp/"
  chmod -R u+w "$BIN/whereabouts-$v-manifests.tmp"
  rm -rf "$BIN/whereabouts-$v-manifests" && mv "$BIN/whereabouts-$v-manifests.tmp" "$BIN/whereabouts-$v-manifests"
  log "copied whereabouts $v's manifests to $BIN/whereabouts-$v-manifests"
}

# whereabouts_scripts V copies whereabouts V's script/ files its image carries
# (install-cni.sh; lib.sh and token-watcher.sh where the version has them)
# into the cache. Apart from the binaries, so that a cache filled before
# token-watcher.sh was copied gains it without a rebuild.
whereabouts_scripts() {
  local v="$1" out="$BIN/whereabouts-$1-script"
  [[ -s "$out/install-cni.sh" ]] && { [[ $v != v0.9.* ]] || [[ -s "$out/token-watcher.sh" ]]; } && return 0
  local dir f
  dir=$(whereabouts_source "$v" scripts) || return 1
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  cp "$dir"/script/install-cni.sh "$out.tmp/"
  for f in lib.sh token-watcher.sh; do
    [[ -f "$dir/script/$f" ]] && cp "$dir/script/$f" "$out.tmp/"
  done
  chmod -R u+w "$out.tmp"
  rm -rf "$out" && mv "$out.tmp" "$out"
  log "copied whereabouts $v's scripts to $out"
}

# build_busybox puts Debian 12's static busybox in the cache, from the
# package archive through apt (no install: the .deb is unpacked here), checked
# against its pinned sha256.
build_busybox() {
  local out="busybox-$BUSYBOX_VERSION"; have "$out" && return 0
  log "fetching busybox-static $BUSYBOX_DEB_VERSION (Debian 12)"
  local d="$SRC/$out"
  rm -rf "$d" && mkdir -p "$d"
  if ! (cd "$d" && apt-get download -q "busybox-static=$BUSYBOX_DEB_VERSION" >&2); then
    # A machine whose package lists were never fetched knows no version.
    log "apt-get download failed; updating the package lists once"
    apt-get update -qq >&2
    (cd "$d" && apt-get download -q "busybox-static=$BUSYBOX_DEB_VERSION" >&2)
  fi
  local deb; deb=$(ls "$d"/busybox-static_*.deb)
  if [[ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$BUSYBOX_DEB_SHA256" ]]; then
    echo "tools: $deb has sha256 $(sha256sum "$deb" | cut -d' ' -f1), want $BUSYBOX_DEB_SHA256: refusing it" >&2
    return 1
  fi
  dpkg-deb -x "$deb" "$d/root"
  cp "$d/root/bin/busybox" "$BIN/.$out.tmp" && chmod 0755 "$BIN/.$out.tmp"
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  log "unpacked $BIN/$out"
}

# whereabouts_crds V copies whereabouts V's CRDs (its doc/crds) into the
# cache: the rig installs them inside its network namespace, where no module
# can be fetched. Apart from the binaries, so that a cache built before it
# gains them without a rebuild.
whereabouts_crds() {
  local v="$1" out="$BIN/whereabouts-$1-crds"
  [[ -s "$out/whereabouts.cni.cncf.io_ippools.yaml" ]] && return 0
  local dir
  dir=$(whereabouts_source "$v" CRDs) || return 1
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  cp "$dir"/doc/crds/whereabouts.cni.cncf.io_*.yaml "$out.tmp/" && chmod -R u+w "$out.tmp"
  rm -rf "$out" && mv "$out.tmp" "$out"
  log "copied whereabouts $v's CRDs to $out"
}

# build_webhook: cmd/webhook of Harvester's network controller, from a module
# that copies its go.sum and its replace directives (it builds only with them),
# and the CRDs it waits for (its manifests/crds), copied beside it: the rig runs
# in a network namespace where no module can be fetched.
build_webhook() {
  local out="harvester-network-webhook-$NETWORK_CONTROLLER_VERSION"
  have "$out" && [[ -d "$BIN/$out-crds" ]] && return 0
  log "building harvester-network-controller $NETWORK_CONTROLLER_VERSION's webhook (about 4 minutes cold)"
  local d; d=$(newmod "$out")
  local mod=github.com/harvester/harvester-network-controller
  local info dir
  info=$(cd "$d" && GONOSUMDB=$mod GOFLAGS=-mod=mod go mod download -json "$mod@$NETWORK_CONTROLLER_VERSION")
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
  local sum; sum=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  if [[ "$sum" != "$NETWORK_CONTROLLER_SUM" ]]; then
    echo "tools: $mod@$NETWORK_CONTROLLER_VERSION has module hash '$sum', want $NETWORK_CONTROLLER_SUM: refusing to build it" >&2
    return 1
  fi
  log "$mod@$NETWORK_CONTROLLER_VERSION module hash $sum matches the pinned one"
  cp "$dir/go.sum" "$d/go.sum" && chmod u+w "$d/go.sum"
  printf '%s %s %s\n' "$mod" "$NETWORK_CONTROLLER_VERSION" "$NETWORK_CONTROLLER_SUM" >>"$d/go.sum"
  {
    printf '\nrequire %s %s\n\n' "$mod" "$NETWORK_CONTROLLER_VERSION"
    # Its replace block and one-line replaces, as they are.
    awk '/^replace \(/{p=1} p{print} p&&/^\)/{p=0} /^replace [^(]/{print}' "$dir/go.mod"
  } >>"$d/go.mod"
  (cd "$d" && GONOSUMDB=$mod GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/.$out.tmp" "$mod/cmd/webhook")
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  rm -rf "$BIN/$out-crds.tmp" && mkdir -p "$BIN/$out-crds.tmp"
  cp "$dir"/manifests/crds/*.yaml "$BIN/$out-crds.tmp/" && chmod -R u+w "$BIN/$out-crds.tmp"
  rm -rf "$BIN/$out-crds" && mv "$BIN/$out-crds.tmp" "$BIN/$out-crds"
  log "built $BIN/$out and copied its CRDs to $BIN/$out-crds"
}

build_multus() {
  local out="multus-$MULTUS_VERSION"
  if ! have "$out"; then
    log "building multus $MULTUS_VERSION"
    local d; d=$(newmod "$out")
    (cd "$d" && go get "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@$MULTUS_VERSION")
    install_bin "$out" "$d" gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
  fi
  multus_crd
}

# multus_crd copies the NetworkAttachmentDefinition CRD (the first document of
# Multus' deployments/multus-daemonset.yml) beside the binary: the rig installs
# it from there, inside its network namespace, where no module can be fetched.
multus_crd() {
  local out="$BIN/multus-$MULTUS_VERSION-nad-crd.yaml"; [[ -s "$out" ]] && return 0
  local dir
  dir=$(cd "$SRC" && go mod download -json "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@$MULTUS_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  awk 'BEGIN { RS = "\n---\n" } /kind: CustomResourceDefinition/ { print; exit }' "$dir/deployments/multus-daemonset.yml" >"$out.tmp"
  if ! grep -q 'name: network-attachment-definitions.k8s.cni.cncf.io' "$out.tmp"; then
    echo "tools: no NetworkAttachmentDefinition CRD in $dir/deployments/multus-daemonset.yml" >&2
    rm -f "$out.tmp"; return 1
  fi
  mv -f "$out.tmp" "$out"
  log "copied the NAD CRD of multus $MULTUS_VERSION to $out"
}

# monitoring_crds copies the Prometheus Operator's ServiceMonitor and
# PrometheusRule CRDs (its example/prometheus-operator-crd) into the cache: the
# chart's monitoring objects are checked against them inside the rig's network
# namespace, where no module can be fetched.
monitoring_crds() {
  local out="$BIN/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION-crds"
  [[ -s "$out/monitoring.coreos.com_servicemonitors.yaml" && -s "$out/monitoring.coreos.com_prometheusrules.yaml" ]] && return 0
  local dir
  dir=$(cd "$SRC" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  mkdir -p "$out.tmp"
  for res in servicemonitors prometheusrules; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$res.yaml" "$out.tmp/" || { rm -rf "$out.tmp"; return 1; }
  done
  rm -rf "$out"; mv "$out.tmp" "$out"
  log "copied the monitoring.coreos.com CRDs of prometheus-operator $PROMETHEUS_OPERATOR_VERSION to $out"
}

# build_promtool: Prometheus' promtool, whose `test rules` evaluates the
# chart's PrometheusRule with Prometheus' rule engine.
build_promtool() {
  local out="promtool-$PROMETHEUS_VERSION"; have "$out" && return 0
  log "building promtool $PROMETHEUS_RELEASE (module $PROMETHEUS_VERSION; about 3 minutes cold)"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION")
  (cd "$d" && go build -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_RELEASE" \
    -o "$BIN/.$out.tmp" github.com/prometheus/prometheus/cmd/promtool)
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  log "built $BIN/$out"
}

# helm renders and lints install/chart in the tests, as a user would.
build_helm() {
  local out="helm-$HELM_VERSION"; have "$out" && return 0
  log "building helm $HELM_VERSION (about 2 minutes cold)"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "helm.sh/helm/v3@$HELM_VERSION")
  install_bin "$out" "$d" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
}

build_crane() {
  local out="crane-$CRANE_VERSION"; have "$out" && return 0
  log "building crane $CRANE_VERSION"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "github.com/google/go-containerregistry@$CRANE_VERSION")
  install_bin "$out" "$d" github.com/google/go-containerregistry/cmd/crane
}

# build_helm_controller: RKE2's helm-controller, as released (its own go.mod's
# dependencies); it registers its CRDs itself.
build_helm_controller() {
  local out="helm-controller-$HELM_CONTROLLER_VERSION"; have "$out" && return 0
  log "building helm-controller $HELM_CONTROLLER_VERSION"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "github.com/k3s-io/helm-controller@$HELM_CONTROLLER_VERSION")
  install_bin "$out" "$d" github.com/k3s-io/helm-controller \
    "-X github.com/k3s-io/helm-controller/pkg/version.Version=$HELM_CONTROLLER_VERSION -X github.com/k3s-io/helm-controller/pkg/version.GitCommit=module"
}

# harvester_crds copies Harvester's Addon CRD (its chart harvester-crd) into
# the cache, from its module checked against the pinned hash: the add-on test
# validates the Addon against it inside the rig's network namespace.
harvester_crds() {
  local out="$BIN/harvester-$HARVESTER_VERSION-crds"
  [[ -s "$out/harvesterhci.io_addons.yaml" ]] && return 0
  local mod=github.com/harvester/harvester info dir sum
  info=$(cd "$SRC" && GONOSUMDB=$mod go mod download -json "$mod@$HARVESTER_VERSION") || return 1
  sum=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  if [[ "$sum" != "$HARVESTER_SUM" ]]; then
    echo "tools: $mod@$HARVESTER_VERSION has module hash '$sum', want $HARVESTER_SUM: refusing its CRDs" >&2
    return 1
  fi
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  cp "$dir/deploy/charts/harvester-crd/templates/harvesterhci.io_addons.yaml" "$out.tmp/" && chmod -R u+w "$out.tmp"
  rm -rf "$out" && mv "$out.tmp" "$out"
  log "copied Harvester $HARVESTER_VERSION's Addon CRD to $out"
}

# k3s_crds copies k3s' Addon CRD (k3s-io/api's pkg/crds/yaml/generated) into
# the cache, from its module checked against the pinned hash: the add-on
# tests install it beside Harvester's, as on a Harvester node.
k3s_crds() {
  local out="$BIN/k3s-api-$K3S_API_VERSION-crds"
  [[ -s "$out/k3s.cattle.io_addons.yaml" ]] && return 0
  local mod=github.com/k3s-io/api info dir sum
  info=$(cd "$SRC" && go mod download -json "$mod@$K3S_API_VERSION") || return 1
  sum=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  if [[ "$sum" != "$K3S_API_SUM" ]]; then
    echo "tools: $mod@$K3S_API_VERSION has module hash '$sum', want $K3S_API_SUM: refusing its CRDs" >&2
    return 1
  fi
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  cp "$dir/pkg/crds/yaml/generated/k3s.cattle.io_addons.yaml" "$out.tmp/" && chmod -R u+w "$out.tmp"
  rm -rf "$out" && mv "$out.tmp" "$out"
  log "copied k3s' Addon CRD (k3s-io/api $K3S_API_VERSION) to $out"
}

# gremlins plants one bug at a time in the code and runs the unit tests on it (make mutate).
build_gremlins() {
  local out="gremlins-$GREMLINS_VERSION"; have "$out" && return 0
  log "building gremlins $GREMLINS_VERSION"
  local d; d=$(newmod "$out")
  (cd "$d" && go get "github.com/go-gremlins/gremlins@$GREMLINS_VERSION")
  install_bin "$out" "$d" github.com/go-gremlins/gremlins/cmd/gremlins
}

paths() {
  echo "etcd=$BIN/etcd-$ETCD_VERSION"
  echo "kube-apiserver=$BIN/kube-apiserver-$KUBE_VERSION"
  local b
  for b in $KUBE_NODE_BINARIES; do echo "$b=$BIN/$b-$KUBE_VERSION"; done
  echo "cnitool=$BIN/cnitool-$CNI_VERSION"
  echo "bridge=$BIN/bridge-$PLUGINS_VERSION"
  echo "host-local=$BIN/host-local-$PLUGINS_VERSION"
  echo "loopback=$BIN/loopback-$PLUGINS_VERSION"
  local v
  for v in $WHEREABOUTS_VERSIONS; do
    echo "whereabouts-$v=$BIN/whereabouts-$v"
    echo "ip-control-loop-$v=$BIN/ip-control-loop-$v"
    echo "whereabouts-script-$v=$BIN/whereabouts-$v-script"
    echo "whereabouts-crds-$v=$BIN/whereabouts-$v-crds"
  done
  echo "whereabouts-reconciler-v0.9.4=$BIN/whereabouts-reconciler-v0.9.4"
  echo "macvlan=$BIN/macvlan-$PLUGINS_VERSION"
  for v in $CONFORMANCE_VERSIONS; do
    echo "whereabouts-e2e-$v=$BIN/whereabouts-e2e-$v"
    echo "whereabouts-e2e-node-slice-$v=$BIN/whereabouts-e2e-node-slice-$v"
    echo "node-slice-controller-$v=$BIN/node-slice-controller-$v"
    echo "whereabouts-manifests-$v=$BIN/whereabouts-$v-manifests"
  done
  echo "busybox=$BIN/busybox-$BUSYBOX_VERSION"
  echo "webhook=$BIN/harvester-network-webhook-$NETWORK_CONTROLLER_VERSION"
  echo "webhook-crds=$BIN/harvester-network-webhook-$NETWORK_CONTROLLER_VERSION-crds"
  echo "multus=$BIN/multus-$MULTUS_VERSION"
  echo "multus-nad-crd=$BIN/multus-$MULTUS_VERSION-nad-crd.yaml"
  echo "helm=$BIN/helm-$HELM_VERSION"
  echo "gremlins=$BIN/gremlins-$GREMLINS_VERSION"
  echo "crane=$BIN/crane-$CRANE_VERSION"
  echo "helm-controller=$BIN/helm-controller-$HELM_CONTROLLER_VERSION"
  echo "harvester-crds=$BIN/harvester-$HARVESTER_VERSION-crds"
  echo "k3s-crds=$BIN/k3s-api-$K3S_API_VERSION-crds"
  echo "monitoring-crds=$BIN/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION-crds"
  echo "promtool=$BIN/promtool-$PROMETHEUS_VERSION"
}

# DEMO_TOOLS are what `make demo` (tools/rig demo) runs, by the names paths
# prints: the rig's API server, and for the reboot a cluster of its own with
# kubelet nodes (its controller manager and scheduler, containerd's CNI
# plugins, Multus, the NAD CRD); whereabouts v0.9.3 and v0.7.0, v0.7.0's
# install step (the stand-in's node), v0.9.4's CRDs (the rig's newest);
# cnitool. No helm, webhook, promtool, crane, busybox, nor the other
# whereabouts versions and their controllers: make test builds those.
DEMO_TOOLS="etcd kube-apiserver kubelet kube-controller-manager kube-scheduler cnitool bridge host-local loopback
  multus multus-nad-crd whereabouts-v0.9.3 whereabouts-v0.7.0 whereabouts-script-v0.7.0 whereabouts-crds-v0.9.4"

# set_tools SET: the tools of SET (demo; all: every tool but gremlins and make
# conformance's, which build on their first use).
set_tools() {
  case $1 in
    demo) echo $DEMO_TOOLS ;;
    all) paths | cut -d= -f1 | grep -Ev '^(gremlins|whereabouts-e2e-.*|node-slice-controller-.*|whereabouts-manifests-.*)$' | tr '\n' ' ' ;;
    *) echo "tools: no set $1 (demo, all)" >&2; return 2 ;;
  esac
}

# unit_of NAME: the build that makes tool NAME, and its lane ("big" or
# "rest", as all and demo run them) and about how many seconds it takes cold
# on two idle cores (measured for kube-apiserver, etcd, helm, webhook and
# promtool; the others estimated from their module sizes).
unit_of() {
  case $1 in
    etcd) echo "etcd big 80" ;;
    kube-apiserver) echo "kube-apiserver big 420" ;;
    kubelet|kube-controller-manager|kube-scheduler|kubectl) echo "$1 big 100" ;;
    cnitool) echo "cnitool rest 30" ;;
    bridge|host-local|loopback|macvlan) echo "cni-plugins rest 90" ;;
    multus|multus-nad-crd) echo "multus rest 120" ;;
    whereabouts-v*) echo "$1 rest 120" ;;
    ip-control-loop-*|whereabouts-reconciler-*) echo "$1 rest 40" ;;
    whereabouts-script-*|whereabouts-crds-*|*-crds) echo "$1 rest 10" ;;
    busybox) echo "busybox rest 10" ;;
    helm) echo "helm big 120" ;;
    webhook) echo "webhook rest 240" ;;
    crane) echo "crane rest 90" ;;
    helm-controller) echo "helm-controller rest 150" ;;
    promtool) echo "promtool rest 180" ;;
    whereabouts-e2e-node-slice-*|node-slice-controller-*|whereabouts-manifests-*) echo "conformance-${1##*-} rest 150" ;;
    whereabouts-e2e-*) echo "conformance-${1#whereabouts-e2e-} rest 150" ;;
    *) echo "$1 rest 60" ;;
  esac
}

# plan SET says, in one line and at once, what of SET is still to build and
# about how long that takes, or that it is all cached.
plan() {
  local set="$1" tools n p unit lane secs big=0 rest=0 todo=() seen=" "
  tools=$(set_tools "$set") || return 2
  declare -A path
  while IFS='=' read -r n p; do path[$n]=$p; done < <(paths)
  for n in $tools; do
    [[ -e "${path[$n]}" ]] && continue
    read -r unit lane secs <<<"$(unit_of "$n")"
    [[ $seen == *" $unit "* ]] && continue
    seen+="$unit "
    todo+=("$unit")
    if [[ $lane == big ]]; then big=$((big + secs)); else rest=$((rest + secs)); fi
  done
  if ((${#todo[@]} == 0)); then
    echo "tools: the $set set is cached in $BIN: nothing to build"
    return 0
  fi
  local longest=$((big > rest ? big : rest))
  echo "tools: building the $set set's ${todo[*]} into $BIN, once: about $(((longest + 59) / 60)) minutes on 2 idle cores (two lanes; longer on a busy machine)"
}

case "${1:-all}" in
  dir) echo "$BIN" ;;
  paths) paths ;;
  set) set_tools "${2:-}" ;;
  plan) plan "${2:-}" ;;
  demo)
    # The demo's tools alone, in all's two lanes.
    (build_kube_apiserver; build_kube_node kubelet kube-controller-manager kube-scheduler; build_etcd) & big=$!
    (build_cnitool; build_plugins
      for v in v0.9.3 v0.7.0; do build_whereabouts_plugin "$v"; done
      whereabouts_scripts v0.7.0; whereabouts_crds v0.9.4; build_multus) & rest=$!
    ok=0
    wait "$rest" || ok=$?
    wait "$big" || ok=$?
    exit "$ok"
    ;;
  etcd) build_etcd ;;
  kube-apiserver) build_kube_apiserver ;;
  kube-node) build_kube_node ;;
  busybox) build_busybox ;;
  cnitool) build_cnitool ;;
  cni-plugins) build_plugins ;;
  whereabouts-v*) build_whereabouts "${1#whereabouts-}"; whereabouts_scripts "${1#whereabouts-}"; whereabouts_crds "${1#whereabouts-}" ;;
  webhook) build_webhook ;;
  multus) build_multus ;;
  helm) build_helm ;;
  gremlins) build_gremlins ;;
  crane) build_crane ;;
  helm-controller) build_helm_controller ;;
  harvester-crds) harvester_crds ;;
  k3s-crds) k3s_crds ;;
  promtool) build_promtool ;;
  conformance) build_plugins; for v in $CONFORMANCE_VERSIONS; do build_conformance "$v"; done ;;
  conformance-v*) build_conformance "${1#conformance-}" ;;
  all)
    # Two lanes side by side: one go build alone leaves a core idle while it
    # downloads and links. The Kubernetes binaries, about half the work, have
    # a lane of their own with etcd and helm (the node's binaries right after
    # kube-apiserver, whose build cache they reuse); the rest take the other.
    (build_kube_apiserver; build_kube_node; build_etcd; build_helm) & big=$!
    (build_cnitool; build_plugins; build_busybox
      for v in $WHEREABOUTS_VERSIONS; do build_whereabouts "$v"; whereabouts_scripts "$v"; whereabouts_crds "$v"; done
      build_multus; monitoring_crds; build_webhook
      # The add-on's and the registry's tools, in the lane that ends first.
      build_crane; build_helm_controller; harvester_crds; k3s_crds; build_promtool) & rest=$!
    ok=0
    wait "$rest" || ok=$?
    wait "$big" || ok=$?
    exit "$ok"
    ;;
  *) echo "usage: $0 [all|dir|paths|etcd|kube-apiserver|kube-node|cnitool|cni-plugins|whereabouts-vX.Y.Z|busybox|multus|helm|webhook|crane|helm-controller|harvester-crds|k3s-crds|promtool|gremlins|conformance|conformance-vX.Y.Z]" >&2; exit 2 ;;
esac
