// gguf_convert_tool IN.gguf OUT.gguf TYPE: rewrites a Llama GGUF through trellis — every
// tensor read by open_gguf (dequantised, Hugging Face layout) and written back by
// write_llama_gguf with 2-D weights as TYPE (F32, F16, BF16, Q8_0, Q4_0, Q4_1), carrying the
// tokenizer.* and general.* metadata. Used to give llama.cpp a file trellis made (and an
// F32 copy of SmolLM2, so both engines can be compared without quantised arithmetic).
#include <iostream>

#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#include "trellis/runtime/checkpoint/gguf_writer.hpp"

int main(int argc, char** argv) {
  using namespace trellis::runtime;
  if (argc != 4) {
    std::cerr << "usage: gguf_convert_tool IN.gguf OUT.gguf TYPE\n";
    return 2;
  }
  try {
    auto type = gguf::parse_type(argv[3]);
    if (!type) throw std::runtime_error(std::string("unknown type ") + argv[3]);
    auto reader = open_gguf(argv[1]);
    auto meta = gguf::GgufFile::open(argv[1]);
    std::vector<std::pair<std::string, gguf::Value>> extra;
    for (const auto& [k, v] : meta->metadata())
      if ((k.starts_with("tokenizer.") || k.starts_with("general.")) && k != "general.alignment" &&
          k != "general.architecture" && k != "general.file_type")
        extra.emplace_back(k, v);
    gguf::write_llama_gguf(argv[2], reader->config_json().value(), reader->tensors(),
                           [&](const TensorInfo& t, float* dst) {
                             reader->read_slice(t.name, Slice::all(t), ElemType::kF32, dst);
                           },
                           *type, extra);
  } catch (const std::exception& e) {
    std::cerr << "gguf_convert_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
