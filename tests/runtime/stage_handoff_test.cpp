// The stage hand-off's host side (runtime/engine/stage_handoff.hpp), runnable without a GPU:
// the setting, the plan per boundary and its refusals, the engine refusing cuda-ipc on host
// stages, and the CUDA IPC set-up exchange over a real (in-process) link when the slots cannot
// be made or opened — both sides must agree: fall back together under auto, refuse together
// naming the rank and the peer under cuda-ipc. (The device path itself: runtime_gpu_run.)
#include <gtest/gtest.h>

#include <thread>

#include "engine_fixture.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {

EngineGrid grid_of(int pp, int tp, std::vector<int> hosts) { return EngineGrid::contiguous(pp, tp, std::move(hosts)); }

TEST(StageHandoff, ParsesItsNames) {
  EXPECT_EQ(parse_stage_handoff("auto", "x"), StageHandoff::kAuto);
  EXPECT_EQ(parse_stage_handoff("host", "x"), StageHandoff::kHost);
  EXPECT_EQ(parse_stage_handoff("cuda-ipc", "x"), StageHandoff::kCudaIpc);
  EXPECT_EQ(to_string(StageHandoff::kCudaIpc), "cuda-ipc");
  try {
    parse_stage_handoff("ipc", "comm.stage_handoff");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("comm.stage_handoff: unknown stage hand-off 'ipc'"), std::string::npos);
  }
}

TEST(StageHandoff, PlansEveryBoundary) {
  // pp=3, tp=2 on two hosts: stage 0 and 1 on host 0, stage 2 on host 1.
  const auto g = grid_of(3, 2, {0, 0, 0, 0, 1, 1});
  auto cpu = plan_stage_handoffs(g, StageHandoff::kAuto, false);
  ASSERT_EQ(cpu.size(), 4u);
  for (const auto& p : cpu) EXPECT_FALSE(p.cuda_ipc);
  EXPECT_EQ(cpu[0].from, 0);
  EXPECT_EQ(cpu[0].to, 2);
  EXPECT_EQ(cpu[3].from, 3);
  EXPECT_EQ(cpu[3].to, 5);
  const std::string cpu_why = cuda_ipc_built() ? "the stages run on the CPU" : "built without CUDA";
  EXPECT_NE(cpu[0].describe().find("stage hand-off 0 -> 1 (rank 0 -> rank 2): host (" + cpu_why), std::string::npos)
      << cpu[0].describe();

  auto gpu = plan_stage_handoffs(g, StageHandoff::kAuto, true);
  ASSERT_EQ(gpu.size(), 4u);
  EXPECT_EQ(gpu[0].cuda_ipc, cuda_ipc_built());
  EXPECT_EQ(gpu[1].cuda_ipc, cuda_ipc_built());
  EXPECT_FALSE(gpu[2].cuda_ipc);  // host 0 -> host 1
  if (cuda_ipc_built()) {
    EXPECT_NE(gpu[0].describe().find(": cuda-ipc (both stages on CUDA GPUs of host 0"), std::string::npos);
    EXPECT_NE(gpu[2].reason.find("different hosts (0 and 1)"), std::string::npos) << gpu[2].reason;
    EXPECT_NE(gpu[2].reason.find("UCX with CUDA memory is not implemented"), std::string::npos);
  }
  for (const auto& p : plan_stage_handoffs(g, StageHandoff::kHost, true)) {
    EXPECT_FALSE(p.cuda_ipc);
    EXPECT_EQ(p.reason, "comm.stage_handoff=host");
  }
  EXPECT_TRUE(plan_stage_handoffs(grid_of(1, 2, {}), StageHandoff::kCudaIpc, false).empty());  // no boundary
}

void expect_refused(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no refusal, expected: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(StageHandoff, CudaIpcIsRefusedWhereItCannotBe) {
  const auto two_hosts = grid_of(2, 1, {0, 1});
  const auto one_host = grid_of(2, 1, {0, 0});
  const std::string head = "comm.stage_handoff=cuda-ipc (--stage-handoff): stage hand-off 0 -> 1 (rank 0 -> rank 1) "
                           "cannot use CUDA IPC: ";
  expect_refused([&] { plan_stage_handoffs(one_host, StageHandoff::kCudaIpc, false); },
                 head + (cuda_ipc_built() ? "the stages run on the CPU" : "built without CUDA"));
  if (cuda_ipc_built()) {
    expect_refused([&] { plan_stage_handoffs(two_hosts, StageHandoff::kCudaIpc, true); },
                   head + "ranks on different hosts (0 and 1)");
    EXPECT_TRUE(plan_stage_handoffs(one_host, StageHandoff::kCudaIpc, true)[0].cuda_ipc);
  }
  expect_refused([] { refuse_stage_handoff_early(StageHandoff::kCudaIpc, 2, "cpu"); }, "cannot use CUDA IPC: ");
  refuse_stage_handoff_early(StageHandoff::kCudaIpc, 1, "cpu");  // one stage: nothing to refuse
  refuse_stage_handoff_early(StageHandoff::kAuto, 2, "cpu");
}

TEST(StageHandoff, EngineRefusesCudaIpcOnHostStages) {
  const auto g = grid_of(2, 1, {0, 0});
  test::InProcHub hub;
  test::InProcTransport links(hub, 0);
  test::StandInStage stage(61, 4, 2, 0, 1, 0, 2);
  EngineOptions opt;
  opt.scheduler.groups = 2;
  opt.stage_handoff = StageHandoff::kCudaIpc;
  opt.job = "handoff-refusal";
  Tracer tracer(false);
  expect_refused([&] { run_engine(0, g, links, stage, {}, opt, tracer); }, "cannot use CUDA IPC: ");
}

// Both sides of one boundary, set up on two threads over an in-process link. On a machine
// without a GPU the receiver cannot make its slots; with one, the sender cannot open slots
// exported by its own process (CUDA IPC is between processes). Either way it must fail, and
// both sides must learn it from the exchange.
struct SetupOutcome {
  bool sender_null = false, receiver_null = false;
  std::string sender_why, receiver_why, sender_error, receiver_error;
};

SetupOutcome set_up_pair(bool required) {
  test::InProcHub hub;
  test::InProcTransport a(hub, 0), b(hub, 1);
  SetupOutcome out;
  const auto deadline = Deadline::after(std::chrono::seconds(20));
  std::thread rx([&] {
    try {
      auto r = CudaIpcReceiver::connect({&b.link(0), 1, 0, 4096, required, {}}, deadline, &out.receiver_why);
      out.receiver_null = r == nullptr;
    } catch (const Error& e) {
      out.receiver_error = e.what();
    }
  });
  try {
    auto s = CudaIpcSender::connect({&a.link(1), 0, 0, 4096, required, {}}, deadline, &out.sender_why);
    out.sender_null = s == nullptr;
  } catch (const Error& e) {
    out.sender_error = e.what();
  }
  rx.join();
  return out;
}

TEST(StageHandoff, FailedSetUpFallsBackOnBothSides) {
  const auto o = set_up_pair(false);
  EXPECT_EQ(o.sender_error, "");
  EXPECT_EQ(o.receiver_error, "");
  EXPECT_TRUE(o.sender_null);
  EXPECT_TRUE(o.receiver_null);
  EXPECT_FALSE(o.sender_why.empty());
  EXPECT_FALSE(o.receiver_why.empty());
}

TEST(StageHandoff, FailedSetUpIsRefusedOnBothSidesWhenRequired) {
  const auto o = set_up_pair(true);
  EXPECT_NE(o.sender_error.find("rank 0: comm.stage_handoff=cuda-ipc: CUDA IPC hand-off to rank 1 over shm cannot be set up: "),
            std::string::npos)
      << o.sender_error;
  EXPECT_NE(o.receiver_error.find("rank 1: comm.stage_handoff=cuda-ipc: CUDA IPC hand-off from rank 0 over shm cannot be "
                                  "set up: "),
            std::string::npos)
      << o.receiver_error;
}

// The bench alone, with no second process to pair with: a build without CUDA refuses by name;
// a CUDA build fails with an error too (no GPU here, or, on a GPU machine, no peer answers the
// set-up before the deadline), never hangs and never passes. Not a skip in either build.
TEST(StageHandoff, BenchRefusesWithoutCudaOrAPeer) {
  test::InProcHub hub;
  test::InProcTransport a(hub, 0);
  const auto run = [&] { bench_cuda_handoff(a.link(1), 0, 0, 0, 64, 1, 0, Deadline::after(std::chrono::seconds(3))); };
  if (!cuda_ipc_built()) return expect_refused(run, "bench handoff: cannot use CUDA IPC: built without CUDA");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run();
    ADD_FAILURE() << "the bench ran with no GPU or no peer";
  } catch (const Error& e) {
    EXPECT_FALSE(std::string(e.what()).empty());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "bounded by the deadline";
}

}  // namespace
