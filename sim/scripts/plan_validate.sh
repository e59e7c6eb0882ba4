#!/usr/bin/env bash
# Validation of the planner against real runs on this machine (issue 8, item 6).
#
#   sim/scripts/plan_validate.sh BUILD_DIR [OUT_DIR]
#
# 1. calibrates: `trellis bench comm` (links and all-reduces -> calibration.json) and
#    `trellis bench kernels --json` (GEMM GFLOP/s, GEMV GB/s -> the "compute" section);
# 2. runs `trellis run` over p x t in {1x1, 1x2, 2x1, 2x2}, batch in $BATCHES, variants in
#    $VARIANTS, in one host, and (as root, with scripts/cluster) across two emulated hosts
#    joined by a link rate-limited to $RATE; every run is one wave (n = batch = max-seqs);
# 3. writes measurements.json (schema trellis.measurements.v1, sim/include/trellis/sim/
#    validate.hpp) and prints `trellis plan --validate`: measured vs predicted tokens/s and
#    TPOT per row, median and p90 |error|, and whether the predicted best was the measured
#    best.
#
# Environment: PRESET (synthetic model, default small), PROMPT (64), GEN (32),
# BATCHES ("1 4 16"), VARIANTS ("standard" plus whatever `trellis run --variant` accepts),
# RATE (200mbit), HOSTS2 (1 to also run across two emulated hosts; needs root).
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [OUT_DIR]}
OUT=${2:-$(mktemp -d)}
TRELLIS=$BUILD/launchers/trellis
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MPI="$HERE/scripts/mpirun-local"
PRESET=${PRESET:-small} PROMPT=${PROMPT:-64} GEN=${GEN:-32}
BATCHES=${BATCHES:-"1 4 16"} VARIANTS=${VARIANTS:-standard} RATE=${RATE:-200mbit} HOSTS2=${HOSTS2:-0}
RATE_G=${RATE_G:-0.2}  # the same rate in Gbit/s, for the synthetic spec of the two emulated hosts
PY=/usr/bin/python3
mkdir -p "$OUT"
[ -x "$TRELLIS" ] || { echo "no $TRELLIS: build the trellis target first" >&2; exit 1; }

# The model the planner predicts: the preset's config.json.
"$TRELLIS" make-model --preset "$PRESET" --out "$OUT/model" >/dev/null

# 1. calibration
"$MPI" -np 4 "$TRELLIS" bench comm --calibration "$OUT/calibration.json" --no-peers >"$OUT/bench_comm.txt"
"$TRELLIS" bench kernels --json >"$OUT/kernels.json"
"$PY" - "$OUT/calibration.json" "$OUT/kernels.json" <<'PY'
import json, statistics, sys
cal = json.load(open(sys.argv[1])); k = json.load(open(sys.argv[2]))
flops = statistics.median(g["ours_f32_GFLOPs"] for g in k["gemm"]) * 1e9
gemv = [g["GBps"] for g in k["gemv"] if g.get("dtype") == "f32"] or [k["triad"]["median_GBps"]]
cal["compute"] = {"device": "cpu", "flops": flops, "memory_bandwidth": statistics.median(gemv) * 1e9,
                  "threads": k["threads"], "source": "trellis bench kernels --json"}
json.dump(cal, open(sys.argv[1], "w"), indent=2)
PY

# 2. the sweep
rows="$OUT/rows.jsonl"
: >"$rows"
run_one() {  # run_one P T BATCH VARIANT CLUSTER_SPEC LAUNCHER...
  local p=$1 t=$2 b=$3 v=$4 spec=$5
  shift 5
  local vflag=()
  [ "$v" != standard ] && vflag=(--variant "$v")
  if ! "$@" -np $((p * t)) "$TRELLIS" run --preset "$PRESET" --pp "$p" --tp "$t" "${vflag[@]}" \
      --workload "n=$b,in=$PROMPT,out=$GEN,seed=1" --max-seqs "$b" --json >"$OUT/run.json" 2>"$OUT/run.err"; then
    echo "skip p=$p t=$t batch $b $v: $(tail -1 "$OUT/run.err")" >&2
    return 0
  fi
  "$PY" - "$OUT/run.json" "$p" "$t" "$b" "$v" "$spec" "$PROMPT" "$GEN" >>"$rows" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); p, t, b, v, spec, pl, gl = sys.argv[2:]
row = {"pp": int(p), "tp": int(t), "batch": int(b), "variant": v, "prompt_len": int(pl), "gen_len": int(gl),
       "tokens_per_s": r["throughput_tokens_per_s"], "tpot_ms": r["tpot"]["mean_s"] * 1e3, "layout": r["layout"]}
if spec:
    row["cluster"] = spec
    row["ranks_per_host"] = max(1, int(p) * int(t) // 2)
print(json.dumps(row))
PY
}
for layout in 1x1 1x2 2x1 2x2; do
  p=${layout%x*} t=${layout#*x}
  for b in $BATCHES; do
    for v in $VARIANTS; do
      [ "$t" = 1 ] && [ "$v" != standard ] && continue
      run_one "$p" "$t" "$b" "$v" "" "$MPI"
    done
  done
done
if [ "$HOSTS2" = 1 ]; then
  "$HERE/scripts/cluster" up 2 --rate "$RATE"
  trap '"$HERE/scripts/cluster" down' EXIT
  spec="hosts=2,sockets=1,nics=1x${RATE_G}g-eth"
  # The cross-host link (tcp through the shaped veth) is calibrated across the two hosts and
  # merged into the in-host calibration.
  "$HERE/scripts/cluster" mpirun -np 4 "$TRELLIS" bench comm --calibration "$OUT/calibration2.json" --no-peers \
    --sections p2p,allreduce >"$OUT/bench_comm2.txt"
  "$PY" - "$OUT/calibration.json" "$OUT/calibration2.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
have = {l["class"] for l in a.get("links", [])}
a["links"] = a.get("links", []) + [l for l in b.get("links", []) if l["class"] not in have]
a["allreduce"] = a.get("allreduce", []) + [r for r in b.get("allreduce", []) if r["class"] not in have]
json.dump(a, open(sys.argv[1], "w"), indent=2)
PY
  for layout in 1x2 2x1 2x2; do
    p=${layout%x*} t=${layout#*x}
    for b in $BATCHES; do
      for v in $VARIANTS; do
        [ "$t" = 1 ] && [ "$v" != standard ] && continue
        run_one "$p" "$t" "$b" "$v" "$spec" "$HERE/scripts/cluster" mpirun
      done
    done
  done
fi
"$PY" - "$rows" "$OUT/measurements.json" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump({"schema": "trellis.measurements.v1", "runs": runs}, open(sys.argv[2], "w"), indent=2)
PY

# 3. the comparison (this host: one CPU host whose ranks share its cores)
"$TRELLIS" plan --model "$OUT/model" --cluster hosts=1,sockets=1 --ranks-per-host 4 --dtype f32 \
  --prompt-len "$PROMPT" --gen-len "$GEN" --calibration "$OUT/calibration.json" \
  --validate "$OUT/measurements.json" | tee "$OUT/validation.txt"
echo "files in $OUT"
