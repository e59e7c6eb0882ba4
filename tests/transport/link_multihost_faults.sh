#!/usr/bin/env bash
# Fault tests across the emulated cluster (2 hosts): a dead rank on the other host for the
# network backends (ucx, tcp, mpi), and the tcp link's bad-input cases with its two ranks
# on different hosts. Exits 77 (skipped) when the cluster cannot run here.
#   link_multihost_faults.sh PROBE TCP_FAULT_TEST
set -u
source "$(dirname "$0")/../multihost/lib.sh"
PROBE=$1 TCP_FAULT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$MH_ROOT/scripts/cluster" ] || mh_skip "scripts/cluster is missing"
cluster_start 2
fail=0
for backend in ucx tcp mpi; do
  echo "== dead rank across hosts, $backend"
  "$HERE/link_fault_dead_rank.sh" "$PROBE" $backend "$CLUSTER" mpirun --map-by node || fail=1
done
echo "== tcp bad input across hosts"
cluster_mpirun -np 2 --map-by node "$TCP_FAULT" 2>&1 | grep -E "OK|FAIL|PASSED|rank" || true
cluster_mpirun -np 2 --map-by node "$TCP_FAULT" >/dev/null 2>&1 || { echo "FAIL: tcp fault test across hosts"; fail=1; }
[ $fail = 0 ] && echo PASS
exit $fail
