// Fuzz entry for the GGUF parser and what reads its output (dequantisation of every tensor's
// first row, the tokenizer, the config). Any input must end in success or a trellis::Error;
// a crash, a sanitizer report or an unbounded allocation is a bug.
//
// Built two ways: as a libFuzzer target (fuzz/gguf_fuzz_build.sh, clang -fsanitize=fuzzer)
// and linked into gguf_fuzz_replay (tests/gguf), a bounded deterministic mutation driver that
// runs in CTest with any compiler.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf.hpp"
#include "trellis/runtime/checkpoint/gguf_quant.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trellis::runtime;
  try {
    gguf::GgufFile f(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz-input");
    std::vector<float> row;
    for (const gguf::TensorEntry& t : f.tensors()) {
      const gguf::TypeTraits& tr = gguf::type_traits(t.type);
      if (!tr.dequantizable || t.row_elems() > (1 << 20)) continue;
      row.resize(static_cast<std::size_t>(t.row_elems()));
      gguf::dequantize_blocks(t.type, f.tensor_bytes(t).data(), t.row_elems() / tr.block_elems, row.data());
    }
    try {
      auto tok = Tokenizer::from_gguf(f);
      auto ids = tok.encode("Hello <|im_start|> 123 wörld");
      (void)tok.decode(ids);
    } catch (const trellis::Error&) {
    }
    try {
      (void)gguf::config_json_from_metadata(f);
    } catch (const trellis::Error&) {
    }
  } catch (const trellis::Error&) {
  }
  return 0;
}
