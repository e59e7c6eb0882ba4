// The kernels' progress hook (kernels/progress_hook.hpp) and cooperative progress
// (ProgressThread::poll): the hook is called from inside matmuls (GEMM and GEMV paths) on the
// installing thread only, never after its scope, and does not change the results; poll()
// tests driven requests at most every interval, without a background thread, and keeps
// errors for the owner.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/kernels/progress_hook.hpp"
#include "trellis/transport/progress.hpp"

using namespace trellis;

namespace {

struct HookLog {
  std::thread::id owner = std::this_thread::get_id();
  std::atomic<int> calls{0}, foreign{0};
};

void count_call(void* arg) noexcept {
  auto* log = static_cast<HookLog*>(arg);
  ++log->calls;
  if (std::this_thread::get_id() != log->owner) ++log->foreign;
}

// y = x w^T with deterministic inputs; returns y.
std::vector<float> run_matmul(const kernels::Context& ctx, std::int64_t m, std::int64_t n, std::int64_t k,
                              kernels::MatmulAlgo algo) {
  std::vector<float> x(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(n * k)), y(static_cast<std::size_t>(m * n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7) % 13) / 13.0f - 0.5f;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 5) % 11) / 11.0f - 0.5f;
  kernels::matmul(ctx, kernels::TensorView::matrix(x.data(), kernels::DType::kF32, m, k),
                  kernels::TensorView::matrix(w.data(), kernels::DType::kF32, n, k),
                  kernels::TensorView::matrix(y.data(), kernels::DType::kF32, m, n), {0.0f, algo});
  return y;
}

TEST(ProgressHook, CalledInsideMatmulOnTheInstallingThreadOnly) {
  for (int threads : {1, 2}) {
    kernels::Context ctx(threads);
    for (auto [m, algo] : {std::pair{64, kernels::MatmulAlgo::kGemm}, std::pair{2, kernels::MatmulAlgo::kGemv}}) {
      const auto want = run_matmul(ctx, m, 1024, 512, algo);
      HookLog log;
      std::vector<float> got;
      {
        kernels::ScopedProgressHook hook(&count_call, &log);
        got = run_matmul(ctx, m, 1024, 512, algo);
      }
      // GEMM: after each 12-row block of each 512 x 256 weight block (AVX-512 builds; the
      // OpenBLAS fallback polls once per call); GEMV: every 256 weight rows.
      EXPECT_GE(log.calls.load(), 1) << "m=" << m << " threads=" << threads;
      EXPECT_EQ(log.foreign.load(), 0) << "a pool worker called the hook";
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << "m=" << m;
      const int after = log.calls.load();
      run_matmul(ctx, m, 1024, 512, algo);
      EXPECT_EQ(log.calls.load(), after) << "called after its scope ended";
    }
  }
}

TEST(ProgressHook, ScopesNestAndRestore) {
  HookLog a, b;
  EXPECT_EQ(kernels::progress_hook().fn, nullptr);
  {
    kernels::ScopedProgressHook ha(&count_call, &a);
    {
      kernels::ScopedProgressHook hb(&count_call, &b);
      kernels::poll_progress();
    }
    kernels::poll_progress();
  }
  kernels::poll_progress();
  EXPECT_EQ(a.calls.load(), 1);
  EXPECT_EQ(b.calls.load(), 1);
  EXPECT_EQ(kernels::progress_hook().fn, nullptr);
}

// Completes on its `need`-th test().
class CountingRequest final : public transport::Request {
 public:
  CountingRequest(int need, int& tests, bool fail = false) : need_(need), tests_(tests), fail_(fail) {}
  bool test() override {
    const int n = ++tests_;
    if (n >= need_ && fail_) throw Error(ErrorCode::kPeerFailed, "peer 1 went away");
    return n >= need_;
  }
  std::size_t bytes() const override { return 8; }
  std::string describe() const override { return "counting request"; }

 private:
  int need_;
  int& tests_;
  bool fail_;
};

transport::ProgressOptions cooperative_only(std::chrono::microseconds every) {
  transport::ProgressOptions o;
  o.enabled = false;
  o.cooperative = true;
  o.cooperative_interval = every;
  return o;
}

TEST(CooperativeProgress, PollDrivesWithoutAThread) {
  transport::ProgressThread p(cooperative_only(std::chrono::microseconds(0)));
  int tests = 0;
  auto r = p.drive(std::make_unique<CountingRequest>(5, tests));
  for (int i = 0; i < 4; ++i) p.poll();
  EXPECT_EQ(tests, 4);
  p.poll();
  EXPECT_EQ(tests, 5);
  EXPECT_TRUE(r->test());  // completed by poll(): no further inner test
  EXPECT_EQ(tests, 5);
  p.poll();                // nothing outstanding: no test
  EXPECT_EQ(tests, 5);
  EXPECT_EQ(p.cooperative_tests(), 5u);
  EXPECT_EQ(p.background_tests(), 0u);
}

TEST(CooperativeProgress, PollRespectsTheInterval) {
  transport::ProgressThread p(cooperative_only(std::chrono::hours(1)));
  int tests = 0;
  auto r = p.drive(std::make_unique<CountingRequest>(100, tests));
  for (int i = 0; i < 50; ++i) p.poll();
  EXPECT_EQ(tests, 1);  // the first poll after drive() tests at once, then not for an hour
  auto r2 = p.drive(std::make_unique<CountingRequest>(100, tests));
  p.poll();             // a new request: both tested once more
  EXPECT_EQ(tests, 3);
}

TEST(CooperativeProgress, ErrorsReachTheOwnerAndHookTrampolineWorks) {
  transport::ProgressThread p(cooperative_only(std::chrono::microseconds(0)));
  int tests = 0;
  auto r = p.drive(std::make_unique<CountingRequest>(2, tests, true));
  {
    kernels::ScopedProgressHook hook(&transport::ProgressThread::poll_hook, &p);
    kernels::poll_progress();
    EXPECT_NO_THROW(kernels::poll_progress());  // the error is kept, not thrown into the kernel
  }
  EXPECT_EQ(tests, 2);
  try {
    r->test();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed);
  }
}

TEST(CooperativeProgress, OffMeansPollDoesNothing) {
  transport::ProgressOptions o;
  o.enabled = false;
  o.cooperative = false;
  transport::ProgressThread p(o);
  int tests = 0;
  auto inner = std::make_unique<CountingRequest>(3, tests);
  transport::Request* raw = inner.get();
  auto r = p.drive(std::move(inner));
  EXPECT_EQ(r.get(), raw);
  p.poll();
  EXPECT_EQ(tests, 0);
}

TEST(CooperativeProgress, DroppedRequestIsForgotten) {
  transport::ProgressThread p(cooperative_only(std::chrono::microseconds(0)));
  int tests = 0;
  { auto r = p.drive(std::make_unique<CountingRequest>(1 << 30, tests)); }
  p.poll();
  EXPECT_EQ(tests, 0);
}

}  // namespace
