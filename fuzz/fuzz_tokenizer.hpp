// The tokenizer the text-handling fuzz targets use (private to fuzz/): the GGUF file named by
// TRELLIS_FUZZ_GGUF when set (the SmolLM2 model, for its real 49k-token vocabulary, merges
// and ChatML template), otherwise a tiny byte-level vocabulary with a few merges, two control
// tokens and a ChatML template, written to a temporary GGUF file once per process.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "trellis/runtime/checkpoint/gguf_writer.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"

namespace trellis::fuzz {

inline runtime::Tokenizer tiny_tokenizer() {
  using runtime::gguf::Value;
  std::vector<std::string> tokens = {"<|im_start|>", "<|im_end|>"};
  std::vector<std::int32_t> types = {3, 3};
  int next = 256;
  // GPT-2's byte-to-symbol map: printable Latin-1 bytes stand for themselves, the rest get
  // code points from 256 up.
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
    std::string s;
    if (c < 0x80) s += static_cast<char>(c);
    else s += static_cast<char>(0xc0 | (c >> 6)), s += static_cast<char>(0x80 | (c & 0x3f));
    tokens.push_back(s);
    types.push_back(1);
  }
  const std::vector<std::string> merges = {"h e", "l l", "he ll", "hell o", "Ġ w"};
  for (const char* t : {"he", "ll", "hell", "hello", "Ġw"}) tokens.push_back(t), types.push_back(1);
  runtime::gguf::GgufWriter w;
  w.set("tokenizer.ggml.model", Value::of_string("gpt2"));
  w.set("tokenizer.ggml.pre", Value::of_string("smollm"));
  w.set("tokenizer.ggml.tokens", Value::of_strings(tokens));
  w.set("tokenizer.ggml.token_type", Value::of_i32s(types));
  w.set("tokenizer.ggml.merges", Value::of_strings(merges));
  w.set("tokenizer.ggml.bos_token_id", Value::of_u32(0));
  w.set("tokenizer.ggml.eos_token_id", Value::of_u32(1));
  w.set("tokenizer.chat_template",
        Value::of_string("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"));
  const auto path = std::filesystem::temp_directory_path() / ("trellis-fuzz-tok-" + std::to_string(::getpid()) + ".gguf");
  w.write(path, [](const runtime::gguf::TensorEntry&, float*) {});
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
