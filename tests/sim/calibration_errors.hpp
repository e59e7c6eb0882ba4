// For the calibration tests: the error Calibration::parse gives for a text. Separate from
// sim_fixtures.hpp, which non-GoogleTest code (the plan benchmark) includes too.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"

namespace trellis::sim::testing {

// The message of the error for `text` (which must be kCorruptInput), or "no error".
inline std::string calibration_error_of(const std::string& text) {
  try {
    Calibration::parse(text, "cal.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput);
    return e.what();
  }
  return "no error";
}

}  // namespace trellis::sim::testing
