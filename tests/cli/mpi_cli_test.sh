#!/usr/bin/env bash
# The `trellis` command line under mpirun: the 4-rank ring job, bench comm's all-reduce, info
# across ranks, and a world size a command cannot use (one error from rank 0, non-zero exit,
# no hang).
# Usage: mpi_cli_test.sh PATH/TO/trellis MPIEXEC [FLAGS...]
set -u
T="$1"; shift
MPI=("$@")
fails=0
run() { timeout 120 "${MPI[@]}" "$@"; }

out=$(run -np 4 "$T" bench ring --max-size 64K --iters 20 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "ring of 4 ranks" <<<"$out" && [ "$(grep -c verified <<<"$out")" -ge 5 ]; then
  echo "ok   4-rank ring verified every size"; else echo "FAIL ring (rc=$rc)"; echo "$out" | tail -20; fails=$((fails+1)); fi

# bench comm's all-reduce section (no external peers): every series verified, the shm group
# measured on a registered window too, and the calibration file names it.
cal=$(mktemp /tmp/trellis-cal-XXXXXX.json)
out=$(run -np 2 "$T" --set bench.warmup=1 bench comm --sections allreduce --no-peers --iters 3 --calibration "$cal" 2>&1); rc=$?
if [ $rc = 0 ] && ! grep -q FAILED <<<"$out" && grep -q "in a registered window (zero-copy)" <<<"$out" &&
   grep -q '"note": *"in a registered window (zero-copy)"' <(python3 -m json.tool "$cal" 2>/dev/null); then
  echo "ok   bench comm all-reduce: verified, window series, calibration"; else
  echo "FAIL bench comm all-reduce (rc=$rc)"; echo "$out" | tail -30; fails=$((fails+1)); fi
rm -f "$cal"

out=$(run -np 4 "$T" info 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "ranks: 4 (under mpirun)" <<<"$out" && [ "$(grep -c '  rank ' <<<"$out")" = 4 ]; then
  echo "ok   info lists 4 ranks"; else echo "FAIL info under mpirun (rc=$rc)"; echo "$out" | tail -20; fails=$((fails+1)); fi

# Core binding at start (comm.bind_cores): the test launcher passes --bind-to none, so both
# ranks could share a CPU; trellis gives each its own, and with the setting off leaves them.
cpus_of() { python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):]); print(" ".join(",".join(map(str,r["cpus"])) for r in j["world"]["ranks"]))'; }
if [ "$(nproc)" -ge 2 ]; then
  bound=$(run -np 2 "$T" info --json 2>/dev/null | cpus_of)
  free=$(run -np 2 "$T" --set comm.bind_cores=false info --json 2>/dev/null | cpus_of)
  set -- $bound
  if [ $# = 2 ] && [ "$1" != "$2" ] && [[ $1 != *,* ]] && [[ $2 != *,* ]]; then echo "ok   ranks bound to CPUs $1 and $2"; else
    echo "FAIL core binding: ranks on CPUs '$bound'"; fails=$((fails+1)); fi
  set -- $free
  if [ $# = 2 ] && [ "$1" = "$2" ] && [[ $1 == *,* || $1 == *-* ]]; then echo "ok   comm.bind_cores=false keeps '$1'"; else
    echo "FAIL comm.bind_cores=false: ranks on CPUs '$free'"; fails=$((fails+1)); fi
  out=$(run -np $(( $(nproc) + 1 )) "$T" info 2>&1)
  if grep -q "share $(nproc) CPUs" <<<"$out"; then echo "ok   more ranks than CPUs: warned"; else
    echo "FAIL no warning for $(( $(nproc) + 1 )) ranks on $(nproc) CPUs"; echo "$out" | head; fails=$((fails+1)); fi
fi

out=$(run -np 1 "$T" bench ring 2>&1); rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c 'at least 2 ranks' <<<"$out")" = 1 ]; then
  echo "ok   wrong world size: one error, exit $rc"; else echo "FAIL wrong world size (rc=$rc)"; echo "$out" | tail; fails=$((fails+1)); fi

echo "$fails failed"
[ "$fails" = 0 ]
