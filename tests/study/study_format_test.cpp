// The study's derived metrics and formats on hand-made points: speedup over standard, the
// share of the no-communication bound, NaN where it is undefined, and nocomm's label.
#include <gtest/gtest.h>

#include <cmath>

#include "trellis/runtime/study/variant_study.hpp"

namespace trellis::runtime {
namespace {

StudyPoint pt(const char* v, int batch, double prefill, double decode) {
  StudyPoint p;
  p.variant = v;
  p.layers = "all";
  p.exact = std::string(v) != "nocomm";
  p.batch = batch;
  p.prompt_len = 4;
  p.gen_len = 2;
  p.prefill_s = prefill;
  p.decode_s = decode;
  return p;
}

TEST(StudyDerive, SpeedupAndBoundShare) {
  std::vector<StudyPoint> ps = {pt("standard", 1, 0.4, 0.1), pt("ladder", 1, 0.3, 0.08), pt("nocomm", 1, 0.2, 0.06)};
  derive_study(ps);
  EXPECT_DOUBLE_EQ(ps[0].tokens_per_s, 2.0 / (0.4 + 0.2));
  EXPECT_NEAR(ps[0].speedup_pct, 0.0, 1e-12);
  EXPECT_NEAR(ps[1].prefill_bound_share, 0.5, 1e-12);   // (0.4 - 0.3) / (0.4 - 0.2)
  EXPECT_NEAR(ps[1].decode_bound_share, 0.5, 1e-12);    // (0.1 - 0.08) / (0.1 - 0.06)
  EXPECT_NEAR(ps[1].speedup_pct, 100.0 * ((2.0 / 0.46) / (2.0 / 0.6) - 1.0), 1e-9);
  EXPECT_NEAR(ps[2].decode_bound_share, 1.0, 1e-12);
}

TEST(StudyDerive, UndefinedWithoutReferenceOrRoom) {
  std::vector<StudyPoint> ps = {pt("ladder", 2, 0.3, 0.1), pt("standard", 4, 0.2, 0.1), pt("nocomm", 4, 0.3, 0.1),
                                pt("lp", 4, 0.2, 0.1)};
  derive_study(ps);
  EXPECT_TRUE(std::isnan(ps[0].speedup_pct));          // batch 2 has no standard
  EXPECT_TRUE(std::isnan(ps[3].prefill_bound_share));  // nocomm not faster: no room
  EXPECT_TRUE(std::isnan(ps[3].decode_bound_share));
}

TEST(StudyFormat, NoCommLabelledEverywhere) {
  std::vector<StudyPoint> ps = {pt("standard", 1, 0.4, 0.1), pt("nocomm", 1, 0.2, 0.06)};
  derive_study(ps);
  EXPECT_NE(format_study_tables(ps, "t").find("(upper bound, outputs wrong)"), std::string::npos);
  EXPECT_NE(format_study_csv(ps).find(",0,\"upper bound, outputs wrong\"\n"), std::string::npos);
  EXPECT_NE(format_study_csv(ps).find(",decode_thread_cpu_ms,decode_process_cpu_ms,"), std::string::npos);
  EXPECT_NE(format_study_tables(ps, "t").find("thr cpu"), std::string::npos);
  const std::string svg = format_study_svg(ps, "a <title> & more");
  EXPECT_NE(svg.find("nocomm (upper bound, outputs wrong)"), std::string::npos);
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(svg.rfind("</svg>\n"), svg.size() - 7);
}

}  // namespace
}  // namespace trellis::runtime
