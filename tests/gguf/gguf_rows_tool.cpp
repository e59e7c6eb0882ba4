// gguf_rows_tool GGUF HF_TENSOR ROW_BEGIN ROW_END: prints rows [ROW_BEGIN, ROW_END) of a
// tensor as trellis's GGUF reader serves them (Hugging Face name and layout, f32) as JSON,
// for scripts/reference/llama_cpp_gguf_rows.py to compare with llama.cpp's gguf-py.
#include <cstdlib>
#include <iostream>

#include <nlohmann/json.hpp>

#include "trellis/runtime/checkpoint/gguf_reader.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: gguf_rows_tool GGUF HF_TENSOR ROW_BEGIN ROW_END\n";
    return 2;
  }
  try {
    auto r = trellis::runtime::open_gguf(argv[1]);
    const auto& t = r->require(argv[2]);
    trellis::runtime::Slice s{std::atoll(argv[3]), std::atoll(argv[4]), 0, t.cols()};
    std::vector<float> v(static_cast<std::size_t>(s.rows() * s.cols()));
    r->read_slice(argv[2], s, trellis::runtime::ElemType::kF32, v.data());
    nlohmann::json out = {{"shape", t.shape}, {"dtype", t.dtype}, {"values", v}};
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gguf_rows_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
