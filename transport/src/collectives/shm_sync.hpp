// What every in-host shared-memory operation of a group synchronises on, whatever it moves:
// the group segment's failure record, each member's pid, the futex word a waiting member
// blocks on, and the rule of one operation in flight. The copying pipeline (shm_group.cpp)
// and the zero-copy all-reduce on registered windows (shm_window.cpp) both build on it and
// on nothing of each other's.
//
// Publishing: a flag is stored (release) and followed by a full fence; a member that is
// about to block announces itself in `waiters` and fences likewise, so either the waiter
// sees the flag before it blocks or the publisher sees the waiter and wakes it (no lost
// wake-up). A park also ends after detail::kParkSlice, for the liveness checks and the
// deadline.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/collectives/futex.hpp"
#include "src/collectives/internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/collectives.hpp"

namespace trellis::transport::detail::shm {

inline constexpr std::size_t kLine = 64;
inline constexpr int kPidMembers = 64;

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// The synchronisation part of a group segment's header (zero-initialised by the creator).
struct alignas(kLine) SyncHeader {
  std::atomic<std::int64_t> failed;  // world rank + 1 of a member that gave up; 0: none
  char reason[256];                  // its error, written before `failed`
  // Each member's pid (group ranks below kPidMembers; 0: not attached), so a wait can tell
  // a dead member, which never moves its flags again, from a slow one.
  std::atomic<std::int64_t> pid[kPidMembers];
  // Members blocked (or about to block) in park(), and the futex word they block on. Own
  // lines: `waiters` is read by every publish, `epoch` written only when someone waits.
  alignas(kLine) std::atomic<std::uint32_t> waiters;
  alignas(kLine) std::atomic<std::uint32_t> epoch;
};

// One member's view of a SyncHeader: this rank's group index among `members` (world ranks).
// Records this process's pid on construction; marks the segment failed on destruction when
// an operation is still in flight (its request, which must not outlive the group, would
// otherwise touch freed memory). Not copyable; one thread at a time, like the group.
class ShmSync {
 public:
  // Of `o`, the deadline and wait policy (begin()) and shm_park (ShmRequest::park) count.
  ShmSync(SyncHeader* header, std::vector<int> members, int rank, const GroupOptions& o);
  ~ShmSync();
  ShmSync(const ShmSync&) = delete;
  ShmSync& operator=(const ShmSync&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }
  const GroupOptions& options() const { return opts_; }
  std::string who() const { return "shm group of world ranks " + list_ranks(members_); }

  // A release store of a progress flag in shared memory, waking parked peers.
  void publish(std::atomic<std::uint64_t>& word, std::uint64_t value) const {
    word.store(value, std::memory_order_release);
    // Pairs with the fence in park(): a waiter that did not see this store is seen here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (header_->waiters.load(std::memory_order_relaxed) != 0) wake();
  }
  void wake() const {
    header_->epoch.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_shared(&header_->epoch);
  }
  // Blocks until a member publishes or fails, or `max` passed, unless `movable()` already
  // holds after this rank announced itself (then the publish it sees came first).
  template <typename Movable>
  void park(Movable&& movable, Clock::duration max) {
    header_->waiters.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t epoch = header_->epoch.load(std::memory_order_seq_cst);
    if (!movable() && header_->failed.load(std::memory_order_acquire) == 0)
      futex_wait_shared(&header_->epoch, epoch, max);
    header_->waiters.fetch_sub(1, std::memory_order_seq_cst);
    polls_ |= 255;  // the next check_peers reads the clock: a dead peer wakes nobody
  }
  // Throws kPeerFailed when a member gave up (marked the segment) or, checked every ~100 ms
  // of waiting, died (its pid is gone). Called on every idle test: the clock is read once
  // per 256 calls because a clock read costs as much as a poll on this kind of VM.
  void check_peers() const {
    if (header_->failed.load(std::memory_order_acquire) != 0) throw_gave_up();
    if ((++polls_ & 255) != 0) return;
    check_liveness();
  }
  // Records this rank's failure for the peers (only the first failure of the group is kept:
  // it is the cause, the others are consequences) and wakes them.
  void mark_failed(const std::string& why);
  // One operation in flight per group: a new one first completes the previous one.
  void begin(SteppedRequest* op);
  void end(SteppedRequest* op) {
    if (active_ == op) active_ = nullptr;
  }

 private:
  [[noreturn]] void throw_gave_up() const;
  void check_liveness() const;

  SyncHeader* header_;
  std::vector<int> members_;
  int rank_;
  GroupOptions opts_;
  SteppedRequest* active_ = nullptr;
  mutable std::uint64_t polls_ = 0;
  mutable Clock::time_point last_liveness_ = Clock::now();
};

// The life cycle every shm operation shares (the copying pipeline and the window
// all-reduce): test() makes steps until none can move or the operation finished, and checks
// the peers while idle; a failure marks the segment so that the peers fail at once, naming
// this rank; an operation destroyed unfinished marks it too (abandon(), which each derived
// destructor calls: describe() is virtual).
class ShmRequest : public SteppedRequest {
 public:
  explicit ShmRequest(ShmSync& sync) : sync_(sync) {}

  bool test() final {
    if (complete_) return true;
    try {
      while (step()) {
        ++steps_;
        if (finished()) {
          complete_ = true;
          sync_.end(this);
          return true;
        }
      }
      sync_.check_peers();
      return false;
    } catch (const Error& e) {
      sync_.mark_failed(e.what());
      complete_ = true;  // failed: the peers have been told; nothing left to abandon
      sync_.end(this);
      throw;
    }
  }
  std::uint64_t steps_done() const final { return steps_; }
  bool park(Clock::duration max) final {
    if (complete_ || !sync_.options().shm_park) return false;
    sync_.park([this] { return movable(); }, max);
    return true;
  }

 protected:
  // One step (a phase of a piece); false when nothing can move now.
  virtual bool step() = 0;
  // Whether the steps so far finished the operation.
  virtual bool finished() const = 0;
  // Whether step() would move now (the park condition).
  virtual bool movable() const = 0;
  void abandon() {
    if (!complete_) sync_.mark_failed(fmt::format("it abandoned {}", describe()));
    sync_.end(this);
  }
  bool complete() const { return complete_; }

  ShmSync& sync_;

 private:
  bool complete_ = false;
  std::uint64_t steps_ = 0;
};

}  // namespace trellis::transport::detail::shm
