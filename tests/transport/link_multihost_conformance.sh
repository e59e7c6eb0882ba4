#!/usr/bin/env bash
# The link conformance body on the emulated cluster: 2 hosts x 2 ranks, so ucx, tcp and
# mpi links cross hosts over real TCP (veth + bridge) and shm joins the two ranks of
# each host. Exits 77 (skipped) when the cluster cannot run here (not root, no netns).
#   link_multihost_conformance.sh CONFORMANCE_TEST_BINARY
set -u
source "$(dirname "$0")/../multihost/lib.sh"
BIN=$1
[ -x "$MH_ROOT/scripts/cluster" ] || mh_skip "scripts/cluster is missing"
cluster_start 2
out=$(cluster_mpirun -np 4 -x TRELLIS_LOG_LEVEL=warn "$BIN" 2>&1); rc=$?
echo "$out" | grep -v "^\s*$" | tail -40
[ $rc = 0 ] || { echo "FAIL: conformance on 2 emulated hosts exited $rc"; exit 1; }
# Every host backend must have run, none skipped: a skip here would hide a broken cross-host
# path. nccl is exempt: a CUDA build on a machine without a GPU skips it by design.
if grep -qE 'SKIPPED.*/(shm|ucx|tcp|mpi)( |$)' <<<"$out"; then echo "FAIL: some backend skipped on the cluster"; exit 1; fi
echo PASS
