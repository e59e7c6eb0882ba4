#!/usr/bin/env bash
# Dead peer: rank 1 of 3 kills itself (SIGKILL) mid-exchange. Every surviving rank must
# fail within the deadline with a message naming rank 1, and exit non-zero.
# mpirun runs with --enable-recovery so that it does not kill the survivors first: the
# point is that our links notice, not that mpirun does.
#   link_fault_dead_rank.sh PROBE BACKEND MPIEXEC [MPIEXEC FLAGS...]
# (MPIEXEC may be scripts/cluster with "mpirun --map-by node" as its flags: the emulated
# cluster, where rank 1 dies on another host than ranks 0 and 2.)
set -u
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
for _ in $(seq 600); do
  { [ -f "$OUT/rank0.txt" ] && [ -f "$OUT/rank2.txt" ]; } && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
sleep 0.2
kill -- -"$job" 2>/dev/null; sleep 0.3; kill -9 -- -"$job" 2>/dev/null
wait "$job" 2>/dev/null
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
cat "$OUT/log" | grep -v "PMIX ERROR" | tail -20
fail=0
for r in 0 2; do
  f="$OUT/rank$r.txt"
  if [ ! -f "$f" ]; then echo "FAIL: rank $r wrote no report (hung or killed)"; fail=1; continue; fi
  line=$(cat "$f")
  echo "rank $r: $line"
  case "$line" in
    fail*) ;;
    *) echo "FAIL: rank $r did not fail"; fail=1; continue ;;
  esac
  secs=$(awk '{print $2}' <<<"$line")
  grep -q "rank 1" <<<"$line" || { echo "FAIL: rank $r's error does not name rank 1"; fail=1; }
  # Detection within the deadline (plus scheduling slack on a loaded 2-core machine).
  awk -v s="$secs" -v d=$DEADLINE_MS 'BEGIN { exit !(s <= d / 1000 + 2) }' \
    || { echo "FAIL: rank $r took ${secs}s, deadline ${DEADLINE_MS} ms"; fail=1; }
done
[ -f "$OUT/rank1.txt" ] && { echo "FAIL: rank 1 should have died"; fail=1; }
echo "job exit $rc, ${elapsed}s"
[ $fail = 0 ] && echo PASS
exit $fail
