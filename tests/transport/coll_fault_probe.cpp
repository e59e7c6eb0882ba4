// For coll_fault_dead_rank.sh: a shm all-reduce group of every rank (one host); after a few
// operations rank --die-rank sleeps --die-ms and kills itself (SIGKILL: it marks nothing in
// the segment and wakes nobody) while the others wait in the next all-reduce, long enough to
// have blocked on the segment's futex. Each survivor writes OUT/rank<R>.txt:
// "fail <seconds> <parks> <message>" (seconds from the start of the all-reduce, parks: how
// often it blocked) or "ok", and exits 3 on failure.
//
// Usage: coll_fault_probe DEADLINE_MS OUT_DIR DIE_RANK DIE_MS
#include <mpi.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "src/wait.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"

using namespace trellis;
using namespace trellis::transport;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s DEADLINE_MS OUT_DIR DIE_RANK DIE_MS\n", argv[0]);
    return 2;
  }
  const long deadline_ms = std::stol(argv[1]);
  const std::string out = argv[2];
  const int die_rank = std::stoi(argv[3]);
  const long die_ms = std::stol(argv[4]);
  auto world = make_mpi_bootstrap();
  const int me = world->rank();
  std::vector<int> members(static_cast<std::size_t>(world->size()));
  std::iota(members.begin(), members.end(), 0);
  GroupOptions o;
  o.algorithm = Algorithm::kShm;
  o.deadline = Millis(deadline_ms);
  auto g = make_group(*world, members, o, Config{});
  std::vector<float> v(1 << 18, 1.0f);
  for (int i = 0; i < 5; ++i) g->all_reduce(v.data(), v.size(), DType::kF32);
  world->barrier(Deadline::after_ms(deadline_ms));
  if (me == die_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(die_ms));
    raise(SIGKILL);
  }
  const auto parks = detail::park_count();
  auto start = Clock::now();
  auto report = [&](const std::string& line) { std::ofstream(out + "/rank" + std::to_string(me) + ".txt") << line << "\n"; };
  try {
    g->all_reduce(v.data(), v.size(), DType::kF32);
    report("ok");
    return 0;
  } catch (const Error& e) {
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "rank %d: failed after %.2f s: %s\n", me, secs, e.what());
    report("fail " + std::to_string(secs) + " " + std::to_string(detail::park_count() - parks) + " " + e.what());
    g.reset();
    std::_Exit(3);  // no MPI_Finalize: a peer is gone
  }
}
