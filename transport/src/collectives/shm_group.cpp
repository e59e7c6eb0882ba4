// The in-host shared-memory Group (see collectives.hpp for the algorithm).
//
// Segment layout: Header | arrive[P] | done[P] | finished[P] | slots[K][P ranks][slot_bytes].
// Every operation is cut into pieces of at most slot_bytes per rank; piece number s (a
// sequence number shared by all members, since they issue the same operations in the same
// order) uses ring slot s % K. Each piece goes through three phases on every rank, each
// ending with a monotonic flag store (release):
//   fill   — copy what the peers need into this rank's slot       -> arrive[me] = s
//   reduce — two-shot all-reduce only: sum this rank's chunk       -> done[me] = s
//   drain  — read the peers' slots into the caller's buffer        -> finished[me] = s
// A rank may write into ring slot s % K only when every member has finished piece s - K,
// the last user of that slot: that single rule makes the slots safe without any lock, and
// it is the only thing that ties pieces together. Nothing else waits for the whole group,
// so a rank fills piece s+1 while its peers still reduce piece s and drains piece s-1 when
// it would otherwise idle; with small pieces (cache-sized) the ring of slots stays in the
// caches and the caller's buffer is streamed through once.
//
// A rank that has spun and yielded without its peers moving blocks on the header's `epoch`
// futex word (ShmGroup::park) after announcing itself in `waiters`; every publish that sees
// a waiter bumps the epoch and wakes them all. The announcement and the publisher's check
// are each followed by a full fence, so either the waiter sees the new flag before blocking
// or the publisher sees the waiter and wakes it (no lost wake-up); a park also ends after
// detail::kParkSlice, for the liveness checks and the deadline.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include <spdlog/spdlog.h>

#include "src/collectives/futex.hpp"
#include "src/collectives/internal.hpp"
#include "src/collectives/shm_segment.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/process.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport {
namespace {

constexpr std::uint64_t kMagic = 0x7472656c6c697333ull;  // "trellis3": ring of K slots, futex word
constexpr std::size_t kLine = 64;

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
constexpr int kPidMembers = 64;

enum class FlagKind { kArrive = 0, kDone = 1, kFinished = 2 };
constexpr std::size_t kFlagKinds = 3;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::size_t segment_bytes(std::size_t p, std::size_t slot, std::size_t slots) {
  return sizeof(Header) + kFlagKinds * p * sizeof(Flag) + slots * p * slot;
}

enum class OpKind { kAllReduce, kBroadcast, kAllGather, kBarrier };

class ShmOp;

class ShmGroup final : public detail::AsyncGroup {
 public:
  ShmGroup(std::unique_ptr<detail::ShmSegment> seg, std::vector<int> members, int rank, const GroupOptions& o)
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
    detail::futex_wake_shared(&header_->epoch);
  }
  // Blocks until a member publishes or fails, or `max` passed, unless `movable()` already
  // holds after this rank announced itself (then the publish it sees came first).
  template <typename Movable>
  void park(Movable&& movable, Clock::duration max) {
    header_->waiters.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t epoch = header_->epoch.load(std::memory_order_seq_cst);
    if (!movable() && header_->failed.load(std::memory_order_acquire) == 0)
      detail::futex_wait_shared(&header_->epoch, epoch, max);
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
                  detail::list_ranks(members_), f - 1, std::string(header_->reason));
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
  void begin(ShmOp* op);
  void end(ShmOp* op) {
    if (active_ == op) active_ = nullptr;
  }
  std::string who() const { return "shm group of world ranks " + detail::list_ranks(members_); }

 private:
  std::unique_ptr<detail::ShmSegment> seg_;
  std::vector<int> members_;
  int rank_;
  GroupOptions opts_;
  Header* header_ = nullptr;
  Flag* flags_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t seq_ = 0;
  ShmOp* active_ = nullptr;
  mutable std::uint64_t polls_ = 0;
  mutable Clock::time_point last_liveness_ = Clock::now();
};

// One collective, as a pipeline of pieces (see the file comment for the phases and the rule).
// filled_ >= reduced_ >= drained_ count the pieces that passed each phase on this rank.
class ShmOp final : public detail::SteppedRequest {
 public:
  ShmOp(ShmGroup& g, OpKind kind, void* data, const void* in, std::size_t total, DType dtype, int root)
      : g_(g), kind_(kind), data_(static_cast<std::byte*>(data)), in_(static_cast<const std::byte*>(in)),
        total_(total), dtype_(dtype), root_(root) {
    esize_ = kind == OpKind::kAllReduce ? dtype_size(dtype) : 1;
    per_piece_ = g.slot_bytes() / esize_;
    pieces_ = kind == OpKind::kBarrier ? 1 : (total_ + per_piece_ - 1) / per_piece_;
    srcs_.resize(static_cast<std::size_t>(g.size()));
    g_.begin(this);
    first_ = g_.reserve(pieces_);
  }
  ~ShmOp() override {
    if (!complete_) g_.mark_failed(fmt::format("it abandoned {}", describe()));
    g_.end(this);
  }

  bool test() override {
    if (complete_) return true;
    try {
      while (advance()) {
        ++steps_;
        if (drained_ == pieces_) {
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
  std::size_t bytes() const override { return total_ * esize_; }
  std::string describe() const override;
  std::uint64_t steps_done() const override { return steps_; }
  bool park(Clock::duration max) override {
    if (complete_ || !g_.parks()) return false;
    g_.park([this] { return movable(); }, max);
    return true;
  }

 private:
  struct Piece {
    std::uint64_t seq;
    std::size_t off, n;  // elements (all-reduce) or bytes of this piece
    bool two_shot;
  };
  struct Range {
    std::size_t lo, hi;
  };
  Piece piece(std::size_t i) const {
    Piece p{first_ + i, i * per_piece_, std::min(per_piece_, total_ - std::min(total_, i * per_piece_)), false};
    p.two_shot = kind_ == OpKind::kAllReduce && g_.size() > 1 && p.n * esize_ > g_.one_shot_max();
    return p;
  }
  // Two-shot: rank r reduces chunk r, whole cache lines, so no two ranks write one line.
  Range chunk(const Piece& p, int r) const {
    std::size_t c = round_up((p.n + g_.size() - 1) / g_.size(), kLine / esize_);
    std::size_t lo = std::min(p.n, c * static_cast<std::size_t>(r));
    return {lo, std::min(p.n, lo + c)};
  }
  std::byte* user(const Piece& p, std::size_t at) const { return data_ + (p.off + at) * esize_; }

  bool advance();  // one phase of one piece; false when nothing can move now
  bool movable() const;  // whether advance() would move
  bool fill_ready(const Piece& p) const {
    return p.seq <= g_.slots() || g_.all_at_least(FlagKind::kFinished, p.seq - g_.slots());
  }
  bool reduce_ready(const Piece& p) const { return !p.two_shot || g_.all_at_least(FlagKind::kArrive, p.seq); }
  bool drain_ready(const Piece& p) const;
  void fill(const Piece& p);
  void reduce(const Piece& p);
  void drain(const Piece& p);
  std::vector<int> waiting_for() const;

  ShmGroup& g_;
  OpKind kind_;
  std::byte* data_;
  const std::byte* in_;
  std::size_t total_;  // elements (all-reduce) or bytes
  DType dtype_;
  int root_;
  std::size_t esize_, per_piece_, pieces_;
  std::uint64_t first_ = 0;
  std::size_t filled_ = 0, reduced_ = 0, drained_ = 0;
  bool complete_ = false;
  std::uint64_t steps_ = 0;
  std::vector<const void*> srcs_;  // one per member, for the sums
};

void ShmGroup::begin(ShmOp* op) {
  if (active_ != nullptr) detail::wait_stepped(*active_, Deadline::after(opts_.deadline), opts_.wait);
  active_ = op;
}

ShmGroup::~ShmGroup() {
  // An operation still in flight when the group goes is abandoned; its request (which must
  // not outlive us) would otherwise touch freed memory.
  if (active_ != nullptr) mark_failed("its group was destroyed during an operation");
}

// What the peers wait for comes first: my reduced chunk, then my arrival; my own drain only
// when neither can move (it also frees the slot ring for the fills K pieces ahead).
bool ShmOp::advance() {
  if (reduced_ < filled_) {
    Piece p = piece(reduced_);
    if (reduce_ready(p)) {
      reduce(p);
      ++reduced_;
      return true;
    }
  }
  if (filled_ < pieces_) {
    Piece p = piece(filled_);
    if (fill_ready(p)) {
      fill(p);
      ++filled_;
      return true;
    }
  }
  if (drained_ < reduced_) {
    Piece p = piece(drained_);
    if (drain_ready(p)) {
      drain(p);
      ++drained_;
      return true;
    }
  }
  return false;
}

bool ShmOp::movable() const {
  return (reduced_ < filled_ && reduce_ready(piece(reduced_))) || (filled_ < pieces_ && fill_ready(piece(filled_))) ||
         (drained_ < reduced_ && drain_ready(piece(drained_)));
}

bool ShmOp::drain_ready(const Piece& p) const {
  switch (kind_) {
    case OpKind::kAllReduce:
      return g_.all_at_least(p.two_shot ? FlagKind::kDone : FlagKind::kArrive, p.seq);
    case OpKind::kBroadcast: return g_.rank() == root_ || g_.load(FlagKind::kArrive, root_) >= p.seq;
    case OpKind::kAllGather:
    case OpKind::kBarrier: return g_.all_at_least(FlagKind::kArrive, p.seq);
  }
  return false;
}

void ShmOp::fill(const Piece& p) {
  const int me = g_.rank();
  std::byte* mine = g_.slot(p.seq, me);
  switch (kind_) {
    case OpKind::kAllReduce:
      if (p.two_shot) {
        // Only the chunks the peers reduce: my own chunk is read from my buffer.
        Range c = chunk(p, me);
        std::memcpy(mine, user(p, 0), c.lo * esize_);
        std::memcpy(mine + c.hi * esize_, user(p, c.hi), (p.n - c.hi) * esize_);
      } else {
        std::memcpy(mine, user(p, 0), p.n * esize_);
      }
      break;
    case OpKind::kAllGather: std::memcpy(mine, in_ + p.off, p.n); break;
    case OpKind::kBroadcast:
      if (me == root_) std::memcpy(mine, user(p, 0), p.n);
      break;
    case OpKind::kBarrier: break;
  }
  g_.publish(FlagKind::kArrive, p.seq);
}

// Chunk me of every slot, in rank order (my own contribution straight from my buffer), into
// my buffer and into my slot, where the peers copy it from.
void ShmOp::reduce(const Piece& p) {
  if (p.two_shot) {
    const int n = g_.size(), me = g_.rank();
    Range c = chunk(p, me);
    if (c.hi > c.lo) {
      for (int r = 0; r < n; ++r) srcs_[r] = r == me ? user(p, c.lo) : g_.slot(p.seq, r) + c.lo * esize_;
      detail::sum_into(dtype_, srcs_.data(), n, user(p, c.lo), c.hi - c.lo, g_.slot(p.seq, me) + c.lo * esize_);
    }
  }
  g_.publish(FlagKind::kDone, p.seq);
}

void ShmOp::drain(const Piece& p) {
  const int n = g_.size(), me = g_.rank();
  switch (kind_) {
    case OpKind::kAllReduce:
      if (p.two_shot) {
        for (int r = 0; r < n; ++r) {
          Range c = chunk(p, r);
          if (r != me && c.hi > c.lo)
            std::memcpy(user(p, c.lo), g_.slot(p.seq, r) + c.lo * esize_, (c.hi - c.lo) * esize_);
        }
      } else {
        for (int r = 0; r < n; ++r) srcs_[r] = r == me ? user(p, 0) : g_.slot(p.seq, r);
        detail::sum_into(dtype_, srcs_.data(), n, user(p, 0), p.n);
      }
      break;
    case OpKind::kAllGather:
      for (int r = 0; r < n; ++r) std::memcpy(data_ + r * total_ + p.off, g_.slot(p.seq, r), p.n);
      break;
    case OpKind::kBroadcast:
      if (me != root_) std::memcpy(user(p, 0), g_.slot(p.seq, root_), p.n);
      break;
    case OpKind::kBarrier: break;
  }
  g_.publish(FlagKind::kFinished, p.seq);
}

// The members the first blocked phase waits for.
std::vector<int> ShmOp::waiting_for() const {
  std::vector<int> missing;
  auto need = [&](FlagKind k, std::uint64_t s) {
    for (int r = 0; r < g_.size(); ++r)
      if (g_.load(k, r) < s) missing.push_back(g_.members()[r]);
  };
  if (drained_ < reduced_) {
    Piece p = piece(drained_);
    if (kind_ == OpKind::kBroadcast) {
      if (g_.load(FlagKind::kArrive, root_) < p.seq) missing.push_back(g_.members()[root_]);
    } else {
      need(p.two_shot ? FlagKind::kDone : FlagKind::kArrive, p.seq);
    }
  } else if (reduced_ < filled_) {
    need(FlagKind::kArrive, piece(reduced_).seq);
  } else if (filled_ < pieces_) {
    need(FlagKind::kFinished, piece(filled_).seq - std::min(piece(filled_).seq, g_.slots()));
  }
  return missing;
}

std::string ShmOp::describe() const {
  std::string what;
  switch (kind_) {
    case OpKind::kAllReduce: what = fmt::format("all-reduce of {} elements", total_); break;
    case OpKind::kBroadcast: what = fmt::format("broadcast of {} bytes from group rank {}", total_, root_); break;
    case OpKind::kAllGather: what = fmt::format("all-gather of {} bytes per rank", total_); break;
    case OpKind::kBarrier: what = "barrier"; break;
  }
  what += " over " + g_.who();
  if (!complete_) {
    auto missing = waiting_for();
    if (!missing.empty()) {
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      what += fmt::format(" (piece {} of {}), waiting for world rank(s) {}", drained_ + 1, pieces_,
                          detail::list_ranks(missing));
    }
  }
  return what;
}

// The first test() copies this rank's input in (up to K pieces) and publishes its arrival,
// so peers can go ahead while the caller computes.
RequestPtr kick(std::unique_ptr<ShmOp> op) {
  op->test();
  return op;
}

RequestPtr ShmGroup::all_reduce_async(void* data, std::size_t count, DType dtype) {
  if (count == 0 || size() == 1) return make_completed_request(count * dtype_size(dtype), "all-reduce over one rank");
  return kick(std::make_unique<ShmOp>(*this, OpKind::kAllReduce, data, nullptr, count, dtype, 0));
}

RequestPtr ShmGroup::broadcast_async(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size())
    throw_error(ErrorCode::kInvalidArgument, "broadcast root {} is not a rank of {}", root, who());
  if (bytes == 0 || size() == 1) return make_completed_request(bytes, "broadcast over one rank");
  return kick(std::make_unique<ShmOp>(*this, OpKind::kBroadcast, data, nullptr, bytes, DType::kF32, root));
}

RequestPtr ShmGroup::all_gather_async(const void* in, void* out, std::size_t bytes) {
  if (bytes == 0) return make_completed_request(0, "empty all-gather");
  if (size() == 1) {
    std::memcpy(out, in, bytes);
    return make_completed_request(bytes, "all-gather over one rank");
  }
  return kick(std::make_unique<ShmOp>(*this, OpKind::kAllGather, out, in, bytes, DType::kF32, 0));
}

void ShmGroup::barrier() {
  if (size() == 1) return;
  ShmOp op(*this, OpKind::kBarrier, nullptr, nullptr, 0, DType::kF32, 0);
  detail::wait_stepped(op, Deadline::after(opts_.deadline), opts_.wait);
}

std::atomic<std::uint64_t> g_segment_counter{0};

}  // namespace

std::unique_ptr<Group> make_shm_group(Bootstrap& world, const std::vector<int>& members, const GroupOptions& options) {
  const int me = world.rank();
  auto it = std::find(members.begin(), members.end(), me);
  const bool member = it != members.end();
  const int my_index = member ? static_cast<int>(it - members.begin()) : -1;
  if (options.shm_slots < 2)
    throw_error(ErrorCode::kInvalidArgument, "shm collectives need at least 2 ring slots (comm.coll_shm_slots), got {}",
                options.shm_slots);
  const std::size_t slot = round_up(options.shm_slot_bytes, kLine);
  const std::size_t bytes = segment_bytes(members.size(), slot, options.shm_slots);
  auto deadline = Deadline::after(options.deadline);
  GroupOptions o = options;
  o.shm_slot_bytes = slot;

  // The leader creates the segment and publishes its name; the others map it by that name.
  std::unique_ptr<detail::ShmSegment> seg;
  std::string error, name;
  if (my_index == 0) {
    name = fmt::format("/trellis-coll-{}-{}", getpid(), g_segment_counter++);
    try {
      seg = detail::ShmSegment::create(name, bytes);
      auto* h = new (seg->base()) Header{};
      h->magic = kMagic;
      h->size = members.size();
      h->slot_bytes = slot;
      h->slots = o.shm_slots;
    } catch (const Error& e) {
      error = e.what();
      name.clear();
    }
  }
  auto names = allgather_strings(world, name, deadline);
  if (member && my_index != 0 && error.empty()) {
    try {
      const std::string& leader_name = names[static_cast<std::size_t>(members.front())];
      if (leader_name.empty())
        throw_error(ErrorCode::kIo, "world rank {} could not create the shm segment", members.front());
      seg = detail::ShmSegment::open(leader_name, bytes);
      auto* h = reinterpret_cast<Header*>(seg->base());
      if (h->magic != kMagic || h->size != members.size() || h->slot_bytes != slot || h->slots != o.shm_slots)
        throw_error(ErrorCode::kCorruptInput,
                    "shm segment {} does not describe a group of {} ranks with {} slots of {} bytes (do all ranks "
                    "use the same comm.coll_shm_* settings?)",
                    leader_name, members.size(), o.shm_slots, slot);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Everybody has mapped it (or failed): the name is no longer needed.
  bool any_failed = world.any(!error.empty(), deadline);
  if (seg) seg->unlink();
  if (any_failed) {
    if (!error.empty()) throw_error(ErrorCode::kIo, "shm group of world ranks {}: {}", detail::list_ranks(members), error);
    throw_error(ErrorCode::kPeerFailed, "shm group creation failed on another rank (see its log)");
  }
  if (!member) return nullptr;
  return std::make_unique<ShmGroup>(std::move(seg), members, my_index, o);
}

}  // namespace trellis::transport
