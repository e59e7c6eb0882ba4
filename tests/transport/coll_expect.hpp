// Expectations shared by the collective tests (coll_group_test, coll_window_test).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis::transport {

// Runs `all_reduce`, an all-reduce that world rank `absent` never joins: it must fail within
// 5 s with kTimeout or kPeerFailed, and its message must name the absent rank.
template <typename Fn>
void expect_fails_naming_absent(int absent, Fn&& all_reduce) {
  auto t0 = Clock::now();
  try {
    all_reduce();
    ADD_FAILURE() << "all-reduce completed without rank " << absent;
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(absent)), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace trellis::transport
