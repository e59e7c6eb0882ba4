#!/usr/bin/env bash
# `trellis plan --validate-published`: the shipped file gives the table with a summary and
# exit 0 (every direction as the file expects), --json carries every row, a malformed file
# names the entry and the field, and --model stays required for planning.
set -u
TRELLIS=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
check() {  # check NAME EXPECTED_RC PATTERN -- command...
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $want_rc ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name (rc $rc, want $want_rc, pattern '$pattern')"
    echo "$out" | tail -20
    fail=1
  else
    echo "ok   $name"
  fi
}

check table 0 'direction right in [0-9]+ of [0-9]+; ratio within 30% in [0-9]+ of [0-9]+' -- \
  "$TRELLIS" plan --validate-published
check table-rows 0 '^\| ladder-70b-tp8 \| llama-3.1-70b: ladder TP8 vs standard TP8 \|' -- \
  "$TRELLIS" plan --validate-published
"$TRELLIS" plan --validate-published --json > "$TMP/p.json"
if python3 - "$TMP/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["rows"]
assert len(rows) >= 5 and j["evaluated"] >= 5, j
for r in rows:
    if r["evaluated"]:
        assert r["predicted_ratio"] > 0 and r["direction_ok"] == r["expect_direction_ok"], r
        assert r["a"]["predicted"] > 0 and r["b"]["predicted"] > 0, r
    else:
        assert r["not_evaluated"], r
assert j["unexpected_directions"] == 0 and "trellis_version" in j
PY
then echo "ok   json"; else echo "FAIL json"; fail=1; fi
cat > "$TMP/bad.json" <<'J'
{"schema": "trellis.published.v1", "comparisons": [
 {"id": "x", "source": "s", "where": "w", "hardware": "h", "model": "llama-3.1-8b", "metric": "tokens_per_s",
  "a": {"label": "A", "cluster": "1x1xH100", "tp": "two"}, "b": {"label": "B", "cluster": "1x1xH100"},
  "published_ratio": 2}]}
J
check bad-field 1 "published results file $TMP/bad.json: entry 'x' field 'a.tp' must be an integer" -- \
  "$TRELLIS" plan --validate-published "$TMP/bad.json"
check missing-file 1 'cannot open' -- "$TRELLIS" plan --validate-published "$TMP/none.json"
check model-required 2 '--model is required' -- "$TRELLIS" plan --cluster 1x8xH100
exit $fail
