#!/usr/bin/env bash
# `trellis study variants` under mpirun -np 2 (tiny preset, tiny sizes): the text tables name
# every variant and batch and label nocomm; the CSV has a header and one well-formed row per
# (variant, batch); the SVG parses as XML with one bar per point and the nocomm label; the
# study runs with pipeline stages (tp=2 x pp=2 on 4 ranks, tp=1 x pp=2); a wrong world size
# or more stages than layers end with one clear error. Checks structure, never timings.
# Usage: study_cli_test.sh PATH/TO/trellis PYTHON MPIEXEC [FLAGS...]
set -u
T="$1"; PY="$2"; shift 2
MPI=("$@")
fails=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { timeout 180 "${MPI[@]}" "$@"; }
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; echo "$out" | tail -30; fails=$((fails+1)); }

out=$(run -np 2 "$T" study variants --preset tiny --tp 2 --batch 1,3 --prompt-len 4 --gen-len 2 --repeats 1 \
        --warmup 0 --ladder-layers 2-3 --csv "$work/s.csv" --svg "$work/s.svg" 2>&1); rc=$?
if [ $rc = 0 ]; then ok "study variants ran (tp=2)"; else bad "study variants (rc=$rc)"; fi
for v in standard parallel ladder desync2 desync4 lp nocomm; do
  if [ "$(grep -cE "^  $v " <<<"$out")" = 2 ]; then ok "table rows for $v"; else bad "table rows for $v"; fi
done
if grep -q "^batch 1:" <<<"$out" && grep -q "^batch 3:" <<<"$out"; then ok "one table per batch"; else bad "batch tables"; fi
if [ "$(grep -E '^  nocomm ' <<<"$out" | grep -c 'upper bound, outputs wrong')" = 2 ]; then ok "nocomm labelled in the table"
else bad "nocomm label in the table"; fi
if grep -qE '^  ladder +2-3 ' <<<"$out"; then ok "ladder shows its layer range"; else bad "ladder layer range"; fi

out=$("$PY" - "$work/s.csv" "$work/s.svg" <<'PYEOF' 2>&1
import csv, math, sys, xml.etree.ElementTree as ET
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 14, f"{len(rows)} CSV rows, want 14"
for r in rows:
    assert len(r) == 20 and None not in r, f"ragged row {r}"
    for k in ("prefill_ms", "decode_ms", "tokens_per_s", "decode_thread_cpu_ms", "decode_process_cpu_ms"):
        v = float(r[k]); assert v > 0 and math.isfinite(v), f"{k}={v} in {r}"
    assert (r["note"] == "upper bound, outputs wrong") == (r["variant"] == "nocomm"), r
    assert (r["exact"] == "0") == (r["variant"] == "nocomm"), r
std = [r for r in rows if r["variant"] == "standard"]
assert all(abs(float(r["speedup_pct"])) < 1e-9 for r in std), "standard's speedup is not 0"
assert all(int(r["all_reduces_decode"]) == 0 for r in rows if r["variant"] == "nocomm"), "nocomm all-reduces"
assert all(int(r["all_reduces_decode"]) == 8 for r in std), "standard: 2 all-reduces x 4 layers"
root = ET.parse(sys.argv[2]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
bars = [e for e in root.iter(ns + "rect") if e.find(ns + "title") is not None]
assert len(bars) == 14, f"{len(bars)} bars, want 14"
assert all(float(b.get("height")) >= 0 for b in bars)
text = " ".join(t.text or "" for t in root.iter(ns + "text"))
assert "nocomm (upper bound, outputs wrong)" in text and "batch 3" in text, text
print("csv and svg well-formed")
PYEOF
); if [ $? = 0 ]; then ok "$out"; else bad "csv/svg"; fi

# Pipeline stages: tp=2 x pp=2 (4 ranks) and tp=1 x pp=2. Each stage holds 2 of the 4 layers;
# ARs/step sums the stages, so standard still reports 8 and parallel 4; lp pairs per stage.
out=$(run -np 4 "$T" study variants --preset tiny --tp 2 --pp 2 --batch 1,2 --prompt-len 4 --gen-len 2 --repeats 1 \
        --warmup 0 --csv "$work/pp.csv" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "pp=2" <<<"$out"; then ok "tp=2 x pp=2 ran"; else bad "tp=2 x pp=2 (rc=$rc)"; fi
# Column 9 is ARs/step (the per-step CPU columns follow it).
if [ "$(grep -E '^  standard ' <<<"$out" | awk '{print $9}' | sort -u)" = 8 ] &&
   [ "$(grep -E '^  parallel ' <<<"$out" | awk '{print $9}' | sort -u)" = 4 ] &&
   [ "$(grep -cE '^  (standard|parallel|ladder|desync2|desync4|lp|nocomm) ' <<<"$out")" = 14 ]; then
  ok "pp=2: every variant at every batch, all-reduces summed over the stages"
else bad "pp=2 table"; fi
out=$(run -np 2 "$T" study variants --preset tiny --tp 1 --pp 2 --batch 2 --prompt-len 4 --gen-len 2 --repeats 1 \
        --warmup 0 --variants standard,ladder 2>&1); rc=$?
if [ $rc = 0 ] && [ "$(grep -cE '^  (standard|ladder|nocomm) ' <<<"$out")" = 3 ]; then ok "tp=1 x pp=2 ran"; else bad "tp=1 x pp=2 (rc=$rc)"; fi
out=$(run -np 2 "$T" --set comm.progress_interval_us=50 study variants --preset tiny --tp 2 --batch 2 --prompt-len 4 \
        --gen-len 2 --repeats 1 --warmup 0 --variants ladder --wake-control --wake-interval-us 300 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "progress thread on (50 us), wake control (300 us) on every variant" <<<"$out" &&
   [ "$(grep -cE '^  (standard|ladder|nocomm) ' <<<"$out")" = 3 ]; then ok "--wake-control runs and is named"
else bad "--wake-control (rc=$rc)"; fi
# The compute thread's and the process's CPU time per decode step (columns 10, 11) are
# measured (positive; no order between them is checked: at these microsecond sizes the two
# clocks' sampling overhead and the max over ranks blur it).
if awk '/^  (standard|ladder|nocomm) / { if (!($10 > 0 && $11 > 0)) bad = 1; n++ } END { exit (bad || n != 3) }' <<<"$out"; then
  ok "per-step CPU time columns filled"
else bad "per-step CPU time columns"; fi
out=$(run -np 2 "$T" study variants --preset tiny --tp 2 --pp 5 2>&1); rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "needs 10" <<<"$out"; then ok "--pp 5 on 2 ranks: clear error"; else bad "--pp 5 (rc=$rc)"; fi
out=$(run -np 5 "$T" study variants --preset tiny --tp 1 --pp 5 2>&1); rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "cannot split a model of 4 layers" <<<"$out"; then ok "more stages than layers: clear error"
else bad "--pp 5 over 4 layers (rc=$rc)"; fi
out=$(run -np 2 "$T" study variants --preset tiny --tp 4 2>&1); rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c 'needs 4' <<<"$out")" = 1 ]; then ok "wrong world size: one error"
else bad "wrong world size (rc=$rc)"; fi

echo "$fails failed"
[ "$fails" = 0 ]
