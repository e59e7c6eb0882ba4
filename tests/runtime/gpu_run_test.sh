#!/usr/bin/env bash
# `trellis run --device cuda` against `--device cpu`, greedy (label gpu; exit 77 without a GPU).
#   gpu_run_test.sh TRELLIS MPIEXEC [FLAGS...]
# Layouts: 1x1, and pp=2 with both ranks sharing GPU 0 (local rank modulo the visible GPUs).
# * synthetic tiny model (f32 weights: the GPU's matmuls are cuBLASLt f32, logits within ~1e-4):
#   tokens must EQUAL the CPU's, 4 prompts x 24 tokens.
# * SmolLM2-135M (if scripts/setup-models installed it): weights dequantised to bf16 on both
#   devices, but a GPU prefill matmul rounds activations to bf16 where the CPU keeps f32, so a
#   greedy continuation may leave the CPU's at a near tie. Passes when every request's tokens
#   equal the CPU's, or the common prefix covers >= 75% of the tokens (the differing requests
#   are printed; model_gpu_test checks top-1 teacher-forced, where such ties can be told apart).
set -u
T="$1"; shift
MPI=("$@")
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
probe=$(timeout 120 "$T" run --device cuda --preset tiny --workload n=1,in=4,out=1 --json 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "no usable GPU" <<<"$probe"; then
  echo "no CUDA device: $(grep -o 'no usable GPU: [^(]*' <<<"$probe" | head -1)"; exit 77
fi
run() { local n="$1"; shift; if [ "$n" = 1 ]; then timeout 300 "$T" "$@"; else timeout 300 "${MPI[@]}" -np "$n" "$T" "$@"; fi; }
tokens_of() { python3 -c 'import json,sys; print(json.dumps([json.loads(l)["tokens"] for l in open(sys.argv[1])]))' "$1"; }
prefix_share() {  # prefix_share A B: common-prefix tokens / tokens, over the requests
  python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
same = tot = 0
for x, y in zip(a, b):
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]: n += 1
    same += n; tot += max(len(x), len(y))
    if x != y: print(f"  request differs from token {n} of {len(y)}", file=sys.stderr)
print(f"{same / max(1, tot):.3f}")' "$1" "$2"
}
for i in 0 1 2 3; do
  echo "{\"id\": \"p$i\", \"tokens\": [$((5+i)), $((17*i+3)), 99, $((40+i)), 7, 250], \"sampling\": {\"greedy\": true, \"max_tokens\": 24}}"
done > "$WORK/tiny.jsonl"
cases=("tiny|--preset tiny --prompts $WORK/tiny.jsonl|exact")
GGUF="${TRELLIS_SMOLLM2_GGUF:-}"
ENV_FILE="${XDG_CACHE_HOME:-$HOME/.cache}/trellis/models.env"
[ -z "$GGUF" ] && [ -f "$ENV_FILE" ] && GGUF=$(sed -n 's/^TRELLIS_SMOLLM2_GGUF=//p' "$ENV_FILE" | tail -1)
if [ -n "$GGUF" ] && [ -f "$GGUF" ]; then
  cat > "$WORK/chat.jsonl" <<'P'
{"id": "capital", "text": "What is the capital of France?", "sampling": {"greedy": true, "max_tokens": 16}}
{"id": "colours", "text": "Name three colours.", "sampling": {"greedy": true, "max_tokens": 16}}
{"id": "poem", "text": "Write a short poem about the sea.", "sampling": {"greedy": true, "max_tokens": 16}}
P
  cases+=("smollm2|--model $GGUF --prompts $WORK/chat.jsonl --chat|prefix")
else
  echo "note SmolLM2 not installed (scripts/setup-models): only the synthetic model is compared"
fi
for c in "${cases[@]}"; do
  IFS='|' read -r name args rule <<<"$c"
  for pp in 1 2; do
    declare -A got=()
    for dev in cpu cuda; do
      f="$WORK/${name}_${pp}_${dev}.jsonl"
      # shellcheck disable=SC2086
      if run "$pp" run $args --pp "$pp" --device "$dev" --max-context 128 --out "$f" > "$WORK/log" 2>&1; then
        got[$dev]=$(tokens_of "$f")
      else
        bad "$name pp=$pp --device $dev failed"; tail -8 "$WORK/log"
      fi
    done
    [ -n "${got[cpu]:-}" ] && [ -n "${got[cuda]:-}" ] || continue
    if [ "${got[cpu]}" = "${got[cuda]}" ]; then ok "$name pp=$pp: cuda tokens equal cpu"
    elif [ "$rule" = prefix ]; then
      share=$(prefix_share "${got[cuda]}" "${got[cpu]}")
      if python3 -c "import sys; sys.exit(0 if float('$share') >= 0.75 else 1)"; then
        ok "$name pp=$pp: cuda tokens share ${share} of the cpu's as a common prefix (bf16 activations in GPU prefill)"
      else bad "$name pp=$pp: common prefix only ${share}: ${got[cuda]} vs ${got[cpu]}"; fi
    else bad "$name pp=$pp: cuda ${got[cuda]} vs cpu ${got[cpu]}"; fi
  done
done
echo "$fails failed"
[ "$fails" = 0 ]
