#!/usr/bin/env bash
# `trellis run` under mpirun at p x t in {1x1, 1x2, 2x1, 2x2, 4x1} (f32 weights): greedy and
# seeded-sampling outputs must be token-identical to the single-rank run, with every
# technique on and with all of them off; a bad request fails alone; a malformed prompts file
# is rejected naming its line.
#   run_layouts.sh TRELLIS MPIEXEC [MPI FLAGS...]
set -u
T=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
export TRELLIS_KERNEL_THREADS=1 TRELLIS_LOG_LEVEL=${TRELLIS_LOG_LEVEL:-warn}
fail() { echo "FAIL: $*"; exit 1; }

cat > "$W/prompts.jsonl" <<'P'
{"id": "greedy-tokens", "tokens": [1, 5, 9, 200, 17], "sampling": {"greedy": true, "max_tokens": 12}}
{"id": "greedy-text", "text": "The pipeline", "sampling": {"greedy": true, "max_tokens": 9}}
{"id": "seeded", "tokens": [3, 3, 3, 4], "sampling": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 11, "max_tokens": 10}}
{"id": "penalties", "text": "abcabcabc", "sampling": {"temperature": 1.1, "min_p": 0.02, "seed": 5, "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.3, "max_tokens": 14}}
{"id": "bad", "tokens": [1, 2], "sampling": {"top_p": 1.7}}
{"id": "short", "tokens": [7], "sampling": {"max_tokens": 1, "seed": 2}}
{"id": "stops", "tokens": [8, 9, 10], "sampling": {"greedy": true, "max_tokens": 30, "stop": [1, 2, 3]}}
P
for i in $(seq 1 9); do
  echo "{\"tokens\": [$i, $((i * 7 % 250)), $((i * 13 % 250))], \"sampling\": {\"seed\": $i, \"temperature\": 0.9, \"max_tokens\": $((4 + i % 5))}}" >> "$W/prompts.jsonl"
done

run() {  # run NAME NP PP TP [extra flags]
  local name=$1 np=$2 pp=$3 tp=$4; shift 4
  local pre=() post=()
  while [ $# -gt 0 ]; do
    if [ "$1" = --set ]; then pre+=("$1" "$2"); shift 2; else post+=("$1"); shift; fi
  done
  timeout 120 "${MPI[@]}" -np "$np" "$T" "${pre[@]}" run --pp "$pp" --tp "$tp" --prompts "$W/prompts.jsonl" \
    --max-seqs 4 --out "$W/$name.jsonl" --json "${post[@]}" > "$W/$name.log" 2>&1 || { rc=$?; cat "$W/$name.log"; fail "$name exited $rc"; }
}

run ref 1 1 1
grep -q '"status":"failed"' "$W/ref.jsonl" || fail "the bad request did not fail"
grep '"id":"bad"' "$W/ref.jsonl" | grep -q 'top_p must be in (0, 1]' || fail "the bad request's reason is missing"
[ "$(grep -c '"status":"ok"' "$W/ref.jsonl")" = 15 ] || fail "expected 15 finished requests: $(cat "$W/ref.jsonl")"
for layout in "1 2" "2 1" "2 2" "4 1"; do
  set -- $layout
  run "l$1x$2" $(($1 * $2)) "$1" "$2"
  cmp -s "$W/ref.jsonl" "$W/l$1x$2.jsonl" || { diff "$W/ref.jsonl" "$W/l$1x$2.jsonl"; fail "pp=$1 tp=$2 differs from 1x1"; }
  echo "ok: pp=$1 tp=$2 token-identical to 1x1"
done
# The cross-host backends, here in one host: ucx and mpi need their progress driven (a
# rendezvous-size hidden state stalled the pipeline before the engine's progress thread).
# The run says once, on rank 0, which backend every TP group and stage boundary uses and
# which all-reduce each TP group settled on.
for tr in ucx mpi tcp; do
  run "b$tr" 4 2 2 --set comm.transport=$tr --set log.level=info
  cmp -s "$W/ref.jsonl" "$W/b$tr.jsonl" || fail "pp=2 tp=2 over $tr differs from 1x1"
  grep -qE "stage 0 -> 1 +shm +-> $tr" "$W/b$tr.log" || { cat "$W/b$tr.log"; fail "the run does not log the $tr stage boundary"; }
  grep -q "connected rank pairs: $tr x 3" "$W/b$tr.log" || { cat "$W/b$tr.log"; fail "the run does not log its $tr links"; }
  # --transport steers the TP all-reduce too: MPI's group for mpi, the ring over ucx/tcp links.
  algo="ring over $tr"; [ $tr = mpi ] && algo=mpi
  [ "$(grep -c "TP group of stage . all-reduce: $algo\b" "$W/b$tr.log")" = 2 ] || { grep "all-reduce:" "$W/b$tr.log"; fail "the TP groups' all-reduce does not follow --transport $tr"; }
  echo "ok: pp=2 tp=2 over $tr token-identical, links logged"
done
# Every stage warms up at load (a dummy prefill and decode step, run.warmup_tokens, default
# 256) and the run reports it apart from TTFT; the warm-up never changes the tokens.
grep -q '"warmup_tokens": 256' "$W/l2x2.log" || { cat "$W/l2x2.log"; fail "--json does not report the warm-up's tokens"; }
grep -qE '"warmup_s": ([1-9]|0\.0*[1-9])' "$W/l2x2.log" || { cat "$W/l2x2.log"; fail "--json reports no warm-up time"; }
grep -qE '"load_s": ([1-9]|0\.0*[1-9])' "$W/l2x2.log" || { cat "$W/l2x2.log"; fail "--json reports no load time"; }
run cold 4 2 2 --set run.warmup_tokens=0
cmp -s "$W/ref.jsonl" "$W/cold.jsonl" || fail "pp=2 tp=2 without the warm-up differs from 1x1 with it"
grep -q '"warmup_tokens": 0' "$W/cold.log" || fail "run.warmup_tokens=0 still reports a warm-up"
echo "ok: warm-up reported in --json (load, warm-up) and token-neutral"
run naive 4 2 2 --no-cpu-sampler --no-tsem --no-sat
cmp -s "$W/ref.jsonl" "$W/naive.jsonl" || fail "all techniques off changes the tokens"
echo "ok: pp=2 tp=2 with all techniques off token-identical"
# --layer-split moves layers between stages; the tokens never change, and the run says
# which split it took and why.
for split in 3,1 1,3 even; do
  run "split$split" 2 2 1 --layer-split "$split" --set log.level=info
  cmp -s "$W/ref.jsonl" "$W/split$split.jsonl" || fail "--layer-split $split changes the tokens"
done
grep -q "layers per stage 3/1: as run.layer_split gives them" "$W/split3,1.log" || { cat "$W/split3,1.log"; fail "the given split is not logged"; }
grep -q "layers per stage 2/2: even" "$W/spliteven.log" || { cat "$W/spliteven.log"; fail "the even split is not logged"; }
run splitauto 3 3 1 --layer-split auto --set log.level=info
cmp -s "$W/ref.jsonl" "$W/splitauto.jsonl" || fail "--layer-split auto at p=3 changes the tokens"
grep -qE "layers per stage [0-9/]+: the last stage's LM head has the parameters of [0-9.]+ layers" "$W/splitauto.log" || { cat "$W/splitauto.log"; fail "the auto split does not say how it weighed the head"; }
for bad in 4,1 2,1,1 x,3 0,4; do
  out=$(timeout 60 "${MPI[@]}" -np 2 "$T" run --pp 2 --prompt hi --max-tokens 2 --layer-split "$bad" 2>&1) && fail "--layer-split $bad was accepted"
  grep -qE "layer split|run.layer_split" <<<"$out" || { echo "$out"; fail "--layer-split $bad: the error does not name the split"; }
done
echo "ok: --layer-split moves layers without changing tokens; bad splits refused by name"

printf '{"tokens": [1]}\n{"tokens": [1,\n' > "$W/broken.jsonl"
out=$(timeout 60 "${MPI[@]}" -np 2 "$T" run --pp 2 --prompts "$W/broken.jsonl" 2>&1); rc=$?
[ $rc != 0 ] || fail "a malformed prompts file was accepted"
grep -q "broken.jsonl:2: not valid JSON" <<<"$out" || { echo "$out"; fail "the malformed line is not named"; }
echo "ok: malformed prompts file rejected naming line 2"

out=$(timeout 60 "${MPI[@]}" -np 1 "$T" --set model.weights_format=bogus run --preset tiny --workload n=1,in=4,out=2 2>&1); rc=$?
[ $rc != 0 ] || fail "an unknown model.weights_format was accepted"
grep -q "model.weights_format: unknown weights format 'bogus'" <<<"$out" || { echo "$out"; fail "the bad weights format is not named"; }
echo "ok: unknown model.weights_format rejected naming the setting"
echo PASS
