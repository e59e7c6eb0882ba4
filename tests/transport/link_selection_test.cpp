// The link-selection policy table and its overrides, on hand-made placements (no MPI).
#include <gtest/gtest.h>

#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/nccl_group.hpp"
#include "trellis/transport/selection.hpp"

namespace trellis::transport {
namespace {

using topology::LinkClass;

topology::Placement make_placement(topology::RankKind kind, std::vector<LinkClass> tp, std::vector<LinkClass> bounds) {
  topology::Placement p;
  p.kind = kind;
  p.pp = static_cast<int>(tp.size());
  p.tp = 2;
  for (auto c : tp) p.tp_groups.push_back({c, 0});
  for (auto c : bounds) p.boundaries.push_back({c, 0});
  return p;
}

TEST(LinkSelection, PolicyTable) {
  EXPECT_EQ(default_backend(LinkClass::kSameProcess, false), Backend::kShm);
  EXPECT_EQ(default_backend(LinkClass::kSharedMemory, false), Backend::kShm);
  EXPECT_EQ(default_backend(LinkClass::kRdma, false), Backend::kUcx);
  EXPECT_EQ(default_backend(LinkClass::kTcp, false), Backend::kUcx);
  for (auto c : topology::kAllLinkClasses) EXPECT_EQ(default_backend(c, true), Backend::kNccl);
}

TEST(LinkSelection, CpuPlanAcrossTwoHosts) {
  auto plan = plan_links(make_placement(topology::RankKind::kCpu, {LinkClass::kSharedMemory, LinkClass::kSharedMemory},
                                        {LinkClass::kTcp}),
                         SelectionPolicy::parse("auto", false));
  ASSERT_EQ(plan.tp_groups.size(), 2u);
  EXPECT_EQ(plan.tp_groups[0].backend, Backend::kShm);
  EXPECT_EQ(plan.boundaries[0].backend, Backend::kUcx);
  EXPECT_FALSE(plan.boundaries[0].overridden);
  auto text = format_link_plan(plan);
  EXPECT_NE(text.find("stage 0 -> 1"), std::string::npos) << text;
  EXPECT_NE(text.find("ucx"), std::string::npos) << text;
}

TEST(LinkSelection, GlobalAndPerClassOverrides) {
  auto policy = SelectionPolicy::parse("tcp, shm=mpi", false);
  ASSERT_TRUE(policy.global.has_value());
  EXPECT_EQ(*policy.global, Backend::kTcp);
  auto a = choose_backend(LinkClass::kSharedMemory, false, policy);
  EXPECT_EQ(a.backend, Backend::kMpi);  // per class wins over global
  EXPECT_TRUE(a.overridden);
  EXPECT_NE(a.why.find("shm=mpi"), std::string::npos);
  EXPECT_EQ(choose_backend(LinkClass::kRdma, false, policy).backend, Backend::kTcp);
  EXPECT_EQ(SelectionPolicy::parse("RDMA=TCP", false).per_class.at(LinkClass::kRdma), Backend::kTcp);
  EXPECT_EQ(policy.describe(), "tcp,shm=mpi");
}

TEST(LinkSelection, TpCollectiveFollowsAnExplicitTransport) {
  auto plan_for = [](const char* transport) {
    return plan_links(make_placement(topology::RankKind::kCpu, {LinkClass::kSharedMemory}, {}),
                      SelectionPolicy::parse(transport, false));
  };
  GroupOptions base;  // algorithm auto
  EXPECT_EQ(follow_transport(base, plan_for("auto").tp_groups[0]).algorithm, Algorithm::kAuto);
  auto tcp = follow_transport(base, plan_for("tcp").tp_groups[0]);
  EXPECT_EQ(tcp.algorithm, Algorithm::kRing);
  EXPECT_EQ(tcp.cross_host, Backend::kTcp);
  EXPECT_EQ(follow_transport(base, plan_for("shm=mpi").tp_groups[0]).algorithm, Algorithm::kMpi);
  EXPECT_EQ(follow_transport(base, plan_for("ucx").tp_groups[0]).cross_host, Backend::kUcx);
  // An explicit collective algorithm wins over the link override.
  base.algorithm = Algorithm::kShm;
  EXPECT_EQ(follow_transport(base, plan_for("tcp").tp_groups[0]).algorithm, Algorithm::kShm);
}

TEST(LinkSelection, ImpossibleOverridesNameTheProblem) {
  auto expect_invalid = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected kInvalidArgument mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid([] { choose_backend(LinkClass::kTcp, false, SelectionPolicy::parse("shm", false)); }, "one host");
  expect_invalid([] { choose_backend(LinkClass::kNvlink, true, SelectionPolicy::parse("ucx", false)); }, "GPU");
  expect_invalid([] { choose_backend(LinkClass::kSharedMemory, false, SelectionPolicy::parse("nccl", false)); }, "CPU");
  expect_invalid([] { SelectionPolicy::parse("carrier-pigeon", false); }, "carrier-pigeon");
  expect_invalid([] { SelectionPolicy::parse("tcp,ucx", false); }, "two global");
  expect_invalid([] { SelectionPolicy::parse("warp=tcp", false); }, "warp");
}

TEST(LinkSelection, NoNvlinkTurnsNvlinkIntoPcieAndAsksForP2pDisable) {
  auto policy = SelectionPolicy::parse("auto", true);
  auto c = choose_backend(LinkClass::kNvlink, true, policy);
  EXPECT_EQ(c.link_class, LinkClass::kPcie);
  EXPECT_EQ(c.backend, Backend::kNccl);
  auto env = environment_for(policy);
  ASSERT_EQ(env.size(), 1u);
  EXPECT_EQ(env[0].first, "NCCL_P2P_DISABLE");
  EXPECT_EQ(env[0].second, "1");
  EXPECT_TRUE(environment_for(SelectionPolicy::parse("auto", false)).empty());
  auto plan = plan_links(make_placement(topology::RankKind::kGpu, {LinkClass::kNvlink}, {}), policy);
  EXPECT_EQ(plan.tp_groups[0].link_class, LinkClass::kPcie);
}

TEST(LinkSelection, FromConfig) {
  Config config;
  config.set("comm.transport", "rdma=tcp", SettingSource::kFlag, "--transport");
  config.set("comm.no_nvlink", "true", SettingSource::kFlag, "--no-nvlink");
  auto p = SelectionPolicy::from_config(config);
  EXPECT_TRUE(p.no_nvlink);
  EXPECT_EQ(p.per_class.at(LinkClass::kRdma), Backend::kTcp);
}

// The wait policy comes from the comm.wait_* settings, for links and groups alike.
TEST(WaitPolicy, FromSettings) {
  Config config;
  auto d = wait_policy(config);
  EXPECT_EQ(d.spins, static_cast<unsigned>(config.get_int("comm.wait_spins")));
  EXPECT_EQ(d.yields, static_cast<unsigned>(config.get_int("comm.wait_yields")));
  EXPECT_EQ(d.sleep, std::chrono::microseconds(config.get_int("comm.wait_sleep_us")));
  config.set("comm.wait_spins", "5000", SettingSource::kFlag);
  config.set("comm.wait_sleep_us", "7", SettingSource::kFlag);
  auto p = wait_policy(config);
  EXPECT_EQ(p.spins, 5000u);
  EXPECT_EQ(p.sleep, std::chrono::microseconds(7));
  EXPECT_EQ(GroupOptions::from_config(config).wait.spins, 5000u);
  // A negative poll count is refused when it is set (the setting's range), naming it.
  try {
    config.set("comm.wait_yields", "-1", SettingSource::kFlag);
    ADD_FAILURE() << "a negative poll count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm.wait_yields"), std::string::npos) << e.what();
  }
}

// A timed-out wait still names what it waited for, though the name is formatted lazily.
TEST(WaitPolicy, TimeoutNamesTheWaitLazily) {
  int formatted = 0;
  auto what = [&] {
    ++formatted;
    return std::string("receive from rank 3");
  };
  int polls = 0;
  poll_until([&] { return ++polls == 10; }, Deadline::after_ms(10000), what);
  EXPECT_EQ(formatted, 0);
  try {
    poll_until([] { return false; }, Deadline::after_ms(5), what, PollPolicy{0, 0, std::chrono::microseconds(100)});
    ADD_FAILURE() << "the wait did not time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("receive from rank 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(formatted, 1);
}

// Which TP groups can have an NCCL communicator (the engine asks before touching a GPU):
// members on one host need GPUs of their own; a build without NCCL refuses by name.
TEST(NcclGroupPolicy, RanksSharingAGpuAreNamed) {
  EXPECT_EQ(nccl_group_obstacle({0, 1}, {0, 0}, {0, 1}), "");
  EXPECT_EQ(nccl_group_obstacle({0, 1}, {0, 1}, {0, 0}), "") << "GPU 0 of two different hosts";
  const std::string why = nccl_group_obstacle({2, 3}, {0, 0, 1, 1}, {0, 1, 0, 0});
  EXPECT_NE(why.find("ranks 2 and 3 share GPU 0 of host 1"), std::string::npos) << why;
  EXPECT_NE(nccl_group_obstacle({0, 5}, {0, 0}, {0, 1}).find("rank 5 has no known host"), std::string::npos);
  if (!nccl_group_built()) {
    auto world = make_local_bootstrap();
    try {
      (void)make_nccl_group(*world, {0}, 0, nullptr, Millis(1000));
      ADD_FAILURE() << "a build without NCCL made an NCCL group";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("no NCCL"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace trellis::transport
