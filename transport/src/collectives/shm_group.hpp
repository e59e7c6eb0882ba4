// The in-host shared-memory Group: its segment layout and the group object, shared by the
// copying operations (shm_group.cpp: the pipeline of pieces through the slot ring) and the
// zero-copy all-reduce on registered windows (shm_window.cpp). The algorithm is described
// at the top of shm_group.cpp.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "src/collectives/futex.hpp"
#include "src/collectives/internal.hpp"
#include "src/collectives/shm_segment.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/process.hpp"

namespace trellis::transport::detail::shm {

inline constexpr std::uint64_t kMagic = 0x7472656c6c697333ull;  // "trellis3": ring of K slots, futex word
inline constexpr std::size_t kLine = 64;

struct alignas(kLine) Flag {
  std::atomic<std::uint64_t> value;
};
static_assert(sizeof(Flag) == kLine && std::atomic<std::uint64_t>::is_always_lock_free);

struct alignas(kLine) Header {
  std::uint64_t magic;
  std::uint64_t size;
  std::uint64_t slot_bytes;
  std::uint64_t slots;
  std::atomic<std::int64_t> failed;  // world rank + 1 of a member that gave up; 0: none
  char reason[256];                  // its error, written before `failed`
  // Each member's pid (group ranks below kPidMembers; 0: not attached), so a wait can tell
  // a dead member, which never moves its flags again, from a slow one.
  std::atomic<std::int64_t> pid[64];
  // Members blocked (or about to block) in park(), and the futex word they block on. Own
  // lines: `waiters` is read by every publish, `epoch` written only when someone waits.
  alignas(kLine) std::atomic<std::uint32_t> waiters;
  alignas(kLine) std::atomic<std::uint32_t> epoch;
};
inline constexpr int kPidMembers = 64;

enum class FlagKind { kArrive = 0, kDone = 1, kFinished = 2 };
inline constexpr std::size_t kFlagKinds = 3;

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

inline std::size_t segment_bytes(std::size_t p, std::size_t slot, std::size_t slots) {
  return sizeof(Header) + kFlagKinds * p * sizeof(Flag) + slots * p * slot;
}

enum class OpKind { kAllReduce, kBroadcast, kAllGather, kBarrier };

// A registered window (Group::allocate_window): its own segment, laid out as
//   WindowHeader | WindowLine[P] | region[P][stride]
// One line per member carries its progress through the zero-copy all-reduce (arrive, done:
// monotonic operation numbers) and the part of its region it passed (offset, count, dtype),
// which the peers check before reading it.
inline constexpr std::uint64_t kWindowMagic = 0x7472656c6c697377ull;  // "trellisw"
struct alignas(kLine) WindowHeader {
  std::uint64_t magic;
  std::uint64_t size;    // members
  std::uint64_t bytes;   // usable bytes per member
  std::uint64_t stride;  // bytes between two members' regions (page multiple)
};
struct alignas(kLine) WindowLine {
  std::atomic<std::uint64_t> arrive;  // operation w's data is in my region
  std::atomic<std::uint64_t> done;    // I wrote chunk me of operation w into every region
  std::uint64_t offset, count, dtype;  // operation `arrive`'s part of my region, written before it
};
static_assert(sizeof(WindowLine) == kLine);
inline constexpr std::size_t kPage = 4096;

struct ShmWindow {
  std::unique_ptr<ShmSegment> seg;
  WindowLine* lines = nullptr;
  std::byte* regions = nullptr;
  std::size_t bytes = 0, stride = 0;
  std::uint64_t seq = 0;  // operations on this window so far (the same on every member)
  std::byte* region(int r) const { return regions + static_cast<std::size_t>(r) * stride; }
};

class ShmGroup final : public AsyncGroup {
 public:
  ShmGroup(std::unique_ptr<ShmSegment> seg, std::vector<int> members, int rank, const GroupOptions& o)
      : seg_(std::move(seg)), members_(std::move(members)), rank_(rank), opts_(o) {
    header_ = reinterpret_cast<Header*>(seg_->base());
    flags_ = reinterpret_cast<Flag*>(seg_->base() + sizeof(Header));
    data_ = seg_->base() + sizeof(Header) + kFlagKinds * members_.size() * sizeof(Flag);
    if (rank_ < kPidMembers) header_->pid[rank_].store(::getpid(), std::memory_order_release);
  }
  ~ShmGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  std::string describe() const override { return "shm"; }
  Millis deadline() const override { return opts_.deadline; }
  const PollPolicy& wait_policy() const override { return opts_.wait; }

  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override;
  RequestPtr broadcast_async(void* data, std::size_t bytes, int root) override;
  RequestPtr all_gather_async(const void* in, void* out, std::size_t bytes) override;
  void barrier() override;
  std::span<std::byte> allocate_window(std::size_t bytes) override;  // shm_window.cpp

  // For ShmOp.
  std::atomic<std::uint64_t>& flag(FlagKind k, int r) const {
    return flags_[static_cast<std::size_t>(k) * members_.size() + static_cast<std::size_t>(r)].value;
  }
  std::uint64_t load(FlagKind k, int r) const { return flag(k, r).load(std::memory_order_acquire); }
  void publish(FlagKind k, std::uint64_t seq) const {
    flag(k, rank_).store(seq, std::memory_order_release);
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
  bool all_at_least(FlagKind k, std::uint64_t seq) const {
    for (int r = 0; r < size(); ++r)
      if (load(k, r) < seq) return false;
    return true;
  }
  std::byte* slot(std::uint64_t seq, int r) const {
    return data_ + ((seq % opts_.shm_slots) * members_.size() + static_cast<std::size_t>(r)) * opts_.shm_slot_bytes;
  }
  std::size_t slot_bytes() const { return opts_.shm_slot_bytes; }
  std::uint64_t slots() const { return opts_.shm_slots; }
  std::size_t one_shot_max() const { return opts_.one_shot_max_bytes; }
  bool parks() const { return opts_.shm_park; }
  // Reserves `pieces` consecutive sequence numbers and returns the first.
  std::uint64_t reserve(std::size_t pieces) {
    std::uint64_t first = seq_ + 1;
    seq_ += pieces;
    return first;
  }
  void check_peers() const {
    auto f = header_->failed.load(std::memory_order_acquire);
    if (f != 0)
      throw_error(ErrorCode::kPeerFailed, "shm group of world ranks {}: world rank {} gave up: {}",
                  list_ranks(members_), f - 1, std::string(header_->reason));
    // Liveness every ~100 ms of waiting; the clock is read once per 256 calls because a
    // clock read costs as much as a poll on this kind of VM.
    if ((++polls_ & 255) != 0) return;
    auto now = Clock::now();
    if (now - last_liveness_ < std::chrono::milliseconds(100)) return;
    last_liveness_ = now;
    for (int r = 0; r < std::min(size(), kPidMembers); ++r) {
      auto pid = header_->pid[r].load(std::memory_order_acquire);
      if (r != rank_ && !process_alive(pid))
        throw_error(ErrorCode::kPeerFailed, "{}: world rank {} (pid {}, same host) died", who(), members_[r], pid);
    }
  }
  void mark_failed(const std::string& why) {
    std::int64_t expected = 0;
    // Only the first failure is recorded: it is the cause, the others are consequences.
    if (header_->failed.load() != 0) return;
    std::snprintf(header_->reason, sizeof(header_->reason), "%s", why.c_str());
    header_->failed.compare_exchange_strong(expected, members_[rank_] + 1, std::memory_order_release);
    wake();  // the peers blocked in park() must see it now, not after their slice
  }
  // One operation in flight per group: a new one first completes the previous one.
  void begin(SteppedRequest* op) {
    if (active_ != nullptr) wait_stepped(*active_, Deadline::after(opts_.deadline), opts_.wait);
    active_ = op;
  }
  void end(SteppedRequest* op) {
    if (active_ == op) active_ = nullptr;
  }
  // The window that holds all of [data, data + bytes) in this rank's region, and the offset.
  ShmWindow* find_window(const void* data, std::size_t bytes, std::size_t& offset) const;
  // A release store of a window flag, waking parked peers like publish() (shm_window.cpp).
  void publish_word(std::atomic<std::uint64_t>& word, std::uint64_t value) const {
    word.store(value, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (header_->waiters.load(std::memory_order_relaxed) != 0) wake();
  }
  std::string who() const { return "shm group of world ranks " + list_ranks(members_); }

 private:
  std::unique_ptr<ShmSegment> seg_;
  std::vector<int> members_;
  int rank_;
  GroupOptions opts_;
  Header* header_ = nullptr;
  Flag* flags_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t seq_ = 0;
  SteppedRequest* active_ = nullptr;
  std::vector<std::unique_ptr<ShmWindow>> windows_;
  RequestPtr window_all_reduce(ShmWindow& w, std::size_t offset, std::size_t count, DType dtype);
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
  explicit ShmRequest(ShmGroup& g) : g_(g) {}

  bool test() final {
    if (complete_) return true;
    try {
      while (step()) {
        ++steps_;
        if (finished()) {
          complete_ = true;
          g_.end(this);
          return true;
        }
      }
      g_.check_peers();
      return false;
    } catch (const Error& e) {
      g_.mark_failed(e.what());
      complete_ = true;  // failed: the peers have been told; nothing left to abandon
      g_.end(this);
      throw;
    }
  }
  std::uint64_t steps_done() const final { return steps_; }
  bool park(Clock::duration max) final {
    if (complete_ || !g_.parks()) return false;
    g_.park([this] { return movable(); }, max);
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
    if (!complete_) g_.mark_failed(fmt::format("it abandoned {}", describe()));
    g_.end(this);
  }
  bool complete() const { return complete_; }

  ShmGroup& g_;

 private:
  bool complete_ = false;
  std::uint64_t steps_ = 0;
};

}  // namespace trellis::transport::detail::shm
