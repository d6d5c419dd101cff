#!/usr/bin/env bash
# behaviours.sh plants, one at a time on a scratch copy of the module, each
# bug of issue 15's six (and the racing writers' reconciler), and runs the
# test that must catch it: each must FAIL with its bug planted, and pass
# without. It never touches the work tree. docs/testing.md has the results.
#
#   mutate/behaviours.sh            # all
#   mutate/behaviours.sh 3 5        # some, by number
set -uo pipefail
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

want=" $* "
fail=0

# plant NUMBER WHAT FILE PERL-SUBSTITUTION (perl -0pe) PACKAGE TEST-REGEX
plant() {
  local num=$1 what=$2 file=$3 expr=$4 pkg=$5 test=$6
  if [[ $want != "  " && $want != *" ${num%[ab]} "* && $want != *" $num "* ]]; then return; fi
  rm -rf "$scratch/m" && mkdir -p "$scratch/m"
  (cd "$root" && tar --exclude=./.git --exclude=./bin -cf - .) | tar -C "$scratch/m" -xf -
  if ! (cd "$scratch/m" && go test -count=1 -run "$test" "$pkg" >/dev/null 2>&1); then
    row "$num" "$what" "FAILS CLEAN" "$test"; fail=1; return
  fi
  if ! perl -0pi -e "$expr" "$scratch/m/$file" || cmp -s "$root/$file" "$scratch/m/$file"; then
    row "$num" "$what" "NOT PLANTED" "$file: the substitution matched nothing"; fail=1; return
  fi
  local out
  if out=$(cd "$scratch/m" && go test -count=1 -run "$test" "$pkg" 2>&1); then
    row "$num" "$what" "MISSED" "$test"; fail=1
  elif grep -q -e '\[build failed\]' -e 'setup failed' <<<"$out"; then
    row "$num" "$what" "NO BUILD" "$test"; fail=1
    grep -m5 -e '\.go:[0-9]' <<<"$out" | sed 's/^/       /'
  else
    row "$num" "$what" "caught" "$test"
  fi
}
row() { printf '%-4s %-66s %-8s %s\n' "$@"; }

row "#" "bug planted" "result" "test"
plant 1a 'ADD writes its checkpoint after the delegate, not before' plugin/add.go \
  's#(\tif err := cp\.Write\(rec\); err != nil \{\n.*?\n\t\}\n)(.*?p\.at\("add-after-delegate"\)\n)#$2$1#s' \
  ./plugin '^TestAddThatDiesAfterTheDelegateIsReleasedByADelWithTheNADGone$'
plant 1b '(the same bug)' plugin/add.go \
  's#(\tif err := cp\.Write\(rec\); err != nil \{\n.*?\n\t\}\n)(.*?p\.at\("add-after-delegate"\)\n)#$2$1#s' \
  ./plugin '^TestAddRecordsTheAttachmentBeforeItDelegates$'
plant 2 'the reconciler releases without its fresh look' shim/reconcile/reconciler.go \
  's#stillStale\(due, fresh, sb\)#func() shim.Picker { _, _ = fresh, sb; return shim.Exactly(due) }()#' \
  ./shim/reconcile '^TestPassKeepsWhatCameBackToLife$'
plant 3a 'a sighting is reused after its entry changed hands (the pass)' shim/reconcile/reconciler.go \
  's#if !ok \|\| s\.holder != holderOf\(v\.ContainerID\) \{#if !ok {#' \
  ./shim/reconcile '^TestSightingRestartsWhenTheEntryChangesHands$'
plant 3b 'a sighting is kept after its entry changed hands (the write)' shim/reconcile/reconciler.go \
  's#ok && holderOf\(a\.ContainerID\) == s\.holder \{#ok && a.ContainerID == a.ContainerID {#' \
  ./shim/reconcile '^TestSightingIsForgottenWhenTheEntryChangesHandsUnderTheWrite$'
plant 4 'GC removes a checkpoint even when releasing its allocation failed' plugin/gc.go \
  's#(failures = append\(failures, fmt\.Sprintf\("%s/%s: %v", rec\.ContainerID, rec\.IfName, err\)\))\n\t\t\tcontinue\n#$1\n#' \
  ./plugin '^TestGC$'
plant 5a 'DEL looks in the kubeconfig namespace, not the checkpoint one' plugin/del.go \
  's#add\(poolRef\{rec\.Namespace, #add(poolRef{store.Namespace(), #' \
  ./plugin '^TestDelReleasesInTheCheckpointsNamespace$'
plant 5b 'DEL releases in the kubeconfig namespace, not the checkpoint one' plugin/del.go \
  's#s := store\.In\(plan\.namespace\)#s := store#' \
  ./plugin '^TestDelReleasesInTheCheckpointsNamespace$'
plant 6 'the sighting patch without its resourceVersion test' shim/store.go \
  's#(_, err = s\.api\.PatchPool\(cctx, s\.namespace, pool, )setAnnotation\(p\.ResourceVersion, p\.Annotations, key, want\)\)#$1Patch{ops: setAnnotation(p.ResourceVersion, p.Annotations, key, want).ops[1:]})#' \
  ./shim/reconcile '^TestSightingsAreAGuardedWrite$'

# The stand-in (install/standin): each bug of the review that found ways to
# lose whereabouts' binary, planted again, is caught by its unit test and by
# the bin-dir model (TestModel explores every interleaving of every scenario).
sm=./install/standin/model
plant 7.1 'a build is harvester-ipam by its main package path' install/standin/layout.go \
  's#return contains\(fsys, path, \[\]byte\(Mark\)\)#info, err := buildinfo.ReadFile(path); _ = fsys; return err == nil \&\& info.Path == Module+"/cmd/harvester-ipam", nil#' \
  ./install/standin '^TestAForkStandsInAndGivesBack$'
plant 7.1m '(the same bug)' install/standin/layout.go \
  's#return contains\(fsys, path, \[\]byte\(Mark\)\)#info, err := buildinfo.ReadFile(path); _ = fsys; return err == nil \&\& info.Path == Module+"/cmd/harvester-ipam", nil#' \
  $sm '^TestModel$'
plant 7.2 'without the exchange, harvester-ipam renamed over the real binary' install/standin/take.go \
  's#return d\.replaceWithoutExchange\(ctx, self, n\)#_ = n; if err := fsys.Rename(self, d.name()); err != nil { return false, err }; return true, fsys.SyncDir(d.Path)#' \
  ./install/standin '^TestWithoutExchangeTheRealBinaryIsKept$'
plant 7.2m '(the same bug)' install/standin/take.go \
  's#return d\.replaceWithoutExchange\(ctx, self, n\)#_ = n; if err := fsys.Rename(self, d.name()); err != nil { return false, err }; return true, fsys.SyncDir(d.Path)#' \
  $sm '^TestModel$'
plant 7.3 'every stop gives the name back' install/standin/take.go \
  's#\tif !uninstall \{\n\t\treturn false, why, nil#\tif false \&\& !uninstall {\n\t\treturn false, why, nil#' \
  ./install/standin '^TestStopGivesBackOnlyOnUninstall$'
plant 7.3m '(the same bug)' install/standin/take.go \
  's#\tif !uninstall \{\n\t\treturn false, why, nil#\tif false \&\& !uninstall {\n\t\treturn false, why, nil#' \
  $sm '^TestModel$'
plant 7.4 'a file still being written is deleted for failing its probe' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, busy#s' \
  ./install/standin '^TestAWriterStillWritingWhenTakenIsKept$'
plant 7.4m '(the same bug)' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, busy#s' \
  $sm '^TestModel$'
plant 7.5 'a recovery deletes a file whose probe gave no answer' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, unknown#s' \
  ./install/standin '^TestRecoveryWithoutAnAnswerKeepsTheOnlyRealBinary$'
plant 7.5m '(the same bug)' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, unknown#s' \
  $sm '^TestModel$'
plant 7.6a 'a fragment at the name is never repaired' install/standin/take.go \
  's#(\tcase broken:\n\t\t// A fragment whose writer is gone[^\n]*\n)#$1\t\treturn changed, pending(d.name(), n)\n#' \
  ./install/standin '^TestAHalfWrittenNameIsRepaired$'
plant 7.6am '(the same bug)' install/standin/take.go \
  's#(\tcase broken:\n\t\t// A fragment whose writer is gone[^\n]*\n)#$1\t\treturn changed, pending(d.name(), n)\n#' \
  $sm '^TestModel$'
plant 7.6b 'giving back takes a fragment at the name for a newer binary' install/standin/take.go \
  's#\tcase n\.kind == runs:\n\t\t// The real binary is at the name#\tcase n.kind == runs || n.kind == broken:\n\t\t// The real binary is at the name#' \
  ./install/standin '^TestAHalfWrittenNameIsRepaired$'
plant 7.6bm '(the same bug)' install/standin/take.go \
  's#\tcase n\.kind == runs:\n\t\t// The real binary is at the name#\tcase n.kind == runs || n.kind == broken:\n\t\t// The real binary is at the name#' \
  $sm '^TestModel$'
plant 7.7 'never ready on a node without whereabouts' install/standin/take.go \
  's#\tcase n\.kind == missing \&\& a\.kind == missing:#\tcase false:#' \
  ./install '^TestVerifyStandIn$'
plant 7.7m '(the same bug)' install/standin/take.go \
  's#\tcase n\.kind == missing \&\& a\.kind == missing:#\tcase false:#' \
  $sm '^TestModel$'
plant 7.8 'the name missing: a false error, and no fsync' install/standin/take.go \
  's#\t\terr := fsys\.Link\(tmp, d\.name\(\)\)\n#\t\tif err := fsys.Rename(tmp, d.name()); err != nil { return false, err }; d.at(StepExchanged); return true, fsys.Remove(tmp)\n\t\terr := fsys.Link(tmp, d.name())\n#' \
  ./install/standin '^TestTheNameMissingIsFilled$'
plant 7.8m '(the same bug)' install/standin/take.go \
  's#\t\terr := fsys\.Link\(tmp, d\.name\(\)\)\n#\t\tif err := fsys.Rename(tmp, d.name()); err != nil { return false, err }; d.at(StepExchanged); return true, fsys.Remove(tmp)\n\t\terr := fsys.Link(tmp, d.name())\n#' \
  $sm '^TestModel$'
exit $fail
