// plan_core_binding: ranks left overlapping by the launcher get a CPU each, distinct cores
// first; disjoint sets are left alone; too few CPUs is a warning naming the ranks.
#include <gtest/gtest.h>

#include "trellis/topology/binding.hpp"

using trellis::topology::plan_core_binding;

TEST(CoreBinding, OverlappingRanksGetACoreEachInRankOrder) {
  // mpirun --bind-to none: every rank may run on all 4 CPUs.
  auto b = plan_core_binding({{0, 1, 2, 3}, {0, 1, 2, 3}}, {0, 1}, "h");
  ASSERT_TRUE(b.changed());
  EXPECT_EQ(b.cpus[0], std::vector<int>{0});
  EXPECT_EQ(b.cpus[1], std::vector<int>{1});
  EXPECT_TRUE(b.warning.empty());
}

TEST(CoreBinding, HardwareThreadsOfOneCoreComeLast) {
  // CPUs 0,1 are the two threads of core 0; 2,3 of core 1 (siblings numbered adjacently).
  auto b = plan_core_binding({{0, 1, 2, 3}, {0, 1, 2, 3}}, {4, 5}, "h", {0, 0, 1, 1});
  EXPECT_EQ(b.cpus[0], std::vector<int>{0});
  EXPECT_EQ(b.cpus[1], std::vector<int>{2});
  // Three ranks on two cores with two threads each: the third gets a sibling thread.
  auto c = plan_core_binding({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}, {0, 1, 2}, "h", {0, 0, 1, 1});
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
