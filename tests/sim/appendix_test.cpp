// Every equation of SiPipe's Appendix A against values worked out by hand from one set of
// symbols chosen so the arithmetic is easy: s*b*h = 6, so s*b*h/B1 = 1 and s*b*h/B2 = 2.
#include <gtest/gtest.h>

#include "trellis/sim/appendix.hpp"

namespace trellis::sim::appendix {
namespace {

Symbols symbols() {
  Symbols x;
  x.L = 2, x.C = 0.1, x.N = 4, x.p = 2, x.t = 2, x.alpha = 0.01;
  x.s = 1, x.b = 2, x.h = 3, x.B1 = 6, x.B2 = 3, x.m = 2, x.n = 2;
  return x;
}

TEST(Appendix, Eq1TpComm) {
  // 2L (alpha log2 N + 2 sbh/B1) = 4 (0.01*2 + 2) = 8.08
  EXPECT_DOUBLE_EQ(eq1_tp_comm(symbols()), 8.08);
}

TEST(Appendix, Eq2And3PureTp) {
  // LC/N = 0.05; 2L alpha log2 N = 0.08; 4 sbh L / B1 = 8  -> 8.13
  EXPECT_DOUBLE_EQ(eq3_tp_delay(symbols()), 8.13);
  EXPECT_DOUBLE_EQ(eq2_tp_throughput(symbols()), 2 / 8.13);
}

TEST(Appendix, Eq4To6PurePp) {
  EXPECT_DOUBLE_EQ(eq4_pp_stage(symbols()), 1.05);       // 0.05 + 1
  EXPECT_DOUBLE_EQ(eq5_pp_throughput(symbols()), 1 / 1.05);  // (b/m) / t_stage
  EXPECT_DOUBLE_EQ(eq6_pp_delay(symbols()), 3.2);        // LC + (N-1) * 1
}

TEST(Appendix, Eq7Hybrid) {
  // TP term: 2L/p (alpha log2 t + 2 sbh/B1) = 2 (0.01 + 2) = 4.02
  Prediction r = eq7_hybrid(symbols());
  EXPECT_DOUBLE_EQ(r.throughput, 1 / (0.05 + 1 + 4.02));
  EXPECT_DOUBLE_EQ(r.delay, 2 * (0.05 + 4.02) + 1);
}

TEST(Appendix, Eq8MultinodeTp) {
  // 0.05 + 2L (alpha log2 N + 2 sbh/B2) = 0.05 + 4 (0.02 + 4) = 16.13
  Prediction r = eq8_multinode_tp(symbols());
  EXPECT_DOUBLE_EQ(r.delay, 16.13);
  EXPECT_DOUBLE_EQ(r.throughput, 2 / 16.13);
}

TEST(Appendix, Eq9MultinodePp) {
  Prediction r = eq9_multinode_pp(symbols());
  EXPECT_DOUBLE_EQ(r.throughput, 1 / (0.05 + 2));
  EXPECT_DOUBLE_EQ(r.delay, 0.2 + 1 * 2 + 2 * 1);  // LC + (n-1) sbh/B2 + (N-n) sbh/B1
}

TEST(Appendix, Eq10MultinodeHybrid) {
  // The all-reduce term charges 2L all-reduces over log2 N steps at B2: 4 (0.02 + 4) = 16.08
  Prediction r = eq10_multinode_hybrid(symbols());
  EXPECT_DOUBLE_EQ(r.throughput, 1 / (0.05 + 2 + 16.08));
  EXPECT_DOUBLE_EQ(r.delay, 0.2 + 2 + 2 + 16.08);
}

TEST(Appendix, PredictPicksTheEquationOfTheLayout) {
  const char* which = nullptr;
  Symbols x = symbols();
  x.n = 1, x.p = 1, x.t = 4;
  EXPECT_DOUBLE_EQ(predict(x, &which).delay, 8.13);
  EXPECT_STREQ(which, "eq. 2-3");
  x.p = 4, x.t = 1;
  EXPECT_DOUBLE_EQ(predict(x, &which).delay, 3.2);
  EXPECT_STREQ(which, "eq. 5-6");
  x.p = 2, x.t = 2;
  predict(x, &which);
  EXPECT_STREQ(which, "eq. 7");
  x.n = 2;
  EXPECT_DOUBLE_EQ(predict(x, &which).delay, 20.28);
  EXPECT_STREQ(which, "eq. 10");
  x.p = 1, x.t = 4;
  predict(x, &which);
  EXPECT_STREQ(which, "eq. 8");
  x.p = 4, x.t = 1;
  predict(x, &which);
  EXPECT_STREQ(which, "eq. 9");
}

}  // namespace
}  // namespace trellis::sim::appendix
