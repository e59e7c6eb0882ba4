#!/usr/bin/env bash
# 2 emulated hosts x 2 ranks: the ring job must see two hostnames, two ranks on each, and
# carry every byte intact across the hosts.
set -u
source "$(dirname "$0")/lib.sh"
T=$1
cluster_start 2
out=$(cluster_mpirun -np 4 "$T" bench ring --max-size 64K --iters 10 2>&1); rc=$?
echo "$out"
[ $rc = 0 ] || { echo "FAIL: ring exited $rc"; exit 1; }
grep -q "r0@th0 r1@th0 r2@th1 r3@th1" <<<"$out" || { echo "FAIL: ranks not placed 2 per emulated host"; exit 1; }
[ "$(grep -c verified <<<"$out")" -ge 5 ] || { echo "FAIL: not every size verified"; exit 1; }
echo "PASS"
