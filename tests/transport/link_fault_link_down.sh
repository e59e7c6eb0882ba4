#!/usr/bin/env bash
# Downed link on the emulated cluster: 2 hosts x 1 rank exchange over BACKEND; once both
# are connected, host th1's eth0 goes down (`ip link set eth0 down` in its namespace).
# Rank 0 must fail within the deadline with an error that names rank 1, and exit non-zero.
#   link_fault_link_down.sh PROBE BACKEND
set -u
source "$(dirname "$0")/../multihost/lib.sh"
source "$(dirname "$0")/fault_lib.sh"
PROBE=$1 BACKEND=$2
DEADLINE_MS=4000
[ -x "$MH_ROOT/scripts/cluster" ] || mh_skip "scripts/cluster is missing"
cluster_start 2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"; "$CLUSTER" down >/dev/null 2>&1 || true' EXIT
# --enable-recovery: mpirun must not be the one that ends the job. setsid gives mpirun its
# own process group, so that the whole job can be stopped once rank 0 has reported.
setsid timeout 60 "$CLUSTER" mpirun -np 2 --map-by node --enable-recovery "$PROBE" "$BACKEND" $DEADLINE_MS "$OUT" \
  --rounds 1000000 --round-ms 5 >"$OUT/log" 2>&1 &
job=$!
for _ in $(seq 300); do
  [ -f "$OUT/rank0.started" ] && [ -f "$OUT/rank1.started" ] && break
  sleep 0.1
done
[ -f "$OUT/rank0.started" ] && [ -f "$OUT/rank1.started" ] || { cat "$OUT/log"; echo "FAIL: ranks never connected"; exit 1; }
sleep 0.5
ip netns exec th1 ip link set eth0 down
# Rank 0's report must appear within the deadline plus slack; mpirun itself may then hang on
# its lost daemon, so the job is stopped once the report is in.
for _ in $(seq $((DEADLINE_MS / 100 + 40))); do
  [ -f "$OUT/rank0.txt" ] && break
  sleep 0.1
done
ip netns exec th1 ip link set eth0 up || true
stop_job "$job" 0.5
grep -v "PMIX ERROR" "$OUT/log" | tail -15
[ -f "$OUT/rank0.txt" ] || { echo "FAIL: rank 0 did not report within the deadline (hung?)"; exit 1; }
failure_report "$OUT" 0 || exit 1
grep -q "rank 1" <<<"$REPORT" || { echo "FAIL: rank 0's error does not name rank 1"; exit 1; }
within_deadline 0 "$(awk '{print $2}' <<<"$REPORT")" $DEADLINE_MS 2 || exit 1
echo PASS
