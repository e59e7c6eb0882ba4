// plan_core_binding: ranks left overlapping by the launcher get an even share of whole cores
// (a CPU each, distinct cores first, when there are fewer cores than ranks); disjoint sets are
// left alone; too few CPUs is a warning naming the ranks.
#include <gtest/gtest.h>

#include "trellis/topology/binding.hpp"

using trellis::topology::plan_core_binding;

TEST(CoreBinding, OverlappingRanksShareTheCoresInRankOrder) {
  // mpirun --bind-to none: every rank may run on all 4 CPUs (4 cores).
  auto b = plan_core_binding({{0, 1, 2, 3}, {0, 1, 2, 3}}, {0, 1}, "h");
  ASSERT_TRUE(b.changed());
  EXPECT_EQ(b.cpus[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(b.cpus[1], (std::vector<int>{2, 3}));
  EXPECT_TRUE(b.warning.empty());
  // Two GPU ranks on a 16-core host: 8 each (not one: a rank's engine threads need cores).
  std::vector<int> sixteen(16);
  for (int i = 0; i < 16; ++i) sixteen[static_cast<std::size_t>(i)] = i;
  auto g = plan_core_binding({sixteen, sixteen}, {0, 1}, "gpu");
  EXPECT_EQ(g.cpus[0].size(), 8u);
  EXPECT_EQ(g.cpus[1].front(), 8);
  // 5 cores for 2 ranks: the first takes the odd one; every core is used once.
  auto o = plan_core_binding({{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}}, {0, 1}, "h");
  EXPECT_EQ(o.cpus[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(o.cpus[1], (std::vector<int>{3, 4}));
  // Two ranks on two CPUs (this project's CI machine): one each, as before.
  auto t = plan_core_binding({{0, 1}, {0, 1}}, {0, 1}, "h");
  EXPECT_EQ(t.cpus[0], std::vector<int>{0});
  EXPECT_EQ(t.cpus[1], std::vector<int>{1});
}

TEST(CoreBinding, WholeCoresWithTheirSiblingsThenOneThreadEach) {
  // CPUs 0,1 are the two threads of core 0; 2,3 of core 1 (siblings numbered adjacently).
  auto b = plan_core_binding({{0, 1, 2, 3}, {0, 1, 2, 3}}, {4, 5}, "h", {0, 0, 1, 1});
  EXPECT_EQ(b.cpus[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(b.cpus[1], (std::vector<int>{2, 3}));
  // Siblings numbered apart (Linux's usual order: 0-3 first threads, 4-7 second ones).
  auto a = plan_core_binding({{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}}, {0, 1}, "h", {0, 1, 2, 3, 0, 1, 2, 3});
  EXPECT_EQ(a.cpus[0], (std::vector<int>{0, 4, 1, 5}));
  EXPECT_EQ(a.cpus[1], (std::vector<int>{2, 6, 3, 7}));
  // Three ranks on two cores with two threads each: a thread each, the third a sibling.
  auto c = plan_core_binding({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}, {0, 1, 2}, "h", {0, 0, 1, 1});
  EXPECT_EQ(c.cpus[0], std::vector<int>{0});
  EXPECT_EQ(c.cpus[1], std::vector<int>{2});
  EXPECT_EQ(c.cpus[2], std::vector<int>{1});
}

TEST(CoreBinding, DisjointOrUnknownSetsAreLeftAlone) {
  EXPECT_FALSE(plan_core_binding({{0}, {1}}, {0, 1}, "h").changed());  // mpirun --bind-to core
  EXPECT_FALSE(plan_core_binding({{0, 1}, {}}, {0, 1}, "h").changed());
  EXPECT_FALSE(plan_core_binding({{0, 1}}, {0}, "h").changed());  // one rank on the host
  // Socket binding (Open MPI's default above two ranks): overlapping, so bound.
  EXPECT_TRUE(plan_core_binding({{0, 1}, {0, 1}, {2, 3}, {2, 3}}, {0, 1, 2, 3}, "h").changed());
}

TEST(CoreBinding, MoreRanksThanCpusWarnsNamingThemAndBindsNothing) {
  auto b = plan_core_binding({{0, 1}, {0, 1}, {0, 1}}, {3, 4, 5}, "node7");
  EXPECT_FALSE(b.changed());
  EXPECT_NE(b.warning.find("host node7: 3 ranks (3, 4, 5) share 2 CPUs (0,1)"), std::string::npos) << b.warning;
}
