// main() for multi-rank tests, run by mpiexec through CTest.
//
// * After each test every rank contributes pass/fail to an allreduce; a test that failed on
//   any rank fails on every rank, and rank 0 names the ranks it failed on. Without this a
//   failure on rank 3 would be invisible in rank 0's output, which is the one people read.
// * Only rank 0 prints GoogleTest's normal output; other ranks print their own failed
//   assertions, prefixed with the rank, and nothing else.
// * The final exit code is the same on every rank.
//
// Tests reach MPI_COMM_WORLD directly or through trellis::transport::Bootstrap; they must
// run the same tests in the same order on every rank (GTEST_SKIP alike everywhere).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

class CombineResults : public testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (world_rank() != 0 && r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", world_rank(),
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    int mine = info.result()->Failed() ? 1 : 0;
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<int> all(static_cast<std::size_t>(size));
    MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    std::string failed_on;
    for (int r = 0; r < size; ++r)
      if (all[r]) failed_on += (failed_on.empty() ? "" : ",") + std::to_string(r);
    if (!failed_on.empty()) {
      any_failed_ = true;
      if (world_rank() == 0) {
        std::fprintf(stderr, "[MPI] %s.%s failed on rank(s) %s\n", info.test_suite_name(), info.name(),
                     failed_on.c_str());
      }
    }
  }
  bool any_failed() const { return any_failed_; }

 private:
  bool any_failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  testing::InitGoogleTest(&argc, argv);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
  auto* combine = new CombineResults;
  listeners.Append(combine);
  int rc = RUN_ALL_TESTS();
  int mine = (rc != 0 || combine->any_failed()) ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
