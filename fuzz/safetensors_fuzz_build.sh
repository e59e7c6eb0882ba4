#!/usr/bin/env bash
# Builds the libFuzzer target for the safetensors parser with clang (ASan + UBSan +
# libFuzzer) and, with --smoke, runs it for a bounded number of inputs (what CI does):
#   fuzz/safetensors_fuzz_build.sh [--smoke RUNS] [OUT_DIR]     (default build/fuzz)
#   build/fuzz/safetensors_fuzz -max_total_time=60 build/fuzz/safetensors_corpus
# Exits 77 (CTest: skipped) when clang++ with -fsanitize=fuzzer is not available.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=0
if [[ ${1:-} == --smoke ]]; then runs=$2; shift 2; fi
out=${1:-$root/build/fuzz}
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z $cxx ]]; then echo "SKIP: no clang++ (libFuzzer needs clang)"; exit 77; fi
mkdir -p "$out/safetensors_corpus"
src=("$root"/runtime/checkpoint/safetensors_parse.cpp "$root"/runtime/checkpoint/convert.cpp
     "$root"/core/src/error.cpp)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/core/include" -I"$root/runtime/include" -I"$root/runtime" -DTRELLIS_VERSION=\"fuzz\")
if ! "$cxx" "${flags[@]}" "$root/fuzz/safetensors_fuzz.cpp" "${src[@]}" -lfmt -o "$out/safetensors_fuzz"; then
  echo "SKIP: $cxx cannot build a libFuzzer target here"; exit 77
fi
echo "built $out/safetensors_fuzz"
# Seed corpus: a few hand-written valid files.
python3 - "$out/safetensors_corpus" <<'PY'
import json, struct, sys, os
d = sys.argv[1]
def write(name, tensors):
    header, data, off = {}, b"", 0
    for n, dt, shape, size in tensors:
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + size]}
        data += bytes((i * 7) & 255 for i in range(size)); off += size
    h = json.dumps(header).encode()
    open(os.path.join(d, name), "wb").write(struct.pack("<Q", len(h)) + h + data)
write("seed0", [("a", "F32", [2, 3], 24), ("b", "BF16", [4], 8)])
write("seed1", [("w", "F16", [2, 2], 8)])
PY
if (( runs > 0 )); then
  "$out/safetensors_fuzz" -runs="$runs" -max_len=4096 -seed=1 "$out/safetensors_corpus"
fi
