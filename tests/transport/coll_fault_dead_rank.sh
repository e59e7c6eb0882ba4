#!/usr/bin/env bash
# A member of a shm all-reduce group killed (SIGKILL) while its peers are blocked on the
# segment's futex: every survivor must fail with kPeerFailed naming the dead rank, within
# the deadline, and must have blocked (parks > 0) while it waited, so that the futex path
# itself is what is tested. --enable-recovery keeps mpirun from killing the survivors first.
#   coll_fault_dead_rank.sh PROBE NP MPIEXEC [MPIEXEC FLAGS...]
set -u
source "$(dirname "$0")/fault_lib.sh"
PROBE=$1 NP=$2 MPIEXEC=$3
shift 3
DEADLINE_MS=5000 DIE_RANK=1 DIE_MS=600
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
setsid timeout 60 "$MPIEXEC" "$@" -np "$NP" --enable-recovery "$PROBE" $DEADLINE_MS "$OUT" $DIE_RANK $DIE_MS \
  >"$OUT/log" 2>&1 &
job=$!
survivors=$(seq 0 $((NP - 1)) | grep -vx $DIE_RANK)
stop_when_reported "$job" "$OUT" $survivors
grep -v "PMIX ERROR" "$OUT/log" | tail -10
fail=0
for r in $survivors; do
  failure_report "$OUT" $r || { fail=1; continue; }
  read -r _ secs parks _ <<<"$REPORT"
  grep -q "rank $DIE_RANK" <<<"$REPORT" || { echo "FAIL: rank $r's error does not name rank $DIE_RANK"; fail=1; }
  grep -q "died" <<<"$REPORT" || { echo "FAIL: rank $r's error does not say the rank died"; fail=1; }
  [ "$parks" -gt 0 ] || { echo "FAIL: rank $r never blocked while it waited ${DIE_MS} ms"; fail=1; }
  within_deadline $r "$secs" $DEADLINE_MS 1 || fail=1
done
[ -f "$OUT/rank$DIE_RANK.txt" ] && { echo "FAIL: rank $DIE_RANK should have died"; fail=1; }
[ $fail = 0 ] && echo PASS
exit $fail
