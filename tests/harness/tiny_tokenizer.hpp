// A tiny byte-level tokenizer written as a GGUF file: the 256 byte symbols (GPT-2's
// byte-to-symbol map), five merges ("he", "ll", "hell", "hello", "Ġw"), the control tokens
// <|im_start|> (id 0, BOS) and <|im_end|> (id 1, EOS), and the given chat template. For
// tests/tokenizer and the fuzz targets (fuzz/fuzz_tokenizer.hpp), which must not need a model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trellis/runtime/checkpoint/gguf_writer.hpp"

namespace trellis::test {

inline void write_tiny_tokenizer(const std::filesystem::path& path, const std::string& pre,
                                 const std::string& chat_template) {
  using runtime::gguf::Value;
  std::vector<std::string> tokens = {"<|im_start|>", "<|im_end|>"};
  std::vector<std::int32_t> types = {3, 3};
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    // Printable Latin-1 bytes stand for themselves; the rest get code points from 256 up.
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
  w.set("tokenizer.ggml.pre", Value::of_string(pre));
  w.set("tokenizer.ggml.tokens", Value::of_strings(tokens));
  w.set("tokenizer.ggml.token_type", Value::of_i32s(types));
  w.set("tokenizer.ggml.merges", Value::of_strings(merges));
  w.set("tokenizer.ggml.bos_token_id", Value::of_u32(0));
  w.set("tokenizer.ggml.eos_token_id", Value::of_u32(1));
  w.set("tokenizer.chat_template", Value::of_string(chat_template));
  w.write(path, [](const runtime::gguf::TensorEntry&, float*) {});
}

}  // namespace trellis::test
