// Heartbeats between rank 0 and every other rank over MPI, for the MPI bootstrap's world
// collectives (private to transport/). A collective that waits cannot tell a slow rank (a
// big shard still loading) from a rank behind a cut link or a stopped one; a heartbeat sent
// from a thread of its own can: it keeps coming while a rank is busy and stops when the rank
// or its link is gone. Star-shaped (rank 0 <-> each rank), so it costs 2 (N-1) messages of
// 8 bytes per interval in a job of N ranks.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace trellis::transport::detail {

class MpiHeartbeat {
 public:
  // Starts the thread; `comm` must allow MPI_THREAD_MULTIPLE. The thread also stops at the
  // start of MPI_Finalize (an attribute on MPI_COMM_SELF), for a process whose MPI is
  // finalised by someone else (the test harness) before this object goes.
  MpiHeartbeat(MPI_Comm comm, int rank, int size, std::chrono::milliseconds silence);
  ~MpiHeartbeat();  // stops and joins the thread; sends still in flight are left to MPI
  MpiHeartbeat(const MpiHeartbeat&) = delete;
  MpiHeartbeat& operator=(const MpiHeartbeat&) = delete;

  void set_silence(std::chrono::milliseconds silence);
  std::chrono::milliseconds silence() const { return std::chrono::milliseconds(silence_ms_.load()); }

  struct Silent {
    int rank;
    double seconds;  // since its last heartbeat
  };
  // Among the ranks this one hears from (rank 0: all; others: rank 0), those heard from at
  // least once and silent for longer than silence() + extra. A rank never heard from is not
  // counted: it may still be starting, and the collective's own deadline covers it.
  std::vector<Silent> silent(std::chrono::milliseconds extra = std::chrono::milliseconds(0)) const;
  // Seconds since `rank`'s last heartbeat; negative when never heard from.
  double quiet_for(int rank) const;
  // The gap between two heartbeats of a live rank.
  std::chrono::milliseconds interval() const;

 private:
  void loop();
  void halt();  // stops and joins the thread; idempotent, from the owning thread
  static int on_finalize(MPI_Comm, int, void* attr, void*);

  MPI_Comm comm_;
  int rank_, size_;
  std::atomic<std::int64_t> silence_ms_;
  std::unique_ptr<std::atomic<std::int64_t>[]> last_ns_;  // per rank; 0: never heard
  std::atomic<bool> stop_{false};
  std::thread thread_;
  int keyval_ = MPI_KEYVAL_INVALID;
};

}  // namespace trellis::transport::detail
