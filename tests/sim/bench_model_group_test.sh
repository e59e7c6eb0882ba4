#!/usr/bin/env bash
# `trellis bench model` group mode (departure 16's calibration, docs/planner.md): under
# mpirun it reports every rank's stage, layer range, all-reduces per step and timings, for a
# TP pair (1x2), two stages with two microbatches in flight (2x1) and 2x2 with one; a --tp
# that does not divide the world fails on every rank with one message. Checks structure,
# never timings.
#   bench_model_group_test.sh TRELLIS MPIEXEC [FLAGS...]
set -u
T="$1"; shift
MPI=("$@")
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
"$T" make-model --preset tiny --dtype f32 --out "$WORK/ck" >/dev/null || { echo "FAIL make-model"; exit 1; }
layers=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$WORK/ck/config.json")
for l in "2 2 1" "2 1 2" "4 2 1"; do
  set -- $l
  np=$1 tp=$2 m=$3
  if ! timeout 120 "${MPI[@]}" -np "$np" "$T" bench model --model "$WORK/ck" --weights f32 --no-torch --tp "$tp" \
      --microbatches "$m" --prompt 8 --steps 3 --batches 1,2 --batch-reps 1 --json >"$WORK/out.json" 2>"$WORK/err.txt"; then
    bad "np $np tp $tp m $m failed: $(tail -2 "$WORK/err.txt")"; continue
  fi
  if python3 - "$WORK/out.json" "$np" "$tp" "$m" "$layers" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read()[open(sys.argv[1]).read().index("{"):])
np_, tp, m, layers = map(int, sys.argv[2:])
pp = np_ // tp
assert (j["world"], j["tp"], j["pp"], j["microbatches"]) == (np_, tp, pp, m), j
assert sorted(r["rank"] for r in j["ranks"]) == list(range(np_))
per = layers // pp
for r in j["ranks"]:
    st = r["rank"] // tp
    assert r["stage"] == st and r["tp_rank"] == r["rank"] % tp, r
    assert (r["first_layer"], r["last_layer"]) == (st * per, (st + 1) * per), r
    assert r["embedding"] == (st == 0) and r["lm_head"] == (st == pp - 1), r
    for b in r["batches"]:
        want = 2 * per + (1 if st == 0 else 0) if tp > 1 else 0
        assert b["allreduces_per_step"] == want, (r["rank"], b)
        assert b["decode_step_s"] > 0 and b["prefill_s"] > 0, b
        assert (b["allreduce_s"] > 0) == (tp > 1), b
    assert [b["batch"] for b in r["batches"]] == [1, 2]
PY
  then ok "np $np tp $tp microbatches $m: ranks, stages, layers, all-reduces per step"; else bad "np $np tp $tp m $m: report"; fi
done
out=$(timeout 60 "${MPI[@]}" -np 2 "$T" bench model --model "$WORK/ck" --weights f32 --no-torch --tp 3 --batches 1 2>&1)
if [ $? -ne 0 ] && grep -q -- "--tp 3 must divide them" <<<"$out"; then ok "--tp 3 on 2 ranks is refused"; else bad "--tp 3 on 2 ranks: $out"; fi
[ "$fails" = 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
