// The tokenizer the text-handling fuzz targets use (private to fuzz/): the GGUF file named by
// TRELLIS_FUZZ_GGUF when set (the SmolLM2 model, for its real 49k-token vocabulary, merges
// and ChatML template), otherwise a tiny byte-level vocabulary with a few merges, two control
// tokens and a ChatML template, written to a temporary GGUF file once per process.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "harness/tiny_tokenizer.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"

namespace trellis::fuzz {

inline runtime::Tokenizer tiny_tokenizer() {
  const auto path = std::filesystem::temp_directory_path() / ("trellis-fuzz-tok-" + std::to_string(::getpid()) + ".gguf");
  test::write_tiny_tokenizer(path, "smollm",
                             "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                             "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  auto tok = runtime::Tokenizer::from_gguf(path);
  std::filesystem::remove(path);
  return tok;
}

inline const runtime::Tokenizer& fuzz_tokenizer() {
  static const runtime::Tokenizer tok = [] {
    const char* path = std::getenv("TRELLIS_FUZZ_GGUF");
    return path && *path ? runtime::Tokenizer::from_gguf(std::filesystem::path(path)) : tiny_tokenizer();
  }();
  return tok;
}

}  // namespace trellis::fuzz
