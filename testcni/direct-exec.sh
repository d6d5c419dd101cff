#!/usr/bin/env bash
# direct-exec.sh: the bench's ADD and DEL ratio taken another way, to check
# it: the shell execs the IPAM binaries directly and times each exec with
# bash's $EPOCHREALTIME (forking date(1) around each exec, as this script did
# first, put whereabouts alone's DEL at 116-123 ms against 108 and moved the
# DEL ratio by 12 points), N sandboxes a side, harvester-ipam (named in the config) and
# whereabouts alone interleaved (which goes first alternates), all ADDs and
# then all DELs, as the bench's latency section does. Run it inside a rig:
#
#   go run ./tools/rig up &            # prints the rig's dir
#   nsenter -t "$(pgrep -nx rig)" -n -m -- \
#     testcni/direct-exec.sh /tmp/harvester-ipam-rig-NNN [N] [VERSION]
set -euo pipefail
rig=$1 n=${2:-40} v=${3:-v0.9.3}
cni=$rig/cni/$v flat=$rig/whereabouts.d/whereabouts.conf
hbin=$(readlink -f "$cni/harvester-ipam") wbin=$(readlink -f "$cni/whereabouts")
ip netns add direct-exec 2>/dev/null || true
work=$(mktemp -d) && trap 'rm -rf "$work"; ip netns del direct-exec 2>/dev/null || true' EXIT
tag=$(date +%s)
conf() { printf '{"cniVersion":"0.3.1","name":"direct-%s","type":"bridge","ipam":{"type":"%s","range":"%s","configuration_path":"%s"}}' "$1" "$1" "$2" "$flat"; }
declare -A bin=([H]=$hbin [W]=$wbin) cfg=([H]="$(conf harvester-ipam 10.180.0.0/16)" [W]="$(conf whereabouts 10.181.0.0/16)")
one() { # side verb i
  local t0 t1
  t0=${EPOCHREALTIME/./}
  if ! CNI_COMMAND=$2 CNI_CONTAINERID=direct-$tag-$3 CNI_NETNS=/run/netns/direct-exec CNI_IFNAME=lhnet1 CNI_PATH=$cni \
    CNI_ARGS="IgnoreUnknown=true;K8S_POD_NAMESPACE=longhorn-system;K8S_POD_NAME=direct-$tag-$3" \
    "${bin[$1]}" <<<"${cfg[$1]}" >"$work/out" 2>/dev/null; then
    echo "direct-exec: $1 $2 $3 failed: $(cat "$work/out")" >&2
    exit 1
  fi
  t1=${EPOCHREALTIME/./}
  echo "$1 $2 $((t1 - t0))" >>"$work/times"
}
for verb in ADD DEL; do
  for ((i = 0; i < n; i++)); do
    if ((i % 2)); then one H $verb $i; one W $verb $i; else one W $verb $i; one H $verb $i; fi
  done
done
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "whereabouts $v, $n sandboxes a side, each exec timed by the shell:"
for verb in ADD DEL; do
  h=$(awk -v v=$verb '$1 == "H" && $2 == v {print $3}' "$work/times" | median)
  w=$(awk -v v=$verb '$1 == "W" && $2 == v {print $3}' "$work/times" | median)
  awk -v v=$verb -v h="$h" -v w="$w" 'BEGIN {printf "  %s median: harvester-ipam %.1f ms, whereabouts alone %.1f ms, ratio %.2fx\n", v, h / 1000, w / 1000, h / w}'
done
