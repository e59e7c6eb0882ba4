#!/usr/bin/env bash
# `trellis run` on the emulated cluster, 2 hosts x 2 ranks (pp=2 x tp=2, and pp=4): the
# scheduling outputs reach the second host through its relay rank, hidden states and
# logits cross hosts over ucx; the tokens must equal the single-rank run's.
#   multihost_run_2x2.sh TRELLIS
set -u
source "$(dirname "$0")/../multihost/lib.sh"
T=$1
W=$(mktemp -d)
export TRELLIS_KERNEL_THREADS=1 TRELLIS_LOG_LEVEL=warn
cluster_start 2
trap '"$CLUSTER" down >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
cat > "$W/p.jsonl" <<'P'
{"tokens": [1, 5, 9, 200, 17], "sampling": {"greedy": true, "max_tokens": 10}}
{"text": "two hosts", "sampling": {"temperature": 0.8, "top_k": 30, "seed": 3, "max_tokens": 12}}
{"tokens": [4, 4, 4], "sampling": {"temperature": 1.2, "seed": 9, "repetition_penalty": 1.3, "max_tokens": 8}}
{"tokens": [7, 8], "sampling": {"greedy": true, "max_tokens": 6}}
{"tokens": [11, 12, 13, 14], "sampling": {"seed": 21, "top_p": 0.8, "max_tokens": 9}}
P
run() {  # NAME NP PP TP
  cluster_mpirun -np "$2" "$T" run --pp "$3" --tp "$4" --prompts "$W/p.jsonl" --max-seqs 4 --out "$W/$1.jsonl" \
    > "$W/$1.log" 2>&1 || { cat "$W/$1.log"; echo "FAIL: $1 exited $?"; exit 1; }
}
run ref 1 1 1
for l in "2 2" "4 1"; do
  set -- $l
  run "l$1x$2" 4 "$1" "$2"
  cmp -s "$W/ref.jsonl" "$W/l$1x$2.jsonl" || { diff "$W/ref.jsonl" "$W/l$1x$2.jsonl"; echo "FAIL: pp=$1 tp=$2 on 2 hosts differs"; exit 1; }
  grep -q "2 hosts" "$W/l$1x$2.log" || { cat "$W/l$1x$2.log"; echo "FAIL: the run did not see 2 hosts"; exit 1; }
  echo "ok: pp=$1 tp=$2 across 2 emulated hosts token-identical to 1 rank"
done
echo PASS
