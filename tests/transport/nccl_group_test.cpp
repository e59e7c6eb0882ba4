// The NCCL group (nccl_group.hpp) on a real GPU (label gpu; exit 77 without one). One GPU
// allows one rank per communicator, so these are 1-rank communicators: they check that each
// operation is issued right (type, count, stream order, the asynchronous fence, the barrier's
// host wait) and that the group describes itself; sums over several GPUs need a machine with
// several (docs/gpu-runs/README.md says which ran where).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "harness/gpu_main.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/kernels/tensor.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/nccl_group.hpp"

namespace trellis::transport {
namespace {

using kernels::Device;
using kernels::DType;
using kernels::Tensor;

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

Tensor device_copy(const kernels::Context& ctx, const std::vector<float>& v) {
  Tensor h = Tensor::empty(DType::kF32, {static_cast<std::int64_t>(v.size())});
  std::copy(v.begin(), v.end(), h.ptr<float>());
  Tensor d = Tensor::empty(DType::kF32, {static_cast<std::int64_t>(v.size())}, Device::kCuda);
  kernels::copy(ctx, h, d);
  return d;
}

std::vector<float> host_copy(const kernels::Context& ctx, const Tensor& d) {
  Tensor h = Tensor::empty(DType::kF32, {d.numel()});
  kernels::copy(ctx, d, h);  // stream-ordered after everything enqueued before: the fence included
  return {h.ptr<float>(), h.ptr<float>() + d.numel()};
}

TEST(NcclGroup, OneRankCommunicatorOperations) {
  auto world = make_local_bootstrap();
  kernels::Context ctx(Device::kCuda, 0);
  auto g = make_nccl_group(*world, {0}, 0, ctx.cuda_stream(), Millis(20000));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->device_memory());
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->describe().rfind("nccl", 0), 0u) << g->describe();

  // 1000003 floats: not a multiple of any NCCL chunk, so a wrong count would show at the tail.
  const std::vector<float> v = iota(1000003, -3.0f);
  Tensor x = device_copy(ctx, v);
  g->all_reduce(x.view().data, v.size(), transport::DType::kF32);
  EXPECT_EQ(host_copy(ctx, x), v) << "a sum over one rank is the rank's own data";

  // The asynchronous form: complete once the compute stream waits for it; then in order.
  Tensor y = device_copy(ctx, iota(4099, 7.0f));
  auto req = g->all_reduce_async(y.view().data, 4099, transport::DType::kF32);
  EXPECT_TRUE(req->test());
  EXPECT_EQ(req->bytes(), 4099u * sizeof(float));
  EXPECT_EQ(host_copy(ctx, y), iota(4099, 7.0f));

  // all-gather of one rank copies in to out; broadcast from rank 0 keeps the data.
  Tensor out = Tensor::zeros(DType::kF32, {257}, Device::kCuda);
  Tensor in = device_copy(ctx, iota(257, 1.0f));
  g->all_gather(in.view().data, out.view().data, 257 * sizeof(float));
  EXPECT_EQ(host_copy(ctx, out), iota(257, 1.0f));
  g->broadcast(in.view().data, 257 * sizeof(float), 0);
  EXPECT_EQ(host_copy(ctx, in), iota(257, 1.0f));
  g->barrier();  // waits on the host for a one-element all-reduce; returns well inside the deadline

  // Many operations back to back: the watchdog retires their events as they finish.
  for (int i = 0; i < 200; ++i) g->all_reduce(x.view().data, v.size(), transport::DType::kF32);
  g->barrier();
  EXPECT_EQ(host_copy(ctx, x), v);
}


// The watchdog (item 4 of issue 18) without a second GPU: a host function holds the stream for
// longer than the group's deadline, so the all-reduce queued behind it cannot finish in time,
// as if a peer never arrived. The watchdog must abort the communicator, and the next call must
// throw kPeerFailed saying which operation outlived the deadline; the stream must move on.
void CUDART_CB hold_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST(NcclGroup, WatchdogAbortsACollectivePastItsDeadline) {
  auto world = make_local_bootstrap();
  kernels::Context ctx(Device::kCuda, 0);
  auto g = make_nccl_group(*world, {0}, 0, ctx.cuda_stream(), Millis(300));
  Tensor x = device_copy(ctx, iota(1024, 0.0f));
  static int hold_ms = 1500;
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(ctx.cuda_stream()), hold_stream, &hold_ms), cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  g->all_reduce(x.view().data, 1024, transport::DType::kF32);  // enqueued behind the held stream
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  try {
    g->all_reduce(x.view().data, 1024, transport::DType::kF32);
    ADD_FAILURE() << "an all-reduce 900 ms behind a 300 ms deadline was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find("has not finished 300 ms after it was enqueued"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ranks 0"), std::string::npos) << e.what();
  }
  ctx.synchronize();  // the held stream ends; the aborted collective does not keep it
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  g.reset();  // destroying an aborted group returns
}

}  // namespace
}  // namespace trellis::transport

int main(int argc, char** argv) { return trellis::test::gpu_test_main(argc, argv); }
