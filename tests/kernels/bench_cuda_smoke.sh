#!/usr/bin/env bash
# `trellis bench kernels --device cuda` and `trellis bench model --device cuda` on the tiny
# preset (label gpu). With a GPU: both finish, their JSON carries the measured ceilings and
# the read stream's XOR check passed (it throws otherwise). Without one: both refuse with the
# reason before doing any work (bench model writes no checkpoint), then exit 77 (skipped).
#   bench_cuda_smoke.sh TRELLIS [--refusals-only]
# --refusals-only (the unit test bench_cuda_refusal, run by CI): only the no-GPU half, which
# must pass there; exit 77 where a GPU is visible (bench_cuda_smoke covers that machine).
set -u
T="$1"
REFUSALS_ONLY="${2:-}"
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
out=$(timeout 300 "$T" bench kernels --device cuda --preset tiny --tokens 16,40 --batch 3 --reps 2 --rotate-size 4MiB \
      --bandwidth-size 64MiB --json 2>&1); rc=$?
if [ $rc != 0 ]; then
  if grep -Eq "no GPU|no CUDA device|not built|insufficient" <<<"$out"; then
    out2=$(timeout 120 "$T" bench model --device cuda --preset tiny --no-torch --workdir "$WORK/m" --json 2>&1); rc2=$?
    if [ $rc2 = 0 ] || ! grep -Eq "no CUDA device|not built" <<<"$out2"; then
      echo "FAIL bench model --device cuda without a GPU: exit $rc2: $out2"; exit 1
    fi
    if [ -e "$WORK/m" ]; then echo "FAIL bench model wrote a checkpoint before refusing"; exit 1; fi
    echo "no CUDA device: $(tail -1 <<<"$out")"
    if [ "$REFUSALS_ONLY" = --refusals-only ]; then echo "ok   both refuse before any work: no GPU here"; exit 0; fi
    exit 77
  fi
  echo "FAIL bench kernels --device cuda: exit $rc"; echo "$out"; exit 1
fi
[ "$REFUSALS_ONLY" = --refusals-only ] && { echo "a GPU is visible here: bench_cuda_smoke checks it"; exit 77; }
for key in read_median_GBps copy_median_GBps cublaslt_direct_TFLOPs ours_16bit_x_TFLOPs fraction_of_read model_gemv; do
  grep -q "\"$key\"" <<<"$out" || { echo "FAIL bench kernels JSON lacks $key"; echo "$out"; exit 1; }
done
echo "ok   bench kernels --device cuda: $(grep -Eo '"read_median_GBps": *[0-9.]+' <<<"$out")"
out=$(timeout 300 "$T" bench model --device cuda --preset tiny --no-torch --steps 8 --workdir "$WORK/m" --json 2>&1); rc=$?
[ $rc = 0 ] && grep -Eq '"device": *"cuda"' <<<"$out" && grep -q '"copy_GBps_median"' <<<"$out" \
  || { echo "FAIL bench model --device cuda: exit $rc"; echo "$out"; exit 1; }
echo "ok   bench model --device cuda: $(grep -Eo '"decode_tokens_per_s": *[0-9.]+' <<<"$out")"
