#!/usr/bin/env bash
# `trellis plan` end to end: a ranked table and an SVG for Llama-3.1-70B on 2x8 H100, JSON,
# the appendix model, bad input (unknown model, cluster, malformed calibration, nothing
# feasible) with the messages the issue asks for, a shared hwloc XML, and --validate.
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
    echo "$out" | head -20
    fail=1
  else
    echo "ok   $name"
  fi
}

check table 0 'why #1: .*takes [0-9]+% of each decode step' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --svg "$TMP/p.svg" --top 5
grep -q '</svg>' "$TMP/p.svg" && grep -q 'ladder' "$TMP/p.svg" || { echo "FAIL svg"; fail=1; }
check json 0 '"ranked": \[' -- "$TRELLIS" plan --model llama-3.1-70b --cluster hosts=2,gpus=8,gpu=H100-SXM,nics=8x400g-ib --json --top 2
check appendix 0 'appendix model' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --sim-model appendix --top 2
check slo 0 'SLO +TPOT <= 20 ms' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 20 --top 2
check unknown-model 1 'valid models: .*llama-3.1-70b' -- "$TRELLIS" plan --model llama-9 --cluster 2x8xH100
check unknown-cluster 1 'unknown cluster .*2x8xH100-NDR.*H100-SXM' -- "$TRELLIS" plan --model llama-3.1-8b --cluster bogus
check unknown-gpu 1 'valid devices: .*B200' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --gpu TPU
check unknown-variant 1 'valid variants: standard' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --variants turbo
check nothing-fits 1 'no feasible configuration: binding constraint is device memory.*GiB' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 1x2xH100
check slo-impossible 1 'no feasible configuration: binding constraint is the latency SLO' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 0.1
echo '{"schema": "trellis.calibration.v1", "links": [{"class": "rdma", "alpha_us": "x", "bandwidth_GBps": 1}]}' > "$TMP/bad.json"
check bad-calibration 1 "field 'links\[0\].alpha_us'" -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 2x8xH100 --calibration "$TMP/bad.json"
echo '{"schema": "trellis.calibration.v1", "links": [{"class": "rdma", "alpha_us": 9, "bandwidth_GBps": 3, "max_bytes": 1024}]}' > "$TMP/cal.json"
check calibrated-range 0 'exceed the calibrated range' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --calibration "$TMP/cal.json" --no-replicas --variants standard
XML=${TRELLIS_SHARED:-$(dirname "$0")/../../../shared}/topologies/hwloc-nvidia-dgx2.xml
if [[ -f $XML ]]; then
  check xml 0 '16 V100-SXM3' -- "$TRELLIS" plan --model llama-3.1-8b --topo-file "$XML" --top 2
fi
cat > "$TMP/runs.json" <<'JSON'
{"schema": "trellis.measurements.v1", "runs": [
  {"pp": 1, "tp": 1, "batch": 4, "variant": "standard", "tokens_per_s": 100, "tpot_ms": 40},
  {"pp": 2, "tp": 1, "batch": 4, "variant": "standard", "tokens_per_s": 120, "tpot_ms": 33}]}
JSON
check validate 0 'median \|error\|' -- \
  "$TRELLIS" plan --model smollm2-135m --cluster hosts=1,sockets=2 --validate "$TMP/runs.json"
exit $fail
