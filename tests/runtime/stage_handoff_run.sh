#!/usr/bin/env bash
# comm.stage_handoff on CPU stages (any build, no GPU needed): cuda-ipc is refused before
# loading with the reason; host and auto run pp=2 with the tokens of one rank, and auto says
# which path the boundary took and why (the host path: the stages run on the CPU, or a build
# without CUDA). Unknown names are refused. The CUDA IPC path itself: gpu_run_test.sh.
#   stage_handoff_run.sh TRELLIS MPIEXEC [FLAGS...]
set -u
export TRELLIS_LOG_LEVEL=info  # the boundary's line is an info line on rank 0
T="$1"; shift
MPI=("$@")
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
tokens_of() { python3 -c 'import json,sys; print(json.dumps([json.loads(l)["tokens"] for l in open(sys.argv[1])]))' "$1"; }
common=(run --device cpu --preset tiny --workload n=3,in=6,out=8,seed=3 --max-context 64)

msg=$(timeout 120 "${MPI[@]}" -np 2 "$T" "${common[@]}" --pp 2 --stage-handoff cuda-ipc 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "comm.stage_handoff=cuda-ipc (--stage-handoff): cannot use CUDA IPC: " <<<"$msg" \
   && ! grep -q "trellis run: pp=" <<<"$msg"; then
  ok "cuda-ipc on CPU stages refused before loading: $(grep -o 'cannot use CUDA IPC: [^"]*' <<<"$msg" | head -1)"
else bad "cuda-ipc on CPU stages (rc=$rc):"; echo "$msg" | grep -v "^ " | tail -5; fi

msg=$(timeout 60 "$T" --set comm.stage_handoff=ipc "${common[@]}" 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "unknown stage hand-off 'ipc' (valid: auto, host, cuda-ipc)" <<<"$msg"; then
  ok "comm.stage_handoff=ipc refused"
else bad "comm.stage_handoff=ipc (rc=$rc):"; echo "$msg" | tail -3; fi

declare -A got=()
if timeout 120 "$T" "${common[@]}" --out "$WORK/one.jsonl" > "$WORK/log" 2>&1; then got[one]=$(tokens_of "$WORK/one.jsonl")
else bad "one rank failed"; tail -5 "$WORK/log"; fi
for mode in host auto; do
  if timeout 180 "${MPI[@]}" -np 2 "$T" "${common[@]}" --pp 2 --stage-handoff "$mode" --out "$WORK/$mode.jsonl" \
       > "$WORK/log" 2>&1; then
    got[$mode]=$(tokens_of "$WORK/$mode.jsonl")
    line=$(grep -o "stage hand-off 0 -> 1 (rank 0 -> rank 1): .*" "$WORK/log" | head -1)
    want="host (comm.stage_handoff=host)"
    [ "$mode" = auto ] && want="host (the stages run on the CPU)"
    if grep -q "built without CUDA" <<<"$line" && [ "$mode" = auto ]; then want="host (built without CUDA"; fi
    if [[ "$line" == *"$want"* ]]; then ok "pp=2 --stage-handoff $mode: $line"
    else bad "pp=2 --stage-handoff $mode: expected '$want' in the boundary's line, got '$line'"; fi
  else
    bad "pp=2 --stage-handoff $mode failed"; tail -8 "$WORK/log"
  fi
  if [ -n "${got[$mode]:-}" ] && [ -n "${got[one]:-}" ]; then
    if [ "${got[$mode]}" = "${got[one]}" ]; then ok "pp=2 $mode: tokens equal one rank's"
    else bad "pp=2 $mode: ${got[$mode]} vs one rank ${got[one]}"; fi
  fi
done
echo "$fails failed"
[ "$fails" = 0 ]
