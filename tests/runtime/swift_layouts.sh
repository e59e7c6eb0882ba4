#!/usr/bin/env bash
# SWIFT self-speculative decoding under mpirun on the synthetic tiny model (docs/swift.md):
# greedy outputs with --swift at p x t in {1x1, 2x1, 1x2, 2x2} equal plain decoding token for
# token, with continuous batching (four sequences per group, one of them with "swift": false
# and one sampled, which decodes plainly and says why), stop tokens and max_tokens; every run
# drafted, verified and optimised (the JSON says how much); bad settings, a too-shallow model
# and an unsupported variant are refused naming the reason.
#   swift_layouts.sh TRELLIS MPIEXEC [MPI FLAGS...]
set -u
T=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
export TRELLIS_KERNEL_THREADS=1 TRELLIS_LOG_LEVEL=${TRELLIS_LOG_LEVEL:-warn}
fail() { echo "FAIL: $*"; exit 1; }

cat > "$W/prompts.jsonl" <<'P'
{"id": "a", "tokens": [1, 5, 9, 200, 17], "sampling": {"greedy": true, "max_tokens": 40}}
{"id": "b", "tokens": [3, 3, 3, 4, 8, 8], "sampling": {"greedy": true, "max_tokens": 33}}
{"id": "plain", "tokens": [7, 70, 107], "swift": false, "sampling": {"greedy": true, "max_tokens": 25}}
{"id": "sampled", "tokens": [11, 12], "sampling": {"temperature": 0.8, "seed": 4, "max_tokens": 12}}
{"id": "stops", "tokens": [8, 9, 10], "sampling": {"greedy": true, "max_tokens": 40, "stop": [1, 2, 3, 4, 5]}}
{"id": "c", "tokens": [42], "sampling": {"greedy": true, "max_tokens": 30}}
P
SW=(--set swift.gamma=8 --set swift.max_steps=12 --set swift.min_speedup=0 --set swift.calibration_steps=1
    --set swift.skip_ratio=0.25 --set swift.max_draft=4 --set swift.max_tree=12 --set swift.epsilon=0)
run() {  # run NAME NP PP TP [flags]
  local name=$1 np=$2 pp=$3 tp=$4; shift 4
  timeout 120 "${MPI[@]}" -np "$np" "$T" "${SW[@]}" run --pp "$pp" --tp "$tp" --prompts "$W/prompts.jsonl" \
    --max-seqs 8 --out "$W/$name.jsonl" --json "$@" > "$W/$name.log" 2>&1 || { rc=$?; cat "$W/$name.log"; fail "$name exited $rc"; }
}
swift_json() {  # swift_json NAME FIELD
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(json.loads(t[t.index("{\n"):])["swift"][sys.argv[2]])' "$W/$1.log" "$2"
}
run ref 1 1 1
for layout in "1 1" "2 1" "1 2" "2 2"; do
  set -- $layout
  name="sw$1x$2"
  run "$name" $(($1 * $2)) "$1" "$2" --swift
  cmp -s "$W/ref.jsonl" "$W/$name.jsonl" || { diff "$W/ref.jsonl" "$W/$name.jsonl"; fail "--swift at pp=$1 tp=$2 differs from plain"; }
  v=$(swift_json "$name" verify_passes); o=$(swift_json "$name" optimisation_steps); d=$(swift_json "$name" draft_steps)
  a=$(swift_json "$name" accepted); alt=$(swift_json "$name" accepted_alternatives)
  [ "$alt" -gt 0 ] || fail "pp=$1 tp=$2: no tree alternative was accepted (the KV move path did not run)"
  [ "$v" -gt 0 ] && [ "$o" -gt 0 ] && [ "$d" -gt 0 ] || fail "pp=$1 tp=$2: verify $v, optimise $o, drafts $d"
  grep -q 'request sampled: SWIFT drafts only greedy requests' "$W/$name.log" || fail "no note for the sampled request"
  echo "ok: --swift pp=$1 tp=$2 token-identical to plain ($d drafts, $a accepted of which $alt alternatives moved in the KV cache, $v verifies, $o optimisation steps)"
done

expect_error() {  # expect_error WHAT PATTERN [trellis args...]
  local what=$1 pat=$2; shift 2
  out=$(timeout 60 "${MPI[@]}" -np 1 "$T" "$@" 2>&1) && fail "$what was accepted"
  grep -q -- "$pat" <<<"$out" || { echo "$out" | tail -5; fail "$what: no '$pat' in the error"; }
  echo "ok: $what refused: $(grep -o -- "$pat.*" <<<"$out" | head -1 | cut -c1-120)"
}
expect_error "swift.gamma=0" "swift.gamma" --set swift.gamma=0 run --swift --workload n=1,in=4,out=4
expect_error "swift.skip_ratio=1" "swift.skip_ratio must be in (0, 1)" --set swift.skip_ratio=1 run --swift --workload n=1,in=4,out=4
expect_error "swift.max_draft=0" "swift.max_draft" --set swift.max_draft=0 run --swift --workload n=1,in=4,out=4
"$T" make-model --preset tiny --layers 3 --out "$W/m3" > /dev/null 2>&1 || fail "make-model failed"
expect_error "a 3-layer model" "at least 4 layers" run --swift --model "$W/m3" --workload n=1,in=4,out=4
expect_error "--variant parallel" "SWIFT drafts the standard model" run --swift --variant parallel --workload n=1,in=4,out=4
echo "all swift layout checks passed"
