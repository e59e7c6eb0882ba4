// Helpers shared by the model tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/synthetic.hpp"

namespace trellis::runtime::testing {

inline std::filesystem::path temp_dir(const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("trellis_model_{}_{}", tag, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Largest |a - b| relative to the largest |b| (logits are O(1), so this is ~absolute).
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0, scale = 1e-6;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return m / scale;
}

// Deterministic prompt tokens.
inline std::vector<std::int32_t> prompt(std::int64_t n, std::int64_t vocab, int salt) {
  std::vector<std::int32_t> t;
  for (std::int64_t i = 0; i < n; ++i) t.push_back(static_cast<std::int32_t>((i * 37 + salt * 101 + 5) % vocab));
  return t;
}

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message '" << m << "' lacks '" << n << "'";
  }
}

}  // namespace trellis::runtime::testing
