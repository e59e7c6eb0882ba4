// gguf_fuzz_replay [ITERATIONS] [SEED FILES...]   or   gguf_fuzz_replay --write-seeds DIR
// A bounded, deterministic mutation driver for
// LLVMFuzzerTestOneInput, for machines or CI runs without libFuzzer. Seeds are the given
// files, or (none given) small GGUF files written here with the trellis writer: a model with
// every writable tensor type and a tokenizer. Mutations: byte flips, overwrites with
// boundary integers (0, 1, 0xff.., 2^31, 2^63), truncation, duplication of a slice.
// Exit status 0 when every input ends without a crash (a crash ends the process).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "trellis/runtime/checkpoint/gguf_writer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Bytes = std::vector<std::uint8_t>;
using trellis::runtime::gguf::GgmlType;
using trellis::runtime::gguf::Value;

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Bytes builtin_seed(int which) {
  trellis::runtime::gguf::GgufWriter w;
  w.set("general.architecture", Value::of_string("llama"));
  w.set("llama.embedding_length", Value::of_u32(64));
  w.set("llama.attention.head_count", Value::of_u32(4));
  w.set("tokenizer.ggml.model", Value::of_string("gpt2"));
  w.set("tokenizer.ggml.pre", Value::of_string("smollm"));
  w.set("tokenizer.ggml.tokens", Value::of_strings({"<|im_start|>", "H", "e", "l", "o", "He", "Ġ", "1"}));
  w.set("tokenizer.ggml.token_type", Value::of_i32s({3, 1, 1, 1, 1, 1, 1, 1}));
  w.set("tokenizer.ggml.merges", Value::of_strings({"H e"}));
  const GgmlType types[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                            GgmlType::kQ4_1};
  for (int i = 0; i < 6; ++i)
    w.add_tensor("blk.0.t" + std::to_string(i), types[(i + which) % 6], {64, 2});
  auto path = std::filesystem::temp_directory_path() / ("trellis_fuzz_seed_" + std::to_string(::getpid()));
  w.write(path, [](const auto& t, float* dst) {
    for (std::int64_t k = 0; k < t.numel(); ++k) dst[k] = static_cast<float>(k % 7) - 3.0f;
  });
  Bytes b = read_file(path);
  std::filesystem::remove(path);
  return b;
}

struct Rng {
  std::uint64_t s;
  std::uint64_t next() { return s = s * 6364136223846793005ull + 1442695040888963407ull, s >> 11; }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

void mutate(Bytes& b, Rng& r) {
  if (b.empty()) return;
  static const std::uint64_t kBoundary[] = {0, 1, 0xff, 0xffff, 0x7fffffff, 0x80000000, 0xffffffffull,
                                            1ull << 40, 0x7fffffffffffffffull, ~0ull};
  switch (r.below(5)) {
    case 0: b[r.below(b.size())] ^= static_cast<std::uint8_t>(1u << r.below(8)); break;
    case 1: b[r.below(b.size())] = static_cast<std::uint8_t>(r.next()); break;
    case 2: {
      std::uint64_t v = kBoundary[r.below(std::size(kBoundary))];
      std::size_t at = r.below(b.size()), n = std::min<std::size_t>(r.below(2) ? 8 : 4, b.size() - at);
      std::memcpy(b.data() + at, &v, n);
      break;
    }
    case 3: b.resize(r.below(b.size())); break;
    default: {
      std::size_t at = r.below(b.size()), n = std::min<std::size_t>(r.below(64) + 1, b.size() - at);
      Bytes slice(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + n));
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(r.below(b.size())), slice.begin(), slice.end());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--write-seeds") == 0) {  // a corpus for libFuzzer
    std::filesystem::create_directories(argv[2]);
    for (int k = 0; k < 3; ++k) {
      Bytes b = builtin_seed(k);
      std::ofstream(std::filesystem::path(argv[2]) / ("seed" + std::to_string(k) + ".gguf"), std::ios::binary)
          .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    }
    return 0;
  }
  const long iterations = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 20000;
  std::vector<Bytes> seeds;
  for (int i = 2; i < argc; ++i) seeds.push_back(read_file(argv[i]));
  if (seeds.empty())
    for (int k = 0; k < 3; ++k) seeds.push_back(builtin_seed(k));
  for (const Bytes& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  Rng rng{42};
  for (long it = 0; it < iterations; ++it) {
    Bytes b = seeds[rng.below(seeds.size())];
    const std::size_t n = 1 + rng.below(4);
    for (std::size_t k = 0; k < n; ++k) mutate(b, rng);
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("gguf_fuzz_replay: %ld mutated inputs from %zu seeds, no crash\n", iterations, seeds.size());
  return 0;
}
