#!/usr/bin/env bash
# Validation of the planner against real runs on this machine (issue 8, item 6).
#
#   sim/scripts/plan_validate.sh BUILD_DIR [OUT_DIR]
#
# 1. calibrates (each step its own short locked chunk):
#    * `trellis bench comm` (links and all-reduces with their samples -> calibration.json);
#    * COMPUTE_CAL=forward (default): `trellis bench model --batches` on the preset's own
#      checkpoint (f32) and on a checkpoint of one TP=2 rank's shard shapes (half the heads,
#      KV heads, MLP width and vocabulary), with 1 and with all kernel threads: prefill and
#      decode of the whole forward at the batch sizes the sweep's microbatches have, turned
#      into linear-layer rates with their TP shard and the attention context they include
#      ("compute.matmul", departures 11 and 14);
#      COMPUTE_CAL=kernels: the previous round's `trellis bench kernels` curve instead;
#    * `trellis run --preset tiny` at 1x1, batch 1 and 16: the engine's own cost per
#      iteration (fixed + per sequence) with a model whose compute is negligible
#      ("runtime" section, departure 12);
# 2. runs `trellis run` over p x t in {1x1, 1x2, 2x1, 2x2}, batch in $BATCHES, variants in
#    $VARIANTS, $REPS times interleaved (each repetition runs the whole grid in a shuffled
#    order after one discarded warm-up run; the median is kept), in one host, and (HOSTS2=1,
#    root, scripts/cluster) across two emulated hosts joined by a link rate-limited to
#    $RATE; every run is one wave (n = batch = max-seqs); the engine splits a batch into
#    min(p, batch) microbatch groups, which the measurement records;
# 3. writes measurements.json (schema trellis.measurements.v1, sim/include/trellis/sim/
#    validate.hpp) and prints `trellis plan --validate`.
#
# Timing holds /tmp/trellis-bench.lock in short chunks (each calibration step; one
# repetition of a sweep, 1-2 minutes), released in between so other sessions can measure;
# `uptime` at the start of each chunk goes to load.txt, and each run records the share of
# the machine's CPU time that niced processes (other sessions' builds) took while it ran
# (/proc/stat), its mean TTFT and the 1-minute load.
#
# Environment: PRESET (synthetic model, default small), PROMPT (64), GEN (64), BATCHES
# ("1 4 16"), VARIANTS ("standard parallel ladder"), REPS (3), RATE (200mbit), HOSTS2 (0),
# SKIP_CALIBRATION (1: reuse OUT_DIR/calibration.json), SKIP_COMM (1: keep its links and
# all-reduces, redo the rest), SKIP_SWEEP (1: only re-predict), INHOST (0: skip the in-host
# rows), APPEND (1: add to OUT_DIR/rows.jsonl instead of starting it again),
# KERNEL_THREADS (kernel threads per rank in the sweep, setting kernels.threads; default
# all cores, as `trellis run` does), PIN (1: mpirun --bind-to core, each rank on its own
# core, ranks beyond the cores overload them; in-host only), COMPUTE_CAL (forward|kernels),
# CAL_IN_SWEEP (default 1: each repetition also measures the forward's rates, one
# round at tp 1 and 2 and 1 and all threads, and those replace the calibration step's, so
# the rates and the runs they predict see the same machine), SHUFFLE_SEED (the order of each
# repetition's grid; default 1), CONCURRENT (1: also
# calibrate with 2 and 4 copies of the forward at once, departure 15), COUPLED (default 1:
# also time the forward under mpirun as 1x2, 2x1 and 2x2 run it, TP groups in lock step and
# stages handing over, departure 16; COUPLED_LAYOUTS picks them, "PP:TP:M ..."), NICE (default -10 as root).
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [OUT_DIR]}
OUT=${2:-$(mktemp -d)}
HERE=${PV_HERE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
mkdir -p "$OUT"
# Run from a private copy: bash reads a script as it goes, so an edit of this file during a
# sweep of half an hour would otherwise change what the running sweep executes.
# It also runs in a session of its own (setsid): with the kernel's autogroup scheduling
# (/proc/sys/kernel/sched_autogroup_enabled = 1 here) CPU time is shared fairly between
# sessions first and niceness only counts inside one, so the other sessions' "nice 10"
# builds competed with the timed ranks as equals; the session's autogroup gets NICE below.
if [ -z "${PV_HERE:-}" ]; then
  cp "${BASH_SOURCE[0]}" "$OUT/plan_validate.sh"
  PV_HERE=$HERE exec setsid -w bash "$OUT/plan_validate.sh" "$(realpath "$BUILD")" "$OUT"
fi
TRELLIS=$(realpath "$BUILD/launchers/trellis")
MPI="$HERE/scripts/mpirun-local"
LOCK=/tmp/trellis-bench.lock
PRESET=${PRESET:-small} PROMPT=${PROMPT:-64} GEN=${GEN:-64} REPS=${REPS:-3}
BATCHES=${BATCHES:-"1 4 16"} VARIANTS=${VARIANTS:-"standard parallel ladder"} RATE=${RATE:-200mbit}
HOSTS2=${HOSTS2:-0} SKIP_CALIBRATION=${SKIP_CALIBRATION:-0} SKIP_SWEEP=${SKIP_SWEEP:-0}
RATE_G=${RATE_G:-0.2}  # the same rate in Gbit/s, for the synthetic spec of the two emulated hosts
COMPUTE_CAL=${COMPUTE_CAL:-forward} PIN=${PIN:-0} SHUFFLE_SEED=${SHUFFLE_SEED:-1}
# Every timed command runs at this niceness (default -10 as root), and so does this
# session's autogroup: other sessions build at nice 10 in their own autogroups, so only the
# autogroup's nice ranks the timed ranks above them. The lock keeps other measurements away.
NICE=${NICE:-$([ "$(id -u)" = 0 ] && echo -10 || echo 0)}
PRI=(nice -n "$NICE")
if [ -w /proc/self/autogroup ] && [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ]; then
  echo "$NICE" >/proc/self/autogroup 2>/dev/null || echo "cannot set this session's autogroup nice to $NICE" >&2
fi
CORES=$(nproc)
KERNEL_THREADS=${KERNEL_THREADS:-$CORES}
PY=/usr/bin/python3
mkdir -p "$OUT"
[ -x "$TRELLIS" ] || { echo "no $TRELLIS: build the trellis target first" >&2; exit 1; }
# A private copy, so a rebuild of BUILD_DIR during the sweep does not change what is measured.
cp "$TRELLIS" "$OUT/trellis.bin" && TRELLIS="$OUT/trellis.bin"
load() { echo "$(date -u +%H:%M:%S) $1: $(uptime | sed 's/.*load/load/')" >>"$OUT/load.txt"; }
[ "$SKIP_SWEEP" = 1 ] || git -C "$HERE" rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null || true

# The model the planner predicts: the preset's config.json.
"$TRELLIS" make-model --preset "$PRESET" --out "$OUT/model" >/dev/null

# Rows the sweep's microbatches have: decode B/m sequences, prefill B/m x PROMPT tokens.
fb=$("$PY" -c "import sys; b=sorted({-(-x//m) for x in map(int, sys.argv[1].split()) for m in (1, 2)}); print(','.join(map(str, b)))" "$BATCHES")
fwd() {  # fwd TP THREADS COPIES [REPS TAG]: COPIES instances of the forward at once (departure 15)
  local i
  for i in $(seq "$3"); do
    "$TRELLIS" --set "kernels.threads=$2" bench model --model "$OUT/ckpt_tp$1" --weights f32 --no-torch \
      --prompt "$PROMPT" --steps "$GEN" --batches "$fb" --batch-reps "${4:-5}" --triad-size 64MiB --json \
      >"$OUT/forward_tp$1_t$2_c$3_${5:-i}$i.json" &
  done
  wait
}
grp() {  # grp PP TP M [REPS TAG]: PP stages of TP ranks in lock step, M microbatches in flight (departure 16)
  "$MPI" -np $(($1 * $2)) "$TRELLIS" --set "kernels.threads=$KERNEL_THREADS" bench model --model "$OUT/ckpt_tp1" \
    --weights f32 --no-torch --tp "$2" --microbatches "$3" --prompt "$PROMPT" --steps "$GEN" --batches "$fb" \
    --batch-reps "${4:-3}" --json >"$OUT/group_p$1_t$2_m$3_${5:-i1}.json"
}
# The multi-rank layouts measured coupled as the engine couples them (PP:TP:M): 1x2 (a TP pair
# in lock step), 2x1 and 2x2 with one microbatch (the stages take turns, the idle one waits)
# and with two (both stages compute at once).
COUPLED_LAYOUTS=${COUPLED_LAYOUTS:-"1:2:1 2:1:1 2:1:2 2:2:1 2:2:2"}
[ "${COUPLED:-1}" = 1 ] || COUPLED_LAYOUTS=""
# 1. calibration
if [ "$SKIP_CALIBRATION" != 1 ]; then
  load "calibration start"
  [ "${SKIP_COMM:-0}" = 1 ] || flock "$LOCK" "${PRI[@]}" "$MPI" -np 4 "$TRELLIS" bench comm --calibration "$OUT/calibration.json" \
    --no-peers >"$OUT/bench_comm.txt"
  rm -f "$OUT/tiny.txt"
  if [ "$COMPUTE_CAL" = forward ]; then
    # The preset's own shapes, and one TP=2 rank's shard of them (vocab-parallel LM head).
    "$PY" - "$OUT/model/config.json" >"$OUT/shard_args.txt" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
print(f"--layers {c['num_hidden_layers']} --hidden {c['hidden_size']} --heads {c['num_attention_heads'] // 2} "
      f"--kv-heads {max(1, c['num_key_value_heads'] // 2)} --head-dim {hd} --intermediate {c['intermediate_size'] // 2} "
      f"--vocab {c['vocab_size'] // 2} --tie {1 if c.get('tie_word_embeddings') else 0}")
PY
    [ -f "$OUT/ckpt_tp1/config.json" ] || "$TRELLIS" make-model --preset "$PRESET" --dtype f32 --out "$OUT/ckpt_tp1" >/dev/null
    # shellcheck disable=SC2046
    [ -f "$OUT/ckpt_tp2/config.json" ] || "$TRELLIS" make-model --preset "$PRESET" --dtype f32 $(cat "$OUT/shard_args.txt") \
      --out "$OUT/ckpt_tp2" >/dev/null
    rm -f "$OUT"/forward_tp*.json
    for kt in 1 "$CORES"; do
      for tp in 1 2; do flock "$LOCK" "${PRI[@]}" bash -c "$(declare -f fwd); OUT='$OUT' TRELLIS='$TRELLIS' PROMPT=$PROMPT GEN=$GEN fb=$fb fwd $tp $kt 1"; done
    done
    # CONCURRENT=1 (departure 15): the ranks a layout keeps busy at once, measured as copies:
    # 2x1 with two microbatches (2 x the tp=1 shapes), 1x2 and 2x2 with one (2 x the tp=2
    # shard), 2x2 with two (4 x the tp=2 shard). Off by default: on this shared VM two copies
    # measured faster each than one alone (docs/planner.md, round 3).
    rm -f "$OUT"/group_p*.json
    for g in $COUPLED_LAYOUTS; do
      flock "$LOCK" "${PRI[@]}" bash -c "$(declare -f grp); OUT='$OUT' TRELLIS='$TRELLIS' MPI='$MPI' PROMPT=$PROMPT GEN=$GEN \
        fb=$fb KERNEL_THREADS=$KERNEL_THREADS grp ${g//:/ } 3 i1"
    done
    for tc in $([ "${CONCURRENT:-0}" = 1 ] && echo 1:2 2:2 2:4); do
      flock "$LOCK" "${PRI[@]}" bash -c "$(declare -f fwd); OUT='$OUT' TRELLIS='$TRELLIS' PROMPT=$PROMPT GEN=$GEN fb=$fb fwd ${tc%:*} $KERNEL_THREADS ${tc#*:}"
    done
  fi
  # Rows M <= 8 take the GEMV path, whose benchmark streams the weights from memory as a
  # model's layers do (rotated copies): measured at the preset's own shapes. Rows > 8 take
  # the packed GEMM, whose benchmark reuses one weight matrix (cache-resident at the small
  # preset's sizes, 1-3 MiB, unlike a whole model's 118 MiB): measured on the MLP shapes of
  # llama-1b (64 MiB each in f32, larger than the 32 MiB L3), which stream like the model.
  for kt in $([ "$COMPUTE_CAL" = kernels ] && echo 1 "$CORES"); do
    TRELLIS_KERNEL_THREADS=$kt flock "$LOCK" "${PRI[@]}" "$TRELLIS" bench kernels --preset "$PRESET" --shapes qkv,o,gate/up,down \
      --tokens 256 --batch 8 --reps 5 --json >"$OUT/kernels_t$kt.json"
    TRELLIS_KERNEL_THREADS=$kt flock "$LOCK" "${PRI[@]}" "$TRELLIS" bench kernels --preset llama-1b --shapes gate/up,down \
      --tokens 16,64,256,1024 --batch 2 --reps 3 --json >"$OUT/kernels_gemm_t$kt.json"
  done
  # The engine's own cost: the tiny preset (hidden 64) at 1x1, where compute is negligible.
  for b in 1 16 1 16 1 16; do
    flock "$LOCK" "${PRI[@]}" "$TRELLIS" run --preset tiny --workload "n=$b,in=$PROMPT,out=$GEN,seed=1" --max-seqs "$b" --json \
      >"$OUT/tiny_b$b.json.tmp" 2>/dev/null
    "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print($b, r['tpot']['mean_s'])" "$OUT/tiny_b$b.json.tmp" \
      >>"$OUT/tiny.txt"
  done
  load "calibration end"
fi
# Folds the measured compute into calibration.json (run again after the sweep when the sweep
# measured the forward in its own repetitions: CAL_IN_SWEEP).
compute_calibration() {
if [ "$COMPUTE_CAL" = forward ] && compgen -G "$OUT/forward_tp1_t1_c1_*.json" >/dev/null; then
  "$PY" - "$OUT" "$CORES" "$KERNEL_THREADS" "$PROMPT" <<'PY'
import json, re, statistics, sys, glob
out, cores, threads, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cal = json.load(open(f"{out}/calibration.json"))
def linear_params(c):
    # Every matrix the forward multiplies: q, k, v, o, gate, up, down per layer and the LM head.
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    h, q, kv = c["hidden_size"], c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    return c["num_hidden_layers"] * (h * (q + 2 * kv) + q * h + 3 * h * c["intermediate_size"]) + c["vocab_size"] * h
points, flops, triad = [], [], []
runs = {}  # (tp, threads, copies) -> the copies' (or the sweep repetitions') JSON
# Measured inside the sweep's repetitions (CAL_IN_SWEEP) when there are such files: the same
# machine states as the runs they predict; else the calibration step's.
files = sorted(glob.glob(f"{out}/forward_tp*_t*_c*_r*.json")) or sorted(glob.glob(f"{out}/forward_tp*_t*_c*_i*.json"))
for path in files:
    tp, t, c = (int(x) for x in re.match(r".*forward_tp(\d+)_t(\d+)_c(\d+)_[ir]", path).groups())
    runs.setdefault((tp, t, c), []).append(json.load(open(path)))
for (tp, t, copies), fs in sorted(runs.items()):
    cfg = json.load(open(f"{out}/ckpt_tp{tp}/config.json"))
    params = linear_params(cfg)
    head = cfg["vocab_size"] * cfg["hidden_size"]
    if copies == 1: triad.append(fs[0]["triad_GBps_median"] * 1e9)
    for k, b in enumerate(fs[0]["batches"]):
        # One copy's time: the median over the copies that ran at once (or the repetitions).
        step = statistics.median(f["batches"][k]["decode_step_s"] for f in fs)
        pre = statistics.median(f["batches"][k]["prefill_s"] for f in fs)
        # Decode: B rows, attention over the mean context of the timed steps.
        points.append({"threads": t, "rows": b["batch"], "params_per_s": params / step, "tp": tp,
                       "context": b["decode_context_mean"], "concurrent": copies})
        # Prefill: B x PROMPT rows through the layers, but the LM head only on each prompt's
        # last position (B rows), as the model charges it: the layers' rate is their
        # parameters over the prefill time less the head's B rows at this batch's decode rate.
        rate = (params - head) / (pre - head * step / params)
        points.append({"threads": t, "rows": b["prefill_tokens"], "params_per_s": rate, "tp": tp,
                       "context": prompt / 2, "concurrent": copies})
        if t == cores and copies == 1: flops.append(2 * b["prefill_tokens"] * rate)
# Departure 16: ranks coupled as the layouts couple them (bench model under mpirun: TP
# groups in lock step with the real all-reduce, pipeline stages handing over with M
# microbatches in flight). Per rank, each forward call's time (not its waits),
# the step minus its all-reduces' own measured time (the model charges those from the link);
# one rate per (layout, rows): all ranks' linear parameters / all ranks' time.
gfiles = sorted(glob.glob(f"{out}/group_p*_t*_m*_r*.json")) or sorted(glob.glob(f"{out}/group_p*_t*_m*_i*.json"))
gruns = {}
for path in gfiles:
    g = json.load(open(path))
    gruns.setdefault((g["pp"], g["tp"], g["microbatches"]), []).append(g)
full = json.load(open(f"{out}/ckpt_tp1/config.json"))
hd = full.get("head_dim") or full["hidden_size"] // full["num_attention_heads"]
h = full["hidden_size"]
per_layer = h * (full["num_attention_heads"] * hd + 2 * full["num_key_value_heads"] * hd) + \
    full["num_attention_heads"] * hd * h + 3 * h * full["intermediate_size"]
for (pp, tp, mb), gs in sorted(gruns.items()):
    for k, b in enumerate(gs[0]["ranks"][0]["batches"]):
        dec_p = dec_t = pre_t = head_p = 0.0
        for r in range(len(gs[0]["ranks"])):
            rk = [next(x for x in g["ranks"] if x["rank"] == r) for g in gs]
            head = full["vocab_size"] * h / tp if rk[0]["lm_head"] else 0
            params = (rk[0]["last_layer"] - rk[0]["first_layer"]) * per_layer / tp + head
            n_ar = rk[0]["batches"][k]["allreduces_per_step"]
            dec_p += params
            head_p += head
            dec_t += statistics.median(x["batches"][k]["decode_step_s"] - n_ar * x["batches"][k]["allreduce_s"] for x in rk)
            pre_t += statistics.median(x["batches"][k]["prefill_s"] - n_ar * x["batches"][k]["allreduce_prefill_s"] for x in rk)
        common = {"threads": gs[0]["threads"], "tp": tp, "pp": pp, "concurrent": tp * min(mb, pp), "coupled": True}
        points.append({**common, "rows": b["batch"], "params_per_s": dec_p / dec_t, "context": b["decode_context_mean"]})
        # Prefill: the LM head ran on B rows only (as for the single-rank points above).
        points.append({**common, "rows": b["prefill_tokens"], "context": prompt / 2,
                       "params_per_s": (dec_p - head_p) / (pre_t - head_p * dec_t / dec_p)})
cal["compute"] = {"device": "cpu", "flops": max(flops), "memory_bandwidth": statistics.median(triad),
                  "cores": cores, "threads_per_rank": threads, "matmul": points,
                  "source": "trellis bench model --batches: the whole forward (f32) at the preset's shapes and one "
                            "TP=2 rank's shard, 1 and all kernel threads; coupled points: mpirun -np PPxTP bench "
                            "model --tp TP (lock step, stages at once); flops = the fastest prefill, "
                            "memory_bandwidth = STREAM triad"}
tiny = {}
for line in open(f"{out}/tiny.txt"):
    b, s = line.split(); tiny.setdefault(int(b), []).append(float(s))
t1, t16 = statistics.median(tiny[1]), statistics.median(tiny[16])
per_seq = max(0.0, (t16 - t1) / 15)
cal["runtime"] = {"step_overhead_us": (t1 - per_seq) * 1e6, "step_overhead_per_seq_us": per_seq * 1e6,
                  "source": "trellis run --preset tiny 1x1, median TPOT at batch 1 and 16"}
json.dump(cal, open(f"{out}/calibration.json", "w"), indent=2)
PY
elif [ -f "$OUT/kernels_gemm_t1.json" ]; then
  "$PY" - "$OUT" "$CORES" "$KERNEL_THREADS" <<'PY'
import json, statistics, sys, glob
out, cores, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cal = json.load(open(f"{out}/calibration.json"))
# Linear-layer rate per (threads, rows): weight parameters per second over the layer's
# shapes together (qkv, o, gate/up twice, down), i.e. total parameters / total time.
use = {"qkv": 1, "o": 1, "gate/up": 2, "down": 1}
points, flops, bw = [], [], {}
by_key = {}
for path in sorted(glob.glob(f"{out}/kernels_t*.json")) + sorted(glob.glob(f"{out}/kernels_gemm_t*.json")):
    k = json.load(open(path))
    t = k["threads"]
    gemv_file = "/kernels_t" in path
    by_rows = by_key.setdefault(t, {})
    for g in (k["gemv"] if gemv_file else []):
        if g.get("dtype") != "f32" or g["shape"] not in use: continue
        params = g["n"] * g["k"] * use[g["shape"]]
        s = by_rows.setdefault(g["m"], [0.0, 0.0])
        s[0] += params; s[1] += use[g["shape"]] * g["n"] * g["k"] * 4 / (g["GBps"] * 1e9)
        if g["m"] == 1: bw.setdefault(t, []).append(g["GBps"] * 1e9)
    for g in (k["gemm"] if not gemv_file else []):
        if g["shape"] not in use: continue
        params = g["n"] * g["k"] * use[g["shape"]]
        s = by_rows.setdefault(g["m"], [0.0, 0.0])
        s[0] += params; s[1] += use[g["shape"]] * 2 * g["m"] * g["n"] * g["k"] / (g["ours_f32_GFLOPs"] * 1e9)
        if t == cores and g["m"] >= 256: flops.append(g["ours_f32_GFLOPs"] * 1e9)
for t, by_rows in sorted(by_key.items()):
    for rows, (params, sec) in sorted(by_rows.items()):
        points.append({"threads": t, "rows": rows, "params_per_s": params / sec})
tiny = {}
for line in open(f"{out}/tiny.txt"):
    b, s = line.split(); tiny.setdefault(int(b), []).append(float(s))
t1, t16 = statistics.median(tiny[1]), statistics.median(tiny[16])
per_seq = max(0.0, (t16 - t1) / 15)
# The host's streaming bandwidth, all cores together: the 1-thread GEMV (M=1) rate per core
# times the cores. One process's 2-thread GEMV is no measure of it on a shared machine: its
# threads wait for each other at every call, and it measured below the 1-thread rate.
cal["compute"] = {"device": "cpu", "flops": statistics.median(flops),
                  "memory_bandwidth": cores * statistics.median(bw[1]),
                  "cores": cores, "threads_per_rank": threads, "matmul": points,
                  "source": "trellis bench kernels --json (GEMV: the preset's shapes; GEMM: llama-1b MLP shapes), TRELLIS_KERNEL_THREADS=1 and all"}
cal["runtime"] = {"step_overhead_us": (t1 - per_seq) * 1e6, "step_overhead_per_seq_us": per_seq * 1e6,
                  "source": "trellis run --preset tiny 1x1, median TPOT at batch 1 and 16"}
json.dump(cal, open(f"{out}/calibration.json", "w"), indent=2)
PY
fi

}
compute_calibration
# 2. the sweep
rows="$OUT/rows.jsonl"
# CPU seconds the machine spent in niced (nice > 0) processes: the other sessions' builds
# (they build at nice 10; the timed runs here are at nice -10 and count as "user"). The
# children's rusage of mpirun does not hold its ranks' CPU time, so "everything but ours"
# cannot be measured that way; the niced time is what can.
machine_cpu() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print $3/hz}' /proc/stat; }
run_one() {  # run_one P T BATCH VARIANT CLUSTER_SPEC LAUNCHER...
  local p=$1 t=$2 b=$3 v=$4 spec=$5
  shift 5
  local vflag=()
  [ "$v" != standard ] && vflag=(--variant "$v")
  local m0 c0 w0 m1 c1 w1
  m0=$(machine_cpu) w0=$(date +%s.%N)
  if ! "${PRI[@]}" "$@" -np $((p * t)) "$TRELLIS" --set "kernels.threads=$KERNEL_THREADS" run --preset "$PRESET" --pp "$p" --tp "$t" "${vflag[@]}" \
      --workload "n=$b,in=$PROMPT,out=$GEN,seed=1" --max-seqs "$b" --json >"$OUT/run.json" 2>"$OUT/run.err"; then
    echo "skip p=$p t=$t batch $b $v: $(tail -1 "$OUT/run.err")" >&2
    return 0
  fi
  m1=$(machine_cpu) w1=$(date +%s.%N)
  [ "${WARMUP_RUN:-0}" = 1 ] && return 0  # the warm-up run of a lock hold is not recorded
  "$PY" - "$OUT/run.json" "$p" "$t" "$b" "$v" "$spec" "$PROMPT" "$GEN" "$CORES" "$m0" "$m1" "$w0" "$w1" \
    "$REP" "$PIN" >>"$rows" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); p, t, b, v, spec, pl, gl, cores = sys.argv[2:10]
m0, m1, w0, w1 = map(float, sys.argv[10:14])
p, t, b = int(p), int(t), int(b)
groups = -(-b // -(-b // p))  # the engine's groups hold ceil(b/p) sequences each
# Share of the machine's CPU that niced processes (other sessions' builds) took meanwhile.
background = min(1.0, max(0.0, m1 - m0) / ((w1 - w0) * int(cores)))
row = {"pp": p, "tp": t, "batch": b, "variant": v, "microbatches": groups, "prompt_len": int(pl),
       "gen_len": int(gl), "tokens_per_s": r["throughput_tokens_per_s"], "tpot_ms": r["tpot"]["mean_s"] * 1e3,
       "ttft_ms": r["ttft"]["mean_s"] * 1e3,
       "layout": r["layout"], "rep": int(sys.argv[14]), "background_cpu_share": round(background, 4),
       "wall_s": round(w1 - w0, 3), "load1": float(open("/proc/loadavg").read().split()[0]),
       "pinned": sys.argv[15] == "1"}
if spec:
    row["cluster"] = spec
    row["ranks_per_host"] = max(1, p * t // 2)
    row["shared_cores"] = int(cores)  # the emulated hosts are namespaces of this one machine
print(json.dumps(row))
PY
}
# The grid of one repetition in a shuffled order (seeded by the repetition): a layout is not
# always measured right after the same neighbour or at the same point of the lock hold.
grid() {  # grid LAYOUTS REP
  "$PY" - "$1" "$BATCHES" "$VARIANTS" "$SHUFFLE_SEED" "$2" <<'PY'
import random, sys
layouts, batches, variants, seed, rep = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3].split(), sys.argv[4], sys.argv[5]
cells = [(l, b, v) for l in layouts for b in batches for v in variants if not (l.endswith("x1") and v != "standard")]
random.Random(f"{seed}-{rep}").shuffle(cells)
for l, b, v in cells: print(l, b, v)
PY
}
sweep() {  # sweep CLUSTER_SPEC LAYOUTS LAUNCHER...
  local spec=$1 layouts=$2
  shift 2
  for rep in $(seq "${REP_FIRST:-1}" "$REPS"); do
    flock 9  # one repetition (~1-2 min) per hold of the lock
    load "$spec rep $rep"
    [ -z "$spec" ] || cluster_up
    REP=$rep
    WARMUP_RUN=1 run_one 1 2 1 standard "$spec" "$@" </dev/null  # page cache, MPI start-up paths, CPU clocks
    if [ "$COMPUTE_CAL" = forward ] && [ "${CAL_IN_SWEEP:-1}" = 1 ]; then
      # The forward's rates measured in this same hold of the lock, one round per repetition
      # (on this machine's own namespace; the emulated hosts share its cores).
      local kt tp tag=r${rep}${spec:+h}x
      for kt in 1 "$CORES"; do for tp in 1 2; do "${PRI[@]}" bash -c "$(declare -f fwd); OUT='$OUT' \
        TRELLIS='$TRELLIS' PROMPT=$PROMPT GEN=$GEN fb=$fb fwd $tp $kt 1 1 $tag" </dev/null; done; done
      local g
      for g in $COUPLED_LAYOUTS; do "${PRI[@]}" bash -c "$(declare -f grp); OUT='$OUT' TRELLIS='$TRELLIS' MPI='$MPI' PROMPT=$PROMPT \
        GEN=$GEN fb=$fb KERNEL_THREADS=$KERNEL_THREADS grp ${g//:/ } 1 $tag" </dev/null; done
    fi
    while read -r layout b v; do
      run_one "${layout%x*}" "${layout#*x}" "$b" "$v" "$spec" "$@" </dev/null  # (mpirun would eat the grid)
    done < <(grid "$layouts" "$rep")
    [ -z "$spec" ] || "$HERE/scripts/cluster" down >/dev/null
    flock -u 9
  done
}
# The emulated hosts are shared with other sessions (`cluster up` removes anyone's hosts), so
# they exist only while this script holds the lock, as other sessions' cluster runs do.
cluster_up() { "$HERE/scripts/cluster" up 2 --rate "$RATE" >/dev/null; }
exec 9>>"$LOCK"
if [ "$SKIP_SWEEP" != 1 ]; then
  [ "${APPEND:-0}" = 1 ] || : >"$rows"
  if [ "$PIN" = 1 ]; then
    # Each rank bound to one core (ranks beyond the cores overload them), kernel threads inside it.
    root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
    INHOST_LAUNCH=(mpirun "${root[@]}" --oversubscribe --bind-to core:overload-allowed --map-by core \
      --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none)
  else
    INHOST_LAUNCH=("$MPI")
  fi
  [ "${INHOST:-1}" = 0 ] || sweep "" "1x1 1x2 2x1 2x2" "${INHOST_LAUNCH[@]}"
  if [ "$HOSTS2" = 1 ]; then
    spec="hosts=2,sockets=1,nics=1x${RATE_G}g-eth"
    # The cross-host link (tcp through the shaped veth) is calibrated across the two hosts
    # and merged into the in-host calibration.
    flock 9
    cluster_up
    "${PRI[@]}" "$HERE/scripts/cluster" mpirun --map-by node -np 4 "$TRELLIS" bench comm --calibration "$OUT/calibration2.json" \
      --no-peers --sections p2p,allreduce --max-size 4MiB --iters 20 >"$OUT/bench_comm2.txt" \
      || echo "cross-host bench comm failed" >&2  # (64 MiB points over a shaped link outlast its deadlines)
    "$HERE/scripts/cluster" down >/dev/null
    flock -u 9
    if [ -s "$OUT/calibration2.json" ]; then
      "$PY" - "$OUT/calibration.json" "$OUT/calibration2.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
have = {l["class"] for l in a.get("links", [])}
a["links"] = a.get("links", []) + [l for l in b.get("links", []) if l["class"] not in have]
a["allreduce"] = a.get("allreduce", []) + [r for r in b.get("allreduce", []) if r["class"] not in have]
json.dump(a, open(sys.argv[1], "w"), indent=2)
PY
      sweep "$spec" "1x2 2x1 2x2" "$HERE/scripts/cluster" mpirun --map-by node
    fi
  fi
  load "sweep end"
  compute_calibration
fi
# Median over the repetitions of each (layout, batch, variant, cluster).
"$PY" - "$rows" "$OUT/measurements.json" <<'PY'
import json, statistics, sys
groups = {}
for line in open(sys.argv[1]):
    if not line.strip(): continue
    r = json.loads(line)
    key = (r["pp"], r["tp"], r["batch"], r["variant"], r.get("cluster", ""))
    groups.setdefault(key, []).append(r)
runs = []
for key, rs in groups.items():
    row = dict(rs[0])
    row["tokens_per_s"] = statistics.median(x["tokens_per_s"] for x in rs)
    row["tpot_ms"] = statistics.median(x["tpot_ms"] for x in rs)
    row["repetitions"] = len(rs)
    row["tokens_per_s_reps"] = [x["tokens_per_s"] for x in rs]
    row["tpot_ms_reps"] = [x["tpot_ms"] for x in rs]
    if all("ttft_ms" in x for x in rs): row["ttft_ms"] = statistics.median(x["ttft_ms"] for x in rs)
    row["background_cpu_share_reps"] = [x.get("background_cpu_share") for x in rs]
    for k in ("rep", "others_cpu_share", "background_cpu_share", "wall_s", "load1"): row.pop(k, None)
    runs.append(row)
json.dump({"schema": "trellis.measurements.v1", "runs": runs}, open(sys.argv[2], "w"), indent=2)
PY

# 3. the comparison (this host: one CPU host whose ranks share its cores)
"$TRELLIS" plan --model "$OUT/model" --cluster hosts=1,sockets=1 --ranks-per-host 4 --dtype f32 \
  --prompt-len "$PROMPT" --gen-len "$GEN" --calibration "$OUT/calibration.json" \
  --validate "$OUT/measurements.json" | tee "$OUT/validation.txt"
echo "files in $OUT"
