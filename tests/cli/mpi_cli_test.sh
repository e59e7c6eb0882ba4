#!/usr/bin/env bash
# The `trellis` command line under mpirun: the 4-rank ring job, info across ranks, and a
# world size a command cannot use (one error from rank 0, non-zero exit, no hang).
# Usage: mpi_cli_test.sh PATH/TO/trellis MPIEXEC [FLAGS...]
set -u
T="$1"; shift
MPI=("$@")
fails=0
run() { timeout 120 "${MPI[@]}" "$@"; }

out=$(run -np 4 "$T" bench ring --max-size 64K --iters 20 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "ring of 4 ranks" <<<"$out" && [ "$(grep -c verified <<<"$out")" -ge 5 ]; then
  echo "ok   4-rank ring verified every size"; else echo "FAIL ring (rc=$rc)"; echo "$out" | tail -20; fails=$((fails+1)); fi

out=$(run -np 4 "$T" info 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "ranks: 4 (under mpirun)" <<<"$out" && [ "$(grep -c '  rank ' <<<"$out")" = 4 ]; then
  echo "ok   info lists 4 ranks"; else echo "FAIL info under mpirun (rc=$rc)"; echo "$out" | tail -20; fails=$((fails+1)); fi

out=$(run -np 1 "$T" bench ring 2>&1); rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c 'at least 2 ranks' <<<"$out")" = 1 ]; then
  echo "ok   wrong world size: one error, exit $rc"; else echo "FAIL wrong world size (rc=$rc)"; echo "$out" | tail; fails=$((fails+1)); fi

echo "$fails failed"
[ "$fails" = 0 ]
