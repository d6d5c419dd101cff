#!/usr/bin/env bash
# deps.sh installs, from Debian's packages, what `make demo` and `make test`
# run beside the tools testcni/tools.sh builds: iproute2 (the rig's network
# namespaces), containerd and runc (the real node), util-linux's nsenter (the
# servers of a cluster of the rig's own run on its machine), bindfs (a
# filesystem without RENAME_EXCHANGE, for the stand-in's tests). It runs first, so a
# machine without them learns it in its first second: as root it installs
# them; otherwise it prints the one command to run and fails.
set -euo pipefail

# The real-node tests are written against Debian 12's containerd and runc.
CONTAINERD_VERSION=1.6.20
RUNC_VERSION=1.1.5

need=()
command -v ip >/dev/null || need+=(iproute2)
command -v containerd >/dev/null && command -v containerd-shim-runc-v2 >/dev/null && command -v ctr >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
command -v nsenter >/dev/null || need+=(util-linux)
command -v bindfs >/dev/null && command -v fusermount >/dev/null || need+=(bindfs)

if ((${#need[@]})); then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "deps: missing ${need[*]}: run, as root on Debian 12: apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "deps: installing ${need[*]} from Debian's packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

want_version() {
  local bin=$1 want=$2 out
  out=$("$bin" --version 2>&1 | head -1)
  if ! grep -Eq "(^|[ v])${want//./\\.}([~+-][^ ]*)?( |$)" <<<"$out"; then
    echo "deps: the real-node tests need $bin $want (Debian 12's package), but $(command -v "$bin") says: $out" >&2
    exit 1
  fi
}
want_version containerd "$CONTAINERD_VERSION"
want_version runc "$RUNC_VERSION"
