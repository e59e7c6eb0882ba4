#!/usr/bin/env bash
# One repetition of the TTFT sweep of docs/runtime.md ("Time to first token"): the planner
# validation's workload (preset small, prompt 64, gen 64, one wave of B requests, kernel
# threads = cores) at p x t in {1x1, 1x2, 2x1, 2x2} and B in {1, 4, 16}, for every binary
# given, in a shuffled order (seeded by REP), each run with --json and --trace; then
# `trellis bench model` (the forward alone, f32, same shapes) with the first binary.
#   ttft_sweep.sh OUT_DIR REP TRELLIS_BINARY...
# Run each repetition under the bench lock in its own session at autogroup nice -10:
#   flock /tmp/trellis-bench.lock setsid -w bash -c 'echo -10 > /proc/self/autogroup; \
#     runtime/trace/ttft_sweep.sh /tmp/ttft 1 /tmp/old.bin /tmp/new.bin'
# Then: runtime/trace/ttft_breakdown.py --dir OUT_DIR (run tags are the binaries' names).
set -euo pipefail
out=$1 rep=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
cores=$(nproc)
echo "$(date -u +%T) rep $rep start: $(uptime | sed 's/.*load/load/')" >>"$out/load.txt"
[ -f "$out/ckpt/config.json" ] || "$1" make-model --preset small --dtype f32 --out "$out/ckpt" >/dev/null
/usr/bin/python3 -c "
import random, sys
cells = [(b, l, n) for b in sys.argv[2:] for l in ('1x1', '1x2', '2x1', '2x2') for n in (1, 4, 16)]
random.Random(int(sys.argv[1])).shuffle(cells)
for c in cells: print(*c)" "$rep" "$@" | while read -r bin layout b; do
  p=${layout%x*} t=${layout#*x} tag=$(basename "$bin" .bin)
  "$here/scripts/mpirun-local" -np $((p * t)) "$bin" --set "kernels.threads=$cores" run --preset small --pp "$p" --tp "$t" \
    --workload "n=$b,in=64,out=64,seed=1" --max-seqs "$b" --json --trace "$out/t_${layout}_b${b}_w${tag}_r$rep.json" \
    >"$out/r_${layout}_b${b}_w${tag}_r$rep.json" 2>/dev/null </dev/null || echo "failed: $bin $layout B=$b" >&2
done
"$1" --set "kernels.threads=$cores" bench model --model "$out/ckpt" --weights f32 --no-torch --prompt 64 --steps 64 \
  --batches 1,2,4,8,16 --batch-reps 5 --triad-size 64MiB --json >"$out/bench_model_r$rep.json" 2>/dev/null
echo "$(date -u +%T) rep $rep end: $(uptime | sed 's/.*load/load/')" >>"$out/load.txt"
