// Corrupt GGUF files: every way a file can lie (truncation, counts, lengths, offsets,
// types, dimensions) must give a trellis::Error naming the file (and the tensor or key),
// never a crash, a read outside the file or a huge allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "gguf/gguf_test_util.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"

namespace trellis::runtime::gguf {
namespace {

class GgufCorrupt : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = test::scratch_dir("corrupt");
  std::filesystem::path good_ = dir_ / "good.gguf";
  std::vector<std::byte> bytes_;

  void SetUp() override {
    GgufWriter w;
    w.set("general.architecture", Value::of_string("llama"));
    w.set("test.words", Value::of_strings({"alpha", "beta", "gamma"}));
    w.add_tensor("tensor.alpha", GgmlType::kF32, {32, 2});
    w.add_tensor("tensor.beta", GgmlType::kF32, {8});
    w.write(good_, [](const TensorEntry& t, float* dst) {
      for (std::int64_t i = 0; i < t.numel(); ++i) dst[i] = static_cast<float>(i);
    });
    bytes_ = test::read_all(good_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Offset of the first byte after the length-prefixed string `s` in the file.
  std::size_t after_string(const std::string& s) const {
    std::vector<std::byte> pat(8 + s.size());
    std::uint64_t n = s.size();
    std::memcpy(pat.data(), &n, 8);
    std::memcpy(pat.data() + 8, s.data(), s.size());
    auto it = std::search(bytes_.begin(), bytes_.end(), pat.begin(), pat.end());
    EXPECT_NE(it, bytes_.end()) << s;
    return static_cast<std::size_t>(it - bytes_.begin()) + pat.size();
  }
  template <typename T>
  void patch(std::size_t at, T v) {
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
  }
  // Writes the patched bytes and expects open (then reading every tensor) to fail with
  // `code`, naming the file and each of `names`.
  void expect_error(ErrorCode code, std::vector<std::string> names, std::size_t size = SIZE_MAX) {
    auto bad = dir_ / "bad.gguf";
    std::vector<std::byte> b(bytes_.begin(), bytes_.begin() + std::min(size, bytes_.size()));
    test::write_all(bad, b);
    try {
      auto r = open_gguf(bad);
      for (const TensorInfo& t : r->tensors()) {
        std::vector<float> v(static_cast<std::size_t>(t.numel()));
        r->read_slice(t.name, Slice::all(t), ElemType::kF32, v.data());
      }
      FAIL() << "no error for a file of " << b.size() << " bytes";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
      for (const auto& n : names) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
};

TEST_F(GgufCorrupt, GoodFileLoads) {
  auto r = open_gguf(good_);
  ASSERT_EQ(r->tensors().size(), 2u);
  float v[64];
  r->read_slice("tensor.alpha", Slice{1, 2, 0, 32}, ElemType::kF32, v);
  EXPECT_EQ(v[31], 63.0f);
}

TEST_F(GgufCorrupt, EveryTruncationFails) {
  for (std::size_t n = 0; n < bytes_.size(); ++n) {
    SCOPED_TRACE(n);
    expect_error(ErrorCode::kCorruptInput, {}, n);
  }
}

TEST_F(GgufCorrupt, BadMagicAndVersion) {
  auto saved = bytes_;
  bytes_[0] = std::byte{'X'};
  expect_error(ErrorCode::kCorruptInput, {"magic"});
  bytes_ = saved;
  patch<std::uint32_t>(4, 99);
  expect_error(ErrorCode::kCorruptInput, {"version 99"});
}

TEST_F(GgufCorrupt, LyingCounts) {
  auto saved = bytes_;
  patch<std::uint64_t>(8, 1ull << 60);  // tensor count
  expect_error(ErrorCode::kCorruptInput, {"tensor count"});
  bytes_ = saved;
  patch<std::uint64_t>(16, 1ull << 62);  // metadata count
  expect_error(ErrorCode::kCorruptInput, {"metadata count"});
  bytes_ = saved;
  patch<std::uint64_t>(16, 9);  // a few more keys than there are: runs into the tensor table
  expect_error(ErrorCode::kCorruptInput, {});
  bytes_ = saved;
  // Array count: after the key, u32 type (array) and u32 element type.
  patch<std::uint64_t>(after_string("test.words") + 8, 1ull << 61);
  expect_error(ErrorCode::kCorruptInput, {"test.words", "array count"});
}

TEST_F(GgufCorrupt, LyingStringLength) {
  patch<std::uint64_t>(after_string("alpha") - 5 - 8, 1ull << 50);
  expect_error(ErrorCode::kCorruptInput, {"test.words", "truncated"});
}

TEST_F(GgufCorrupt, UnknownValueType) {
  patch<std::uint32_t>(after_string("test.words"), 77);
  expect_error(ErrorCode::kCorruptInput, {"test.words", "value type 77"});
}

TEST_F(GgufCorrupt, TensorTableLies) {
  const std::size_t info = after_string("tensor.alpha");  // u32 n_dims, 2 x u64, u32 type, u64 offset
  auto saved = bytes_;
  patch<std::uint32_t>(info, 7);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "dimensions"});
  bytes_ = saved;
  patch<std::uint64_t>(info + 4, 0);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "zero"});
  bytes_ = saved;
  patch<std::uint64_t>(info + 4, 1ull << 40);
  patch<std::uint64_t>(info + 12, 1ull << 40);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "overflows"});
  bytes_ = saved;
  patch<std::uint64_t>(info + 12, 1000);  // more rows than the data section holds
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "past the end"});
  bytes_ = saved;
  patch<std::uint32_t>(info + 20, 99);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "unknown ggml type id 99"});
  bytes_ = saved;
  patch<std::uint64_t>(info + 24, 1ull << 62);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "past the end"});
  bytes_ = saved;
  patch<std::uint64_t>(info + 24, 4);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "alignment"});
  bytes_ = saved;
  patch<std::uint64_t>(info + 4, 31);  // Q4_0 rows must be whole 32-element blocks
  patch<std::uint32_t>(info + 20, 2);
  expect_error(ErrorCode::kCorruptInput, {"tensor.alpha", "blocks"});
}

TEST_F(GgufCorrupt, KnownButUnconvertibleTypeFailsOnRead) {
  patch<std::uint32_t>(after_string("tensor.alpha") + 20, 6);  // Q5_0: 2 rows x 22 bytes fit
  expect_error(ErrorCode::kUnsupported, {"tensor.alpha", "Q5_0"});
}

TEST_F(GgufCorrupt, DuplicateNamesAndBadAlignment) {
  GgufWriter w;
  w.set("general.alignment", Value::of_u32(24));
  w.add_tensor("x", GgmlType::kF32, {8});
  auto bad = dir_ / "align.gguf";
  w.write(bad, [](const TensorEntry&, float*) {});
  EXPECT_THROW(open_gguf(bad), Error);

  GgufWriter d;
  d.add_tensor("twice", GgmlType::kF32, {8});
  d.add_tensor("twice", GgmlType::kF32, {8});
  d.write(bad, [](const TensorEntry&, float*) {});
  try {
    open_gguf(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'twice' appears twice"), std::string::npos) << e.what();
  }
}

TEST_F(GgufCorrupt, RandomByteFlipsNeverCrash) {
  std::uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull; };
  const auto saved = bytes_;
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    bytes_ = saved;
    for (int k = 0; k < 4; ++k) bytes_[(next() >> 33) % bytes_.size()] = static_cast<std::byte>(next() >> 56);
    auto bad = dir_ / "flip.gguf";
    test::write_all(bad, bytes_);
    try {
      auto r = open_gguf(bad);
      for (const TensorInfo& t : r->tensors()) {
        std::vector<float> v(static_cast<std::size_t>(t.numel()));
        r->read_slice(t.name, Slice::all(t), ElemType::kF32, v.data());
      }
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace trellis::runtime::gguf
