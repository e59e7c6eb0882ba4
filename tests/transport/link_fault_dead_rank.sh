#!/usr/bin/env bash
# Dead peer: rank 1 of 3 kills itself (SIGKILL) mid-exchange. Every surviving rank must
# fail within the deadline with a message naming rank 1, and exit non-zero.
# mpirun runs with --enable-recovery so that it does not kill the survivors first: the
# point is that our links notice, not that mpirun does.
#   link_fault_dead_rank.sh PROBE BACKEND MPIEXEC [MPIEXEC FLAGS...]
# (MPIEXEC may be scripts/cluster with "mpirun --map-by node" as its flags: the emulated
# cluster, where rank 1 dies on another host than ranks 0 and 2.)
set -u
source "$(dirname "$0")/fault_lib.sh"
PROBE=$1 BACKEND=$2 MPIEXEC=$3
shift 3
DEADLINE_MS=4000
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
start=$(date +%s.%N)
# setsid: the job gets its own process group, stopped once the survivors have reported
# (across hosts mpirun can linger after losing a rank, even with --enable-recovery).
setsid timeout 60 "$MPIEXEC" "$@" -np 3 --enable-recovery "$PROBE" "$BACKEND" $DEADLINE_MS "$OUT" \
  --die-rank 1 --die-after 20 --rounds 100000 >"$OUT/log" 2>&1 &
job=$!
stop_when_reported "$job" "$OUT" 0 2
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
cat "$OUT/log" | grep -v "PMIX ERROR" | tail -20
fail=0
for r in 0 2; do
  failure_report "$OUT" $r || { fail=1; continue; }
  secs=$(awk '{print $2}' <<<"$REPORT")
  grep -q "rank 1" <<<"$REPORT" || { echo "FAIL: rank $r's error does not name rank 1"; fail=1; }
  within_deadline $r "$secs" $DEADLINE_MS 2 || fail=1
done
[ -f "$OUT/rank1.txt" ] && { echo "FAIL: rank 1 should have died"; fail=1; }
echo "job exit $rc, ${elapsed}s"
[ $fail = 0 ] && echo PASS
exit $fail
