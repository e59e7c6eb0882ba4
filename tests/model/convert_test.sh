#!/usr/bin/env bash
# `trellis convert`: a GGUF (Q4_1, Q8_0, BF16; the llama.cpp q/k row permutation undone) or a
# safetensors directory written as config.json + safetensors gives the same logits, bit for bit
# at f32, as the source it came from; SmolLM2 too when scripts/setup-models installed it. Bad
# input is refused by name: a missing model, a non-empty --out without --force.
#   convert_test.sh TRELLIS
set -u
T="$1"
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
logits() {  # logits MODEL PREFIX: prefill of two prompts and two teacher-forced steps, f32 weights
  "$T" model-logits --model "$1" --prompts "1,5,9,33;7,2" --decode "4,8;11,3" --weights f32 --out "$2" > "$2.log" 2>&1
}
same() {  # same SOURCE LABEL: convert SOURCE to f32 and compare the logits with the source's
  local src="$1" label="$2" out="$W/$2"
  if ! "$T" convert --model "$src" --out "$out" --dtype f32 > "$W/$label.convert.log" 2>&1; then
    bad "$label: convert failed: $(tail -1 "$W/$label.convert.log")"; return
  fi
  [ -f "$out/config.json" ] || { bad "$label: no config.json"; return; }
  if logits "$src" "$W/$label-src" && logits "$out" "$W/$label-out" && cmp -s "$W/$label-src.f32" "$W/$label-out.f32"; then
    ok "$label: converted logits identical to the source's"
  else bad "$label: logits differ (or a run failed: $(tail -1 "$W/$label-out.log"))"; fi
}
for q in q4_1 q8_0 bf16; do
  "$T" make-model --preset tiny --format gguf --dtype "$q" --out "$W/g-$q" > /dev/null 2>&1 || bad "make-model gguf $q"
  same "$W/g-$q/model.gguf" "tiny-gguf-$q"
done
"$T" make-model --preset tiny-qwen2 --dtype bf16 --out "$W/st" > /dev/null 2>&1 || bad "make-model safetensors"
same "$W/st" "tiny-qwen2-safetensors"
if "$T" convert --model "$W/g-q4_1/model.gguf" --out "$W/b16" --dtype bf16 > /dev/null 2>&1 &&
   grep -q '"BF16"' <(head -c 4096 "$W/b16/model.safetensors" | tr -c '[:print:]' ' '); then
  ok "bf16 output stored as BF16"
else bad "bf16 output"; fi
out=$("$T" convert --model "$W/g-q4_1/model.gguf" --out "$W/b16" 2>&1); rc=$?
[ $rc != 0 ] && grep -q "not empty (--force" <<<"$out" && ok "a non-empty --out is refused" || bad "non-empty --out: exit $rc: $out"
"$T" convert --model "$W/g-q4_1/model.gguf" --out "$W/b16" --force > /dev/null 2>&1 && ok "--force writes into it" || bad "--force"
out=$("$T" convert --model "$W/nothing.gguf" --out "$W/x" 2>&1); rc=$?
[ $rc != 0 ] && grep -q "nothing.gguf" <<<"$out" && ok "a missing model is named" || bad "missing model: exit $rc: $out"
GGUF="${TRELLIS_SMOLLM2_GGUF:-}"
ENV_FILE="${XDG_CACHE_HOME:-$HOME/.cache}/trellis/models.env"
[ -z "$GGUF" ] && [ -f "$ENV_FILE" ] && GGUF=$(sed -n 's/^TRELLIS_SMOLLM2_GGUF=//p' "$ENV_FILE" | tail -1)
if [ -n "$GGUF" ] && [ -f "$GGUF" ]; then same "$GGUF" "smollm2"
else echo "note SmolLM2 not installed (scripts/setup-models): only synthetic models converted"; fi
echo "$fails failed"
[ "$fails" = 0 ]
