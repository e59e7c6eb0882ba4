#!/usr/bin/env bash
# `trellis study swift` on the tiny synthetic preset, one rank, two tasks of two short
# token-id prompts each, with SWIFT's windows made small (swift.* settings) so that it
# optimises, drafts and verifies within a few dozen tokens: the table has the Table 4
# columns and one row per task, the greedy outputs are identical (`identical: yes`), the
# CSV, SVG and JSON are well-formed, and bad input ends with one clear message. Never checks
# timings.
# Usage: swift_cli_test.sh PATH/TO/trellis PYTHON
set -u
T="$1"; PY="$2"
fails=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; echo "$out" | tail -30; fails=$((fails+1)); }

for task in alpha beta; do
  base=$([ $task = alpha ] && echo 10 || echo 200)
  for i in 1 2; do
    echo "{\"id\": \"$task$i\", \"tokens\": [$((base+i)), $((base+2*i)), $((base+3)), 7, 9], \"sampling\": {\"greedy\": true, \"max_tokens\": 40}}"
  done > "$work/$task.jsonl"
done
SET=(--set swift.gamma=4 --set swift.calibration_steps=1 --set swift.max_steps=12 --set swift.patience=6
     --set swift.bayes_interval=4 --set swift.epsilon=0 --set swift.max_draft=4 --set swift.min_speedup=0)
study() { timeout 120 "$T" "${SET[@]}" study swift --preset tiny --device cpu --tasks "$work/alpha.jsonl,$work/beta.jsonl" "$@"; }

out=$(study --csv "$work/s.csv" --svg "$work/s.svg" 2>&1); rc=$?
if [ $rc = 0 ]; then ok "study swift ran"; else bad "study swift (rc=$rc)"; fi
head=$(grep -E '^  task ' <<<"$out")
missing=""
for col in "plain tok/s" "SWIFT tok/s" speedup " M " "α" "E(Spd.)" skipped "opt steps" "opt %" "draft %" "verify %" \
           auto-off identical; do
  grep -qF -- "$col" <<<"$head" || missing="$missing [$col]"
done
if [ -n "$head" ] && [ -z "$missing" ]; then ok "table header has the Table 4 columns"; else bad "table header lacks$missing"; fi
if [ "$(grep -cE '^  (alpha|beta) +2 ' <<<"$out")" = 2 ]; then ok "one row per task"; else bad "task rows"; fi
if [ "$(grep -cE '^  (alpha|beta) .* yes$' <<<"$out")" = 2 ] && grep -q '^identical: yes$' <<<"$out"; then
  ok "identical: yes"
else bad "identical: yes"; fi
if grep -qE '^alpha: skip set .*\([0-9]+ of 8 sub-layers\)' <<<"$out"; then ok "skip set reported"; else bad "skip set line"; fi
if ! grep -q 'ERROR' <<<"$out"; then ok "no error block"; else bad "unexpected ERROR"; fi

out=$("$PY" - "$work/s.csv" "$work/s.svg" <<'PYEOF' 2>&1
import csv, math, sys, xml.etree.ElementTree as ET
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["task"] for r in rows] == ["alpha", "beta"], rows
for r in rows:
    assert len(r) == 27 and None not in r, f"ragged row {r}"
    assert r["identical"] == "yes" and r["differing"] == "0" and r["compared"] == "2", r
    for k in ("plain_tokens_per_s", "swift_tokens_per_s", "speedup"):
        v = float(r[k]); assert v > 0 and math.isfinite(v), f"{k}={v}"
    assert float(r["M"]) >= 1, r
    assert int(r["sub_layers"]) == 8 and 0 < int(r["skipped"]) < 8, r
    assert int(r["opt_steps"]) > 0, r
root = ET.parse(sys.argv[2]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
text = " ".join("".join(t.itertext()) for t in root.iter(ns + "text"))
assert "alpha: wall-clock speedup" in text and "beta: wall-clock speedup" in text, text
assert len(list(root.iter(ns + "polyline"))) >= 2, "no series"
print("csv and svg well-formed")
PYEOF
); if [ $? = 0 ]; then ok "$out"; else bad "csv/svg"; fi

out=$(study --json 2>/dev/null); rc=$?
if [ $rc = 0 ] && "$PY" -c '
import json, sys
j = json.load(sys.stdin)
assert j["all_identical"] is True and len(j["tasks"]) == 2, j
t = j["tasks"][0]
assert t["swift"]["verify_passes"] > 0 and len(t["swift"]["timeline"]) > 0, t
assert "trellis_version" in j
' <<<"$out"; then ok "--json"; else bad "--json (rc=$rc)"; fi

out=$(study --keep-outputs "$work/kept" 2>&1); rc=$?
if [ $rc = 0 ] && cmp -s "$work/kept/alpha.plain.jsonl" "$work/kept/alpha.swift.jsonl" &&
   [ "$(wc -l < "$work/kept/beta.swift.jsonl")" = 2 ]; then ok "--keep-outputs keeps equal outputs"
else bad "--keep-outputs (rc=$rc)"; fi

out=$(timeout 60 "$T" study swift --preset tiny --tasks "$work/alpha.jsonl,$work/nope.jsonl" 2>&1); rc=$?
if [ $rc = 2 ] && grep -q -- "--tasks: $work/nope.jsonl is not a prompts file" <<<"$out"; then ok "missing task file named"
else bad "missing task file (rc=$rc)"; fi
cp "$work/alpha.jsonl" "$work/beta2.jsonl"; mkdir -p "$work/d"; cp "$work/alpha.jsonl" "$work/d/alpha.jsonl"
out=$(timeout 60 "$T" study swift --preset tiny --tasks "$work/alpha.jsonl,$work/d/alpha.jsonl" 2>&1); rc=$?
if [ $rc = 2 ] && grep -q "two files are named alpha" <<<"$out"; then ok "duplicate task names refused"
else bad "duplicate task names (rc=$rc)"; fi
out=$(timeout 60 "$T" study swift --preset tiny --chat maybe 2>&1); rc=$?
if [ $rc = 2 ] && grep -q -- "--chat" <<<"$out"; then ok "bad --chat refused"; else bad "bad --chat (rc=$rc)"; fi
out=$(timeout 60 "$T" study swift --help 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "examples/swift/summarisation.jsonl" <<<"$out"; then ok "--help shows the default tasks"
else bad "--help (rc=$rc)"; fi

[ $fails = 0 ] && echo "all ok" || echo "$fails failed"
exit $fails
