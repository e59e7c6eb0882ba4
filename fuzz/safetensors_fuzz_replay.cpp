// A libFuzzer-free driver for fuzz/safetensors_fuzz.cpp: builds a seed corpus of valid
// safetensors files (written by write_safetensors), then feeds the fuzz entry point the
// seeds and N deterministic random mutations of them (byte flips, header-length edits,
// truncations, splices of digits into the JSON). Runs in CTest with any compiler; with
// clang and libFuzzer available, fuzz/safetensors_fuzz_build.sh runs the real fuzzer.
//   safetensors_fuzz_replay [ITERATIONS=20000] [SEED=1] [CORPUS_FILE...]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "trellis/runtime/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), {});
}

std::vector<Bytes> seeds() {
  using namespace trellis::runtime;
  auto dir = std::filesystem::temp_directory_path() / ("trellis_st_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::vector<TensorSpec>> sets = {
      {{"a", "F32", {3, 4}}, {"b", "BF16", {5}}, {"c", "F16", {2, 2, 2}}},
      {{"model.embed_tokens.weight", "BF16", {16, 8}}, {"x", "I32", {0}}},
      {{"only", "F32", {}}},
  };
  std::vector<Bytes> out;
  for (std::size_t i = 0; i < sets.size(); ++i) {
    auto p = dir / ("seed" + std::to_string(i) + ".safetensors");
    write_safetensors(p, sets[i], [](std::size_t k, std::span<std::byte> o) {
      for (std::size_t j = 0; j < o.size(); ++j) o[j] = static_cast<std::byte>(j * 31 + k);
    });
    out.push_back(read_file(p));
  }
  std::filesystem::remove_all(dir);
  return out;
}

Bytes mutate(const Bytes& in, std::mt19937_64& rng) {
  Bytes b = in;
  if (b.empty()) return b;
  switch (rng() % 6) {
    case 0:  // flip bytes anywhere
      for (int k = 0, n = 1 + static_cast<int>(rng() % 8); k < n; ++k) b[rng() % b.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      break;
    case 1:  // rewrite the header length
      for (int k = 0; k < 8 && k < static_cast<int>(b.size()); ++k) b[static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(rng());
      if (rng() % 2 && b.size() >= 8) { b[4] = b[5] = b[6] = b[7] = 0; }
      break;
    case 2:  // truncate
      b.resize(rng() % b.size());
      break;
    case 3: {  // replace a digit in the JSON with a random digit run (offsets, shapes)
      std::size_t start = std::min<std::size_t>(8, b.size()), end = std::min<std::size_t>(b.size(), 400);
      for (std::size_t k = start; k < end; ++k) {
        std::size_t i = start + rng() % (end - start);
        if (b[i] >= '0' && b[i] <= '9') {
          std::string digits = std::to_string(rng() % (rng() % 2 ? 100 : 1000000000000ull));
          b.erase(b.begin() + static_cast<long>(i));
          b.insert(b.begin() + static_cast<long>(i), digits.begin(), digits.end());
          break;
        }
      }
      break;
    }
    case 4:  // duplicate a chunk of the header
      if (b.size() > 16) {
        std::size_t i = 8 + rng() % (b.size() - 8), n = std::min<std::size_t>(b.size() - i, rng() % 32);
        b.insert(b.begin() + static_cast<long>(8 + rng() % (b.size() - 8)), b.begin() + static_cast<long>(i),
                 b.begin() + static_cast<long>(i + n));
      }
      break;
    default:  // random printable bytes in the header
      // Only past the 8-byte length prefix, within the first 300 bytes (where the JSON is).
      if (b.size() > 8)
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k)
          b[8 + rng() % (std::min<std::size_t>(b.size(), 300) - 8)] = static_cast<std::uint8_t>(32 + rng() % 95);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  long iters = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
  std::vector<Bytes> corpus = seeds();
  for (int i = 3; i < argc; ++i) corpus.push_back(read_file(argv[i]));
  for (const auto& s : corpus) LLVMFuzzerTestOneInput(s.data(), s.size());
  for (long it = 0; it < iters; ++it) {
    Bytes b = mutate(corpus[rng() % corpus.size()], rng);
    // Feed an exact-size heap copy so ASan (when enabled) catches any read past the end.
    auto* buf = static_cast<std::uint8_t*>(std::malloc(b.size() ? b.size() : 1));
    std::copy(b.begin(), b.end(), buf);
    LLVMFuzzerTestOneInput(buf, b.size());
    std::free(buf);
    if (rng() % 16 == 0) corpus.push_back(std::move(b));  // keep some mutants as new seeds
  }
  std::printf("safetensors fuzz replay: %ld mutated inputs from %zu seeds, no crash\n", iters, corpus.size());
  return 0;
}
