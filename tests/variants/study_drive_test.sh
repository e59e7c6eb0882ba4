#!/usr/bin/env bash
# `trellis study variants` and ladder's drivers end to end: --transport steers the TP
# all-reduce (the title names the links), ladder@MODE rows run side by side with their own
# progress options (cooperative progress tests the in-flight all-reduces from the kernels,
# the log says how often), and a bad mode is rejected with the valid ones named.
# Usage: study_drive_test.sh TRELLIS MPIEXEC [FLAGS...]
set -u
T=$1; shift
MPI=("$@")
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
study() {
  timeout 120 "${MPI[@]}" -np 2 "$T" --log-level info --set kernels.threads=1 study variants --preset tiny --tp 2 \
    --batch 2 --prompt-len 4 --gen-len 2 --repeats 1 --warmup 0 "$@" 2>&1
}
out=$(study --transport tcp --variants ladder@coop:0,ladder@thread,ladder@none); rc=$?
[ $rc = 0 ] && echo "ok   study over --transport tcp ran" || { fail "study --transport tcp (rc=$rc)"; tail -5 <<<"$out"; }
grep -q "all-reduce: ring over tcp; links: tcp links" <<<"$out" && echo "ok   --transport tcp steers the TP all-reduce" || fail "title does not name tcp links"
for m in coop:0 thread none; do
  grep -qE "^  ladder@$m +all " <<<"$out" && echo "ok   row ladder@$m" || fail "no row for ladder@$m"
done
coop=$(grep -oE "ladder@coop:0: prefill [0-9.]+ ms \(compute thread CPU [0-9.]+ ms; [0-9]+ background / [0-9]+ cooperative" <<<"$out" |
       grep -oE "[0-9]+ cooperative" | grep -oE "^[0-9]+")
[ -n "$coop" ] && [ "$coop" -gt 0 ] && echo "ok   cooperative progress tested the all-reduces ($coop tests)" ||
  fail "ladder@coop:0 made no cooperative tests ('$coop')"
grep -qE "ladder@none: prefill [0-9.]+ ms \(compute thread CPU [0-9.]+ ms; 0 background / 0 cooperative" <<<"$out" &&
  echo "ok   ladder@none made no tests" || fail "ladder@none made tests"
out=$(study --variants ladder@fast); rc=$?
[ $rc != 0 ] && grep -q "unknown mode (valid: thread, coop, both, none)" <<<"$out" && echo "ok   bad mode rejected" ||
  fail "ladder@fast not rejected (rc=$rc)"
out=$(study --variants parallel@coop); rc=$?
[ $rc != 0 ] && grep -q "only ladder takes a progress mode" <<<"$out" && echo "ok   mode on another variant rejected" ||
  fail "parallel@coop not rejected (rc=$rc)"
echo "$fails failed"
[ "$fails" = 0 ]
