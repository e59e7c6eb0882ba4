#!/usr/bin/env bash
# --device cuda on a rank without a GPU is refused before loading, naming the CUDA runtime's
# reason; --device with an unknown name is a usage error. Skips (77) where a GPU is visible.
#   device_refusal.sh TRELLIS
set -u
T="$1"
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
msg=$(timeout 120 "$T" run --device cuda --preset tiny --workload n=1,in=4,out=1 2>&1); rc=$?
if [ $rc = 0 ]; then echo "a GPU is visible here (--device cuda ran): skipped"; exit 77; fi
if grep -q "no usable GPU: " <<<"$msg" && ! grep -q "loading each rank" <<<"$msg"; then
  ok "refused before loading: $(grep -o 'no usable GPU: [^;]*' <<<"$msg" | head -1)"
else bad "--device cuda without a GPU (rc=$rc):"; echo "$msg" | tail -5; fi
msg=$(timeout 60 "$T" run --device gpu --preset tiny 2>&1); rc=$?
if [ $rc != 0 ] && grep -q -- "--device" <<<"$msg"; then ok "--device gpu refused (rc=$rc)"; else bad "--device gpu (rc=$rc): $msg"; fi
msg=$(timeout 60 "$T" --set run.device=gpu run --preset tiny --workload n=1,in=4,out=1 2>&1); rc=$?
if [ $rc != 0 ] && grep -q "run.device (--device): unknown device 'gpu'" <<<"$msg"; then ok "run.device=gpu refused"
else bad "run.device=gpu (rc=$rc):"; echo "$msg" | tail -3; fi
msg=$(timeout 120 "$T" run --device cpu --preset tiny --workload n=2,in=4,out=2 --json 2>&1); rc=$?
if [ $rc = 0 ]; then ok "--device cpu runs"; else bad "--device cpu (rc=$rc):"; echo "$msg" | tail -3; fi
echo "$fails failed"
[ "$fails" = 0 ]
