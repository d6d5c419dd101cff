#!/usr/bin/env bash
# behaviours.sh plants, one at a time on a scratch copy of the module, each
# bug that once got through every test, and runs the test that must catch
# it: each must FAIL with its bug planted, and pass without. It never
# touches the work tree. docs/testing.md says when to add a row; the results of
# past runs are in docs/history/testing-log-2026.md.
#
#   tools/mutate/behaviours.sh            # all
#   tools/mutate/behaviours.sh 3 5        # some, by number
set -uo pipefail
# The Makefile's flags: the same flags share the build cache.
export GOTOOLCHAIN=local GOFLAGS='-mod=mod -trimpath' CGO_ENABLED=0
root=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

want=" $* "
fail=0

# plant NUMBER WHAT FILE PERL-SUBSTITUTION (perl -0pe) PACKAGE TEST-REGEX
plant() {
  local num=$1 what=$2 file=$3 expr=$4 pkg=$5 test=$6
  if [[ $want != "  " && $want != *" ${num%[a-z]} "* && $want != *" $num "* ]]; then return; fi
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
plant 2 'the reconciler releases without its fresh look' reconcile/reconciler.go \
  's#stillStale\(due, fresh, sb\)#func() shim.Picker { _, _ = fresh, sb; return shim.Exactly(due) }()#' \
  ./reconcile '^TestPassKeepsWhatCameBackToLife$'
plant 3a 'a sighting is reused after its entry changed hands (the pass)' reconcile/reconciler.go \
  's#if !ok \|\| s\.holder != holderOf\(v\.ContainerID\) \{#if !ok {#' \
  ./reconcile '^TestSightingRestartsWhenTheEntryChangesHands$'
plant 3b 'a sighting is kept after its entry changed hands (the write)' reconcile/reconciler.go \
  's#ok && holderOf\(a\.ContainerID\) == s\.holder \{#ok && a.ContainerID == a.ContainerID {#' \
  ./reconcile '^TestSightingIsForgottenWhenTheEntryChangesHandsUnderTheWrite$'
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
  ./reconcile '^TestSightingsAreAGuardedWrite$'
plant 7a 'ADD releases earlier sandboxes only when it sees two or more' plugin/add.go \
  's#len\(earlier\(cached\)\) == 0#len(earlier(cached)) <= 1#' \
  ./plugin '^TestAddLeavesThePodOneEntryWhateverItsEarlierSandboxes$'
plant 7b '(the same bug)' plugin/add.go \
  's#len\(earlier\(cached\)\) == 0#len(earlier(cached)) <= 1#' \
  ./plugin '^TestACrashLoopHoldsOneEntryAfterEveryAdd$'
plant 7c '(the same: the simulation alone, seed 14 on each version)' plugin/add.go \
  's#len\(earlier\(cached\)\) == 0#len(earlier(cached)) <= 1#' \
  ./testcni/sim '^TestRegressionSeeds$/^one_earlier_sandbox_left_by_ADD'
plant 8a 'the delegate found is the stand-in itself, not the binary aside' plugin/delegate/find.go \
  's#return aside, nil#return path, nil#' \
  ./plugin/delegate '^TestTheStandInsDelegateIsTheRealBinaryAside$'
plant 8b '(the same bug)' plugin/delegate/find.go \
  's#return aside, nil#return path, nil#' \
  ./plugin/delegate '^TestFind$'
plant 9a "the self-delegation guard left out of the delegate's environment" plugin/delegate/delegate.go \
  's#return append\(slices\.Clip\(env\), GuardEnv\+"=1"\)#return slices.Clip(env)#' \
  ./plugin/delegate '^TestHarvesterIPAMAsItsOwnDelegateStopsAtOnce$'
plant 9b '(the same, for the delegate started early only)' plugin/delegate/delegate.go \
  's#cmd\.Env = guarded\(env\)#cmd.Env = env#' \
  ./plugin/delegate '^TestHarvesterIPAMAsItsOwnDelegateStopsAtOnce$'
plant 9c '(the same, for the delegate invoke runs only)' plugin/delegate/delegate.go \
  's#stdinData, guarded\(environ\)\)#stdinData, environ)#' \
  ./plugin/delegate '^TestHarvesterIPAMAsItsOwnDelegateStopsAtOnce$'
plant 9d 'a harvester-ipam started as its own delegate does not refuse' plugin/plugin.go \
  's#if os\.Getenv\(delegate\.GuardEnv\) != "" \{#if false {#' \
  ./plugin '^TestStartedAsItsOwnDelegateEveryVerbRefuses$'

plant 10 'the watcher blind to a write into the file at the name (GNU cp -f)' install/standin/watch.go \
  's#const mask = unix\.IN_CLOSE_WRITE \| #const mask = #' \
  ./install/standin '^TestWatchSeesEveryWrite$'

# The audit (issue 44's "behaviour nothing holds yet"): each one-line bug
# got past every test and the simulation; each has a test of its own now.
plant U1 'a network-status listing the interface with no address counts as attached' reconcile/audit/rules.go \
  's#\(r\.iface == "" \|\| a\.iface == r\.iface\) \&\& len\(a\.ips\) > 0 \{#(r.iface == "" || a.iface == r.iface) {#' \
  ./reconcile/audit '^TestJudge$'
plant U2 "instance managers not Running yet left out of the headroom's need" reconcile/audit/headroom.go \
  's#p\.Namespace != o\.LonghornNamespace \|\| !live\(p\)#p.Namespace != o.LonghornNamespace || !running(p)#' \
  ./reconcile/audit '^TestHeadroomCountsInstanceManagersNotRunningYet$'
plant U3 'the findings gauge set from the findings opened at this look' reconcile/audit/watch/auditor.go \
  's#a\.Metrics\.set\(c\.Open, #a.Metrics.set(c.Opened, #' \
  ./reconcile/audit/watch '^TestTheFindingsGaugeCountsEveryOpenFinding$'

# The NADs whereabouts users make (testcni/sim's NAD kinds, issue 44): F1
# got past every test until the simulation played a network of two pools;
# U4 undoes the audit's collision domains, which the simulation now holds
# to the world where two NADs turn reservations off.
kinds='^TestNADKindRegressionSeeds$/^'
plant F1 "an ADD's release of one pool forgets the earlier sandbox's whole record" plugin/checkpoint/checkpoint.go \
  's#if rest := r\.without\(pool\); len\(rest\.Pools\) > 0 \{#if rest := r.without(pool); false \&\& len(rest.Pools) > 0 {#' \
  ./testcni/sim "${kinds}an_ADD_released_one_of_two_pools"
plant F1u '(the same bug)' plugin/checkpoint/checkpoint.go \
  's#if rest := r\.without\(pool\); len\(rest\.Pools\) > 0 \{#if rest := r.without(pool); false \&\& len(rest.Pools) > 0 {#' \
  ./plugin/checkpoint '^TestForgetPoolKeepsTheRecordOfTheOtherPools$'
plant F1p '(the same bug)' plugin/checkpoint/checkpoint.go \
  's#if rest := r\.without\(pool\); len\(rest\.Pools\) > 0 \{#if rest := r.without(pool); false \&\& len(rest.Pools) > 0 {#' \
  ./plugin '^TestAnEarlierSandboxsDELReleasesThePoolItsNextADDDidNot$'
plant U4 'two claims collide across pools whose NADs turn reservations off' reconcile/audit/rules.go \
  's#\tif pool == "" \|\| x\.poolReserves\(pool\) \{#\tif true {#' \
  ./testcni/sim "${kinds}one_address_from_two_pools"
plant U4u '(the same bug)' reconcile/audit/rules.go \
  's#\tif pool == "" \|\| x\.poolReserves\(pool\) \{#\tif true {#' \
  ./reconcile/audit '^TestNoSharedAddressAcrossNonOverlappingPools$'

# whereabouts' own suite (issue 43): a pod deleted with a grace period of 0
# and made again at once polled without its entry, on the exec path, when
# the earlier sandbox's DEL came before the next sandbox's ADD allocated.
plant W1 "an earlier sandbox's DEL releases the entry the pod's ADD in flight takes over" plugin/del.go \
  's#\t\tif a\.IfName != d\.args\.IfName \|\| a\.PodRef == "" \{#\t\tif true {#' \
  ./plugin '^TestAnEarlierSandboxsDELLeavesItsEntryToThePodsADDInFlight$'
plant W1m "(the same bug: the ADD does not mark itself in flight)" plugin/add.go \
  's#\ta\.inFlight = done#\tdone()#' \
  ./plugin '^TestAnEarlierSandboxsDELLeavesItsEntryToThePodsADDInFlight$'

# The agent asked again for one ADD on v0.7.0's CRDs (issue 44's ten-minute
# simulation, seeds 13527 and 6018): its first ask's entry, ifname pruned.
plant A9 "an ADD asked again forgets what its first ask recorded" agent/alloc/delegate.go \
  's#if have, ok, err := cp\.Read\(args\.ContainerID, args\.IfName\); err == nil && ok \{\n\t\tfor#if have, ok, err := cp.Read(args.ContainerID, args.IfName); false \&\& err == nil \&\& ok {\n\t\tfor#' \
  ./testcni/sim "${kinds}an_ADD_asked_again_allocated_beside_the_entry_the_first_ask_wrote\$"
plant A9r '(the same bug)' agent/alloc/delegate.go \
  's#if have, ok, err := cp\.Read\(args\.ContainerID, args\.IfName\); err == nil && ok \{\n\t\tfor#if have, ok, err := cp.Read(args.ContainerID, args.IfName); false \&\& err == nil \&\& ok {\n\t\tfor#' \
  ./agent/alloc '^TestAnADDAskedAgainKeepsTheAddressItWroteWhenTheCRDPrunedItsIfName$'
plant A9g "an ADD asked again does not know the entry its first ask wrote" agent/alloc/group.go \
  's#\tif len\(m\.recorded\) == 0 \{#\tif true {#' \
  ./agent/alloc '^TestAnADDAskedAgainKeepsTheAddressItWroteWhenTheCRDPrunedItsIfName$'


# The node agent (agent/alloc, the plugin's lost ADD): each bug planted is
# caught by a unit test and, where it found it on its own, by the
# simulation's regression seed (testcni/sim, TestRegressionSeeds). A6 and A7
# undo a fix of what the simulation found.
seeds='^TestRegressionSeeds$/^'
plant A1 "the agent keeps an address another pod reserved (no give-up)" agent/alloc/reserve.go \
  's#\t\tif err := a\.giveUp\(ctx, c\); err != nil \{#\t\tif true {\n\t\t\tdeliver(m, c.ip, nil)\n\t\t\treturn\n\t\t}\n\t\tif err := a.giveUp(ctx, c); err != nil {#' \
  ./testcni/sim "${seeds}the_agent_keeps_an_address_another_pod_reserved\$"
plant A1u '(the same bug)' agent/alloc/reserve.go \
  's#\t\tif err := a\.giveUp\(ctx, c\); err != nil \{#\t\tif true {\n\t\t\tdeliver(m, c.ip, nil)\n\t\t\treturn\n\t\t}\n\t\tif err := a.giveUp(ctx, c); err != nil {#' \
  ./agent/alloc '^TestAnAddressReservedByAnotherPodIsGivenUp$'
plant A2 "the agent writes an entry before it records the address" agent/alloc/delegate.go \
  's#(\tips, err := d\.Allocator\.Allocate\([^\n]*?)Chosen: record\}\)#\t_ = record\n$1Chosen: nil})#' \
  ./testcni/sim "${seeds}the_agent_writes_before_it_records_the_address\$"
plant A2u '(the same bug)' agent/alloc/delegate.go \
  's#(\tips, err := d\.Allocator\.Allocate\([^\n]*?)Chosen: record\}\)#\t_ = record\n$1Chosen: nil})#' \
  ./agent/alloc '^TestDelegateRecordsTheAddressBeforeItWritesTheEntry$'
plant A3 "a lost ADD allocates again without releasing first" plugin/offer.go \
  's#\tif err := p\.releaseLost\(ctx, args\); err != nil \{\n\t\treturn err\n\t\}\n##' \
  ./testcni/sim "${seeds}a_lost_ADD_allocates_again_without_releasing\$"
plant A3u '(the same bug)' plugin/offer.go \
  's#\tif err := p\.releaseLost\(ctx, args\); err != nil \{\n\t\treturn err\n\t\}\n##' \
  ./plugin '^TestALostAddLeavesThePodOneAddress$'
plant A4 "the agent keeps the pod's own reservation without the Lease" agent/alloc/reserve.go \
  's#\t\tif err := a\.keepOwn\(ctx, m, name, spec\); err != nil \{#\t\tif false {#' \
  ./agent/alloc '^TestThePodsOwnReservationIsKept$'
plant A5 "the agent's pool patch without its resourceVersion test" shim/assign.go \
  's#Guarded\(base\.ResourceVersion, ops\.\.\.\)#Patch{ops: ops}#' \
  ./shim '^TestAssignWritesNothingOnAStaleBase$'
plant A6 "a give-up misses its entry whose ifname v0.7.0's CRD pruned" agent/alloc/reserve.go \
  's#\(e\.IfName == m\.ifName \|\| e\.IfName == ""\)#e.IfName == m.ifName#' \
  ./testcni/sim "${seeds}the_agent_gives_up_an_address_whose_entry.s_ifname_was_pruned"
plant A6u '(the same bug)' agent/alloc/reserve.go \
  's#\(e\.IfName == m\.ifName \|\| e\.IfName == ""\)#e.IfName == m.ifName#' \
  ./agent/alloc '^TestAnAddressGivenUpIsRemovedWhenTheCRDPrunedItsIfName$'
plant A7 "a reservation another pool may share created without the Lease" agent/alloc/reserve.go \
  's#\tif a\.o\.Pools == nil \{\n\t\treturn false#\tif true {\n\t\treturn false#' \
  ./testcni/sim "${seeds}whereabouts._ADD_loses_the_reservation_to_the_agent"
plant A7u '(the same bug)' agent/alloc/reserve.go \
  's#\tif a\.o\.Pools == nil \{\n\t\treturn false#\tif true {\n\t\treturn false#' \
  ./agent/alloc '^TestAReservationAnotherPoolMayShareIsCreatedUnderTheLease$'

# Issue 44's agent and GC lines that nothing held: each changed by one line
# got through every test and the simulation; now each is caught by its unit
# test. C1: the agent's own patch taken as proof that its watch follows; C2:
# a watch refused at its start left unrecorded; C3: a declined request keeps
# its slot (C3t through Take); C4: GC looks the sandbox's sibling records up
# under a wrong key; C5: a resumed watch that delivers never clears the
# failure (item 6); C6: the readiness probe served while the copy is behind.
plant C1 "the agent's own patch taken as proof that its watch follows" agent/cache/cache.go \
  's#(p, err := a\.API\.PatchPool\(ctx, namespace, name, patch\)\n\tif err == nil \{\n\t\ta\.Objects\.SawPool\(p\))\n#$1; a.Objects.WatchedPool(namespace, p.ResourceVersion)\n#' \
  ./agent '^TestAReservationIsMadeWithoutTheLeaseOnlyOnceTheWatchShowedItsPatch$'
plant C1c '(the same bug)' agent/cache/cache.go \
  's#(p, err := a\.API\.PatchPool\(ctx, namespace, name, patch\)\n\tif err == nil \{\n\t\ta\.Objects\.SawPool\(p\))\n#$1; a.Objects.WatchedPool(namespace, p.ResourceVersion)\n#' \
  ./agent/cache '^TestTheAnswerToTheAgentsOwnWriteNeverMakesTheCopyFollow$'
plant C2 'a watch refused at its start left unrecorded' agent/cache/informer.go \
  's#\t\t\t\to\.failed\(namespace, resource, n, err\)\n#\t\t\t\t_ = n\n#' \
  ./agent/cache '^TestTheCopyFollowsAgainOnlyOnceItListsOrANewWatchDelivers$'
plant C3 'a declined request keeps its in-flight slot' agent/conn.go \
  's#(if j, reason, detail = s\.admit\(req\); reason != "" \{\n)\t\t\tfree\(\)\n#$1\t\t\t_ = free\n#' \
  ./agent '^TestADeclinedRequestGivesItsSlotBack$'
plant C3t '(the same bug, through Take)' agent/conn.go \
  's#(j, reason, detail = s\.admit\(req\)\n\tif reason != "" \{\n)\t\tfree\(\)\n#$1\t\t_ = free\n#' \
  ./agent '^TestADeclinedRequestGivesItsSlotBack$'
plant C4 "GC looks a sandbox's sibling records up under a wrong key" plugin/gc.go \
  's#sib\.of\(rec\.Namespace, pl\.Name\)#sib.of(pl.Name, rec.Namespace)#' \
  ./plugin '^TestGCLeavesAnAddressTheSandboxsOtherInterfaceRecorded$'
plant C5 'a watch the reflector resumed that delivers never clears its failure' agent/cache/informer.go \
  's#\t\t\t\t\to\.delivered\(namespace, resource, n\)\n#\t\t\t\t\t_ = n\n#' \
  ./agent/cache '^TestTheCopyFollowsAgainOnlyOnceItListsOrANewWatchDelivers$'
plant C6 'the readiness probe served while the copy does not follow' agent/admit.go \
  's#if d := s\.declinesAll\(\); d != nil \{\n\t\treturn d\n\t\}\n\tif req\.Env#if d := s.declinesAll(); d != nil && !(d.reason == "behind" && req.Command == wire.Probe) {\n\t\treturn d\n\t}\n\tif req.Env#' \
  ./agent '^TestAnAgentWhoseCopyDoesNotFollowDeclines$'

# The stand-in (install/standin): each bug of the review that found ways to
# lose whereabouts' binary, planted again, is caught by its unit test and by
# the bin-dir model (TestModel explores every interleaving of every scenario).
sm=./install/standin/model
plant S1 'a build is harvester-ipam by its main package path' install/standin/layout.go \
  's#return contains\(fsys, path, \[\]byte\(Mark\)\)#info, err := buildinfo.ReadFile(path); _ = fsys; return err == nil \&\& info.Path == Module+"/cmd/harvester-ipam", nil#' \
  ./install/standin '^TestAForkStandsInAndGivesBack$'
plant S1m '(the same bug)' install/standin/layout.go \
  's#return contains\(fsys, path, \[\]byte\(Mark\)\)#info, err := buildinfo.ReadFile(path); _ = fsys; return err == nil \&\& info.Path == Module+"/cmd/harvester-ipam", nil#' \
  $sm '^TestModel$'
plant S2 'without the exchange, harvester-ipam renamed over the real binary' install/standin/take.go \
  's#return d\.replaceWithoutExchange\(ctx, self, n\)#_ = n; if err := fsys.Rename(self, d.name()); err != nil { return false, err }; return true, fsys.SyncDir(d.Path)#' \
  ./install/standin '^TestWithoutExchangeTheRealBinaryIsKept$'
plant S2m '(the same bug)' install/standin/take.go \
  's#return d\.replaceWithoutExchange\(ctx, self, n\)#_ = n; if err := fsys.Rename(self, d.name()); err != nil { return false, err }; return true, fsys.SyncDir(d.Path)#' \
  $sm '^TestModel$'
plant S3 'every stop gives the name back' install/standin/take.go \
  's#\tif !uninstall \{\n\t\treturn false, why, nil#\tif false \&\& !uninstall {\n\t\treturn false, why, nil#' \
  ./install/standin '^TestStopGivesBackOnlyOnUninstall$'
plant S3m '(the same bug)' install/standin/take.go \
  's#\tif !uninstall \{\n\t\treturn false, why, nil#\tif false \&\& !uninstall {\n\t\treturn false, why, nil#' \
  $sm '^TestModel$'
plant S4 'a file still being written is deleted for failing its probe' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, busy#s' \
  ./install/standin '^TestAWriterStillWritingWhenTakenIsKept$'
plant S4m '(the same bug)' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, busy#s' \
  $sm '^TestModel$'
plant S5 'a recovery deletes a file whose probe gave no answer' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, unknown#s' \
  ./install/standin '^TestRecoveryWithoutAnAnswerKeepsTheOnlyRealBinary$'
plant S5m '(the same bug)' install/standin/take.go \
  's#(func \(d Dir\) settle.*?\tcase ours, broken)#$1, unknown#s' \
  $sm '^TestModel$'
plant S6a 'a fragment at the name is never repaired' install/standin/take.go \
  's#(\tcase broken:\n\t\t// A fragment whose writer is gone[^\n]*\n)#$1\t\treturn changed, pending(d.name(), n)\n#' \
  ./install/standin '^TestAHalfWrittenNameIsRepaired$'
plant S6am '(the same bug)' install/standin/take.go \
  's#(\tcase broken:\n\t\t// A fragment whose writer is gone[^\n]*\n)#$1\t\treturn changed, pending(d.name(), n)\n#' \
  $sm '^TestModel$'
plant S6b 'giving back takes a fragment at the name for a newer binary' install/standin/take.go \
  's#\tcase n\.kind == runs:\n\t\t// The real binary is at the name#\tcase n.kind == runs || n.kind == broken:\n\t\t// The real binary is at the name#' \
  ./install/standin '^TestAHalfWrittenNameIsRepaired$'
plant S6bm '(the same bug)' install/standin/take.go \
  's#\tcase n\.kind == runs:\n\t\t// The real binary is at the name#\tcase n.kind == runs || n.kind == broken:\n\t\t// The real binary is at the name#' \
  $sm '^TestModel$'
plant S7 'never ready on a node without whereabouts' install/standin/take.go \
  's#\tcase n\.kind == missing \&\& a\.kind == missing:#\tcase false:#' \
  ./install '^TestVerifyStandIn$'
plant S7m '(the same bug)' install/standin/take.go \
  's#\tcase n\.kind == missing \&\& a\.kind == missing:#\tcase false:#' \
  $sm '^TestModel$'
plant S8 'the name missing: a false error, and no fsync' install/standin/take.go \
  's#\t\terr := fsys\.Link\(tmp, d\.name\(\)\)\n#\t\tif err := fsys.Rename(tmp, d.name()); err != nil { return false, err }; d.at(StepExchanged); return true, fsys.Remove(tmp)\n\t\terr := fsys.Link(tmp, d.name())\n#' \
  ./install/standin '^TestTheNameMissingIsFilled$'
plant S8m '(the same bug)' install/standin/take.go \
  's#\t\terr := fsys\.Link\(tmp, d\.name\(\)\)\n#\t\tif err := fsys.Rename(tmp, d.name()); err != nil { return false, err }; d.at(StepExchanged); return true, fsys.Remove(tmp)\n\t\terr := fsys.Link(tmp, d.name())\n#' \
  $sm '^TestModel$'
# The one-line bugs a later review planted in the stand-in and found alive;
# each is caught by a test of its own now, and where the model can see it, by
# the model too.
plant S9 'a binary that crashed once taken for a fragment' install/standin/take.go \
  's#\tif errors\.Is\(l\.why, ErrBroken\) \{\n\t\tfsys\.Sleep\(confirmBroken\)\n\t\tl\.why = d\.Probe\(ctx, path\)\n\t\}\n##' \
  ./install/standin '^TestABinaryThatCrashedOnceIsNotAFragment$'
plant S9m '(the same bug)' install/standin/take.go \
  's#\tif errors\.Is\(l\.why, ErrBroken\) \{\n\t\tfsys\.Sleep\(confirmBroken\)\n\t\tl\.why = d\.Probe\(ctx, path\)\n\t\}\n##' \
  $sm '^TestModel$'
plant S10 'what was probed not checked against what was looked at' install/standin/take.go \
  's#\tif now, err := fsys\.Stat\(path\); err != nil \|\| !f\.Unchanged\(now\) \{\n\t\tl\.kind, l\.why = unknown, [^\n]*\n\t\}\n##' \
  ./install/standin '^TestALookIsOfTheFileItStats$'
plant S11 'a captured link kept though the name changed' install/standin/take.go \
  's#if err != nil \|\| !n\.file\.Unchanged\(c\) \{#if err != nil || !n.file.Unchanged(c) \&\& false {#' \
  ./install/standin '^TestACaptureIsOfTheFileLookedAt$'
plant S12 'the aside dropped without checking the name still holds the real binary' install/standin/take.go \
  's#(\t\tif a\.kind != missing \{\n)\t\t\tif err := d\.still\(n, d\.name\(\)\); err != nil \{\n\t\t\t\treturn false, err\n\t\t\t\}\n#$1#' \
  ./install/standin '^TestTheAsideGoesOnlyWhileTheNameHoldsTheRealBinary$'
plant S13 'ready while another build stands in' install/standin/take.go \
  's#\tif !same \{\n\t\treturn "", fmt\.Errorf\("not standing in#\tif !same \&\& false {\n\t\treturn "", fmt.Errorf("not standing in#' \
  ./install '^TestVerifyStandIn$'
plant S14 'real binaries ordered by their times' install/standin/take.go \
  's#if a, err := fsys\.Stat\(d\.aside\(\)\); err == nil \&\& a\.Same\(t\) \{#if a, err := fsys.Stat(d.aside()); err == nil \&\& (a.Same(t) || !t.ModTime.After(a.ModTime)) {#' \
  ./install/standin '^TestNoClockOrdersTheRealBinaries$'
plant S14m '(the same bug)' install/standin/take.go \
  's#if a, err := fsys\.Stat\(d\.aside\(\)\); err == nil \&\& a\.Same\(t\) \{#if a, err := fsys.Stat(d.aside()); err == nil \&\& (a.Same(t) || !t.ModTime.After(a.ModTime)) {#' \
  $sm '^TestModel$'
plant S15 'a give-back moves the aside out before the exchange (a kill leaves no delegate)' install/standin/take.go \
  's#\terr = fsys\.Exchange\(d\.aside\(\), d\.name\(\)\)\n\tif errors\.Is\(err, ErrNoExchange\) \{\n\t\t// The window#\tback := filepath.Join(d.Path, captureName)\n\tif err := fsys.Rename(d.aside(), back); err != nil {\n\t\treturn false, err\n\t}\n\td.at(StepMarked)\n\tif err := fsys.Rename(back, d.aside()); err != nil {\n\t\treturn false, err\n\t}\n\terr = fsys.Exchange(d.aside(), d.name())\n\tif errors.Is(err, ErrNoExchange) {\n\t\t// The window#' \
  $sm '^TestModel$'
exit $fail
