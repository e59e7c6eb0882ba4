// Fuzz entry for the safetensors header parser and the slice conversion that trusts it:
// any input must end in success or a trellis::Error; a crash, a sanitizer report or a read
// outside the input is a bug.
//
// Built two ways: as a libFuzzer target (fuzz/safetensors_fuzz_build.sh: clang
// -fsanitize=fuzzer,address,undefined, with a bounded smoke run), and linked into
// safetensors_fuzz_replay (tests/checkpoint), a deterministic corpus + mutation driver that
// CTest runs with any compiler.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/convert.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trellis::runtime;
  std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    std::vector<float> out;
    for (const SafetensorsEntry& e : parse_safetensors(file, "fuzz-input")) {
      convert::Stored st;
      if (!convert::parse_stored(e.dtype, st)) continue;
      // Convert the whole validated range: parse_safetensors promised it lies in the file.
      std::size_t n = static_cast<std::size_t>(e.end - e.begin) / safetensors_dtype_size(e.dtype);
      out.resize(n);
      convert::convert_row(file.data() + e.begin, st, out.data(), ElemType::kF32, n);
    }
  } catch (const trellis::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
