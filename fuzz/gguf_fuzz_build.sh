#!/usr/bin/env bash
# Builds the libFuzzer target for the GGUF parser with clang (ASan + UBSan + libFuzzer):
#   fuzz/gguf_fuzz_build.sh [OUT_DIR]          (default build/fuzz)
#   build/fuzz/gguf_fuzz -max_total_time=60 build/fuzz/corpus
# Without seeds libFuzzer starts from nothing; pass a folder of small .gguf files (for example
# ones written by tests/gguf) as extra corpus arguments to start closer to valid files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/fuzz}
mkdir -p "$out/corpus"
src=(
  "$root"/runtime/checkpoint/gguf_parse.cpp "$root"/runtime/checkpoint/gguf_types.cpp
  "$root"/runtime/checkpoint/gguf_quant.cpp "$root"/runtime/checkpoint/gguf_names.cpp
  "$root"/runtime/checkpoint/convert.cpp "$root"/runtime/checkpoint/mapped_file.cpp
  "$root"/runtime/tokenizer/*.cpp "$root"/core/src/error.cpp "$root"/core/src/strings.cpp
)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/core/include" -I"$root/runtime/include" -I"$root/runtime" -DTRELLIS_VERSION=\"fuzz\")
clang++ "${flags[@]}" "$root/fuzz/gguf_fuzz.cpp" "${src[@]}" -lfmt -o "$out/gguf_fuzz"
echo "built $out/gguf_fuzz; run: $out/gguf_fuzz -max_total_time=60 $out/corpus"
