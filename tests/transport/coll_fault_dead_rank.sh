#!/usr/bin/env bash
# A member of a shm all-reduce group killed (SIGKILL) while its peers are blocked on the
# segment's futex: every survivor must fail with kPeerFailed naming the dead rank, within
# the deadline, and must have blocked (parks > 0) while it waited, so that the futex path
# itself is what is tested. --enable-recovery keeps mpirun from killing the survivors first.
#   coll_fault_dead_rank.sh PROBE NP MPIEXEC [MPIEXEC FLAGS...]
set -u
PROBE=$1 NP=$2 MPIEXEC=$3
shift 3
DEADLINE_MS=5000 DIE_RANK=1 DIE_MS=600
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
setsid timeout 60 "$MPIEXEC" "$@" -np "$NP" --enable-recovery "$PROBE" $DEADLINE_MS "$OUT" $DIE_RANK $DIE_MS \
  >"$OUT/log" 2>&1 &
job=$!
survivors=$(seq 0 $((NP - 1)) | grep -vx $DIE_RANK)
for _ in $(seq 600); do
  all=1
  for r in $survivors; do [ -f "$OUT/rank$r.txt" ] || all=0; done
  [ $all = 1 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
sleep 0.2
kill -- -"$job" 2>/dev/null; sleep 0.3; kill -9 -- -"$job" 2>/dev/null
wait "$job" 2>/dev/null
grep -v "PMIX ERROR" "$OUT/log" | tail -10
fail=0
for r in $survivors; do
  f="$OUT/rank$r.txt"
  if [ ! -f "$f" ]; then echo "FAIL: rank $r wrote no report (hung or killed)"; fail=1; continue; fi
  line=$(cat "$f")
  echo "rank $r: $line"
  case "$line" in
    fail*) ;;
    *) echo "FAIL: rank $r did not fail"; fail=1; continue ;;
  esac
  read -r _ secs parks _ <<<"$line"
  grep -q "rank $DIE_RANK" <<<"$line" || { echo "FAIL: rank $r's error does not name rank $DIE_RANK"; fail=1; }
  grep -q "died" <<<"$line" || { echo "FAIL: rank $r's error does not say the rank died"; fail=1; }
  [ "$parks" -gt 0 ] || { echo "FAIL: rank $r never blocked while it waited ${DIE_MS} ms"; fail=1; }
  # Within the deadline (plus scheduling slack on a loaded 2-core machine).
  awk -v s="$secs" -v d=$DEADLINE_MS 'BEGIN { exit !(s <= d / 1000 + 1) }' \
    || { echo "FAIL: rank $r took ${secs}s, deadline ${DEADLINE_MS} ms"; fail=1; }
done
[ -f "$OUT/rank$DIE_RANK.txt" ] && { echo "FAIL: rank $DIE_RANK should have died"; fail=1; }
[ $fail = 0 ] && echo PASS
exit $fail
