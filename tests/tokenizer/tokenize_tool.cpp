// tokenize_tool GGUF STRINGS.json: prints the trellis token ids of every string as one JSON
// list of lists (special tokens parsed, no BOS), for scripts/reference/llama_cpp_tokenize.py.
#include <fstream>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "trellis/runtime/tokenizer/tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: tokenize_tool GGUF STRINGS.json\n";
    return 2;
  }
  // stdout carries the JSON; the tokenizer's warnings (a dropped byte) go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("tokenize_tool"));
  try {
    auto tok = trellis::runtime::Tokenizer::from_gguf(std::filesystem::path(argv[1]));
    std::ifstream in(argv[2]);
    auto strings = nlohmann::json::parse(in);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : strings) out.push_back(tok.encode(s.get<std::string>()));
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "tokenize_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
