#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU (sm_90 by default): a front for scripts/gpu-check.
# With no bundle yet (a GPU machine that has the Debian deps and CUDA), `scripts/gpu-check pack`
# builds the cuda preset into build/gpu-check and writes BUNDLE; then `scripts/gpu-check run`
# prints the card and `trellis info`, runs every gpu-labelled test (today cuda_kernels_test,
# model_gpu_test, runtime_gpu_run; discovered from CTest at pack time) and a few CPU ones, the
# kernel and decode benchmarks, and one summary line. On the device tool's machine (no Debian
# deps, no network) pack here and carry the bundle instead: docs/benchmarks.md, "GPU".
#   tests/kernels/run_gpu_checks.sh [BUNDLE_DIR] [-- RUN_ARGS...]   (default .gpu-bundle)
# Exit status: scripts/gpu-check run's (0 all passed, 1 a failure, 2 usage).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
bundle="$root/.gpu-bundle"
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --) ;;
  -*) echo "run_gpu_checks.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  "") ;;
  *) bundle="$1"; shift ;;
esac
[[ "${1:-}" == "--" ]] && shift
if [[ ! -f "$bundle/MANIFEST.json" ]]; then
  "$root/scripts/gpu-check" pack --out "$bundle" --jobs "${TRELLIS_JOBS:-$(nproc)}"
fi
exec "$root/scripts/gpu-check" run --bundle "$bundle" "$@"
