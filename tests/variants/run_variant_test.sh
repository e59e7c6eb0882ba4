#!/usr/bin/env bash
# `trellis run --variant V` end to end: for the variants whose math does not depend on t,
# greedy tokens at t=2 equal those at t=1; every variant runs; parallel really changes the
# output; a variant the model cannot host fails before loading with the constraint named.
# Usage: run_variant_test.sh TRELLIS MPIEXEC [FLAGS...]
set -u
T=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() {  # run VARIANT NP
  timeout 120 "${MPI[@]}" -np "$2" "$T" run --preset tiny --tp "$2" --variant "$1" \
    --workload n=4,in=8,out=8 --out "$W/$1_$2.jsonl" >"$W/$1_$2.log" 2>&1 || { fail "$1 at t=$2 exited non-zero"; tail -5 "$W/$1_$2.log"; }
}
for v in standard parallel ladder lp; do
  run "$v" 1; run "$v" 2
  cmp -s "$W/${v}_1.jsonl" "$W/${v}_2.jsonl" && [ -s "$W/${v}_1.jsonl" ] && echo "ok   $v: t=2 tokens equal t=1" || fail "$v: t=2 tokens differ from t=1"
done
# lp at t=2 runs the paper's placement (each layer of a pair on its own rank), not the fallback
out=$(timeout 120 "${MPI[@]}" -np 2 "$T" --log-level info run --preset tiny --tp 2 --variant lp --workload n=1,in=4,out=2 2>&1)
grep -q "lp placement: layer" <<<"$out" && echo "ok   lp at t=2 uses the per-layer placement" || fail "lp at t=2 did not use the per-layer placement"
for v in desync2 desync4 nocomm; do run "$v" 2 && echo "ok   $v runs at t=2"; done
grep -q "WRONG on purpose" "$W/nocomm_2.log" && echo "ok   nocomm is labelled" || fail "nocomm run is not labelled"
cmp -s "$W/standard_1.jsonl" "$W/parallel_1.jsonl" && fail "parallel gave the standard model's tokens" || echo "ok   parallel differs from standard"
out=$("${MPI[@]}" -np 1 "$T" run --preset tiny --variant lp --variant-layers 0-2 --workload n=1,in=4,out=4 2>&1); rc=$?
[ $rc != 0 ] && grep -q "even number of layers" <<<"$out" && echo "ok   odd lp range rejected" || fail "odd lp range not rejected (rc=$rc)"
out=$("${MPI[@]}" -np 1 "$T" run --preset tiny --variant fast --workload n=1,in=4,out=4 2>&1); rc=$?
[ $rc != 0 ] && grep -q "unknown variant 'fast'" <<<"$out" && echo "ok   unknown variant rejected" || fail "unknown variant not rejected (rc=$rc)"
echo "$fails failed"
[ "$fails" = 0 ]
