#!/usr/bin/env bash
# The TP all-reduce of a GPU model (comm.tp_collectives; issue 18 item 1), greedy, tiny model.
#   gpu_tp_test.sh [--cpu-only] TRELLIS MPIEXEC [FLAGS...]
# Everywhere (and alone with --cpu-only, label unit): a bad comm.tp_collectives value and
# `nccl` for a CPU model are refused with the reason, before loading.
# With a GPU (label gpu; exit 77 without one): tp=2 on --device cuda.
#  * one GPU: both ranks share it, so NCCL cannot take them (one rank per GPU): auto must say
#    the all-reduce is staged through host memory and name the two ranks; `nccl` must be
#    refused naming them; the tokens must equal the CPU's tp=2 tokens and the GPU's tp=1.
#  * two or more GPUs: auto must choose NCCL, and its tokens must equal the CPU's too.
set -u
export TRELLIS_LOG_LEVEL=info
cpu_only=0
[ "${1:-}" = --cpu-only ] && { cpu_only=1; shift; }
T="$1"; shift
MPI=("$@")
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
mpi() { timeout 300 "${MPI[@]}" -np 2 "$T" "$@"; }
tokens_of() { python3 -c 'import json,sys; print(json.dumps([json.loads(l)["tokens"] for l in open(sys.argv[1])]))' "$1"; }
expect_refusal() {  # expect_refusal NAME PATTERN CMD...: fails, and says PATTERN
  local name="$1" pat="$2"; shift 2
  if "$@" > "$WORK/log" 2>&1; then bad "$name: ran, expected a refusal"
  elif grep -q "$pat" "$WORK/log"; then ok "$name: $(grep -o "$pat.*" "$WORK/log" | head -1 | cut -c1-140)"
  else bad "$name: refused without saying '$pat'"; tail -4 "$WORK/log"; fi
}

expect_refusal "bad comm.tp_collectives" "is not one of auto, nccl, host" \
  timeout 60 "$T" --set comm.tp_collectives=fast run --preset tiny --workload n=1,in=4,out=2
expect_refusal "nccl for a CPU model" "NCCL needs GPU tensors" \
  mpi --set comm.tp_collectives=nccl run --preset tiny --tp 2 --device cpu --workload n=1,in=4,out=2
if [ $cpu_only = 1 ]; then echo "$fails failed"; [ $fails = 0 ]; exit; fi

probe=$(timeout 120 "$T" run --device cuda --preset tiny --workload n=1,in=4,out=1 --json 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "no usable GPU" <<<"$probe"; then
  echo "no CUDA device: $(grep -o 'no usable GPU: [^(]*' <<<"$probe" | head -1)"; exit 77
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${gpus:-0}" -ge 1 ] || gpus=1
for i in 0 1 2 3; do
  echo "{\"id\": \"p$i\", \"tokens\": [$((5+i)), $((17*i+3)), 99, $((40+i)), 7, 250], \"sampling\": {\"greedy\": true, \"max_tokens\": 24}}"
done > "$WORK/p.jsonl"
common=(run --preset tiny --prompts "$WORK/p.jsonl" --max-context 128)
declare -A got=()
# name|ranks|device|comm.tp_collectives
for c in "cpu2|2|cpu|auto" "cuda1|1|cuda|auto" "cuda2|2|cuda|auto" "host2|2|cuda|host"; do
  IFS='|' read -r name np dev coll <<<"$c"
  set_flags=(--set "comm.tp_collectives=$coll")
  flags="--device $dev"
  f="$WORK/$name.jsonl"
  # shellcheck disable=SC2086
  if { if [ "$np" = 1 ]; then timeout 300 "$T" "${set_flags[@]}" "${common[@]}" --tp 1 $flags --out "$f"
       else mpi "${set_flags[@]}" "${common[@]}" --tp 2 $flags --out "$f"; fi; } > "$WORK/$name.log" 2>&1; then
    got[$name]=$(tokens_of "$f")
  else bad "$name failed"; tail -6 "$WORK/$name.log"; fi
done
line=$(grep -o "TP all-reduce of GPU tensors: .*" "$WORK/cuda2.log" | head -1)
if [ "$gpus" -ge 2 ]; then
  if grep -q "GPU tensors: nccl" <<<"$line"; then ok "$gpus GPUs: auto chose NCCL: $line"; else bad "$gpus GPUs: auto did not choose NCCL: $line"; fi
else
  if grep -q "staged through host memory (TP group of stage 0: ranks 0 and 1 share GPU 0" <<<"$line"; then
    ok "one GPU: $line"
  else bad "one GPU: the log does not say why NCCL was not used: '$line'"; fi
  expect_refusal "comm.tp_collectives=nccl on one GPU" "cannot run this layout: TP group of stage 0: ranks 0 and 1 share GPU 0" \
    mpi --set comm.tp_collectives=nccl run --preset tiny --tp 2 --device cuda --workload n=1,in=4,out=2
fi
grep -q "GPU tensors: staged through host memory (comm.tp_collectives=host)" "$WORK/host2.log" && ok "host forced: said so" \
  || bad "host forced: the log does not say so"
for pair in "cuda2 cpu2" "cuda2 cuda1" "host2 cpu2"; do
  read -r a b <<<"$pair"
  [ -n "${got[$a]:-}" ] && [ -n "${got[$b]:-}" ] || continue
  if [ "${got[$a]}" = "${got[$b]}" ]; then ok "tokens of $a equal $b"; else bad "tokens of $a differ from $b"; fi
done
echo "$fails failed"
[ $fails = 0 ]
