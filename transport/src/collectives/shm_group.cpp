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
// futex word after announcing itself in `waiters`; every publish that sees a waiter bumps
// the epoch and wakes them all (ShmSync, shm_sync.hpp, which the registered windows'
// all-reduce shares: shm_window.hpp).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "src/collectives/internal.hpp"
#include "src/collectives/shm_segment.hpp"
#include "src/collectives/shm_sync.hpp"
#include "src/collectives/shm_window.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/shm_names.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport::detail::shm {

inline constexpr std::uint64_t kMagic = 0x7472656c6c697333ull;  // "trellis3": ring of K slots, futex word

struct alignas(kLine) Flag {
  std::atomic<std::uint64_t> value;
};
static_assert(sizeof(Flag) == kLine && std::atomic<std::uint64_t>::is_always_lock_free);

struct alignas(kLine) Header {
  std::uint64_t magic;
  std::uint64_t size;
  std::uint64_t slot_bytes;
  std::uint64_t slots;
  SyncHeader sync;  // failure record, pids, futex word (shm_sync.hpp)
};

enum class FlagKind { kArrive = 0, kDone = 1, kFinished = 2 };
inline constexpr std::size_t kFlagKinds = 3;

inline std::size_t segment_bytes(std::size_t p, std::size_t slot, std::size_t slots) {
  return sizeof(Header) + kFlagKinds * p * sizeof(Flag) + slots * p * slot;
}

enum class OpKind { kAllReduce, kBroadcast, kAllGather, kBarrier };

class ShmGroup final : public AsyncGroup {
 public:
  ShmGroup(std::unique_ptr<ShmSegment> seg, std::vector<int> members, int rank, const GroupOptions& o)
      : seg_(std::move(seg)), opts_(o),
        sync_(&reinterpret_cast<Header*>(seg_->base())->sync, std::move(members), rank, o),
        windows_(*this, sync_, seg_->name()) {
    flags_ = reinterpret_cast<Flag*>(seg_->base() + sizeof(Header));
    data_ = seg_->base() + sizeof(Header) + kFlagKinds * sync_.members().size() * sizeof(Flag);
  }

  int rank() const override { return sync_.rank(); }
  int size() const override { return sync_.size(); }
  const std::vector<int>& members() const override { return sync_.members(); }
  std::string describe() const override { return "shm"; }
  Millis deadline() const override { return opts_.deadline; }
  const PollPolicy& wait_policy() const override { return opts_.wait; }

  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override;
  RequestPtr broadcast_async(void* data, std::size_t bytes, int root) override;
  RequestPtr all_gather_async(const void* in, void* out, std::size_t bytes) override;
  void barrier() override;
  std::span<std::byte> allocate_window(std::size_t bytes) override { return windows_.allocate(bytes); }

  // For ShmOp.
  ShmSync& sync() { return sync_; }
  std::atomic<std::uint64_t>& flag(FlagKind k, int r) const {
    return flags_[static_cast<std::size_t>(k) * sync_.members().size() + static_cast<std::size_t>(r)].value;
  }
  std::uint64_t load(FlagKind k, int r) const { return flag(k, r).load(std::memory_order_acquire); }
  void publish(FlagKind k, std::uint64_t seq) const { sync_.publish(flag(k, rank()), seq); }
  bool all_at_least(FlagKind k, std::uint64_t seq) const {
    for (int r = 0; r < size(); ++r)
      if (load(k, r) < seq) return false;
    return true;
  }
  std::byte* slot(std::uint64_t seq, int r) const {
    return data_ + ((seq % opts_.shm_slots) * sync_.members().size() + static_cast<std::size_t>(r)) *
                       opts_.shm_slot_bytes;
  }
  std::size_t slot_bytes() const { return opts_.shm_slot_bytes; }
  std::uint64_t slots() const { return opts_.shm_slots; }
  std::size_t one_shot_max() const { return opts_.one_shot_max_bytes; }
  // Reserves `pieces` consecutive sequence numbers and returns the first.
  std::uint64_t reserve(std::size_t pieces) {
    std::uint64_t first = seq_ + 1;
    seq_ += pieces;
    return first;
  }
  std::string who() const { return sync_.who(); }

 private:
  // Destroyed in reverse: the windows, then the sync (which marks an operation still in
  // flight as abandoned, in the segment), then the segment.
  std::unique_ptr<ShmSegment> seg_;
  GroupOptions opts_;
  ShmSync sync_;
  ShmWindows windows_;
  Flag* flags_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t seq_ = 0;
};

namespace {

// One collective, as a pipeline of pieces (see the file comment for the phases and the rule).
// filled_ >= reduced_ >= drained_ count the pieces that passed each phase on this rank.
class ShmOp final : public ShmRequest {
 public:
  ShmOp(ShmGroup& g, OpKind kind, void* data, const void* in, std::size_t total, DType dtype, int root)
      : ShmRequest(g.sync()), g_(g), kind_(kind), data_(static_cast<std::byte*>(data)),
        in_(static_cast<const std::byte*>(in)), total_(total), dtype_(dtype), root_(root) {
    esize_ = kind == OpKind::kAllReduce ? dtype_size(dtype) : 1;
    per_piece_ = g.slot_bytes() / esize_;
    pieces_ = kind == OpKind::kBarrier ? 1 : (total_ + per_piece_ - 1) / per_piece_;
    srcs_.resize(static_cast<std::size_t>(g.size()));
    sync_.begin(this);
    first_ = g_.reserve(pieces_);
  }
  ~ShmOp() override { abandon(); }

  std::size_t bytes() const override { return total_ * esize_; }
  std::string describe() const override;

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

  bool step() override;  // one phase of one piece; false when nothing can move now
  bool finished() const override { return drained_ == pieces_; }
  bool movable() const override;  // whether step() would move
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
  std::vector<const void*> srcs_;  // one per member, for the sums
};

}  // namespace

// What the peers wait for comes first: my reduced chunk, then my arrival; my own drain only
// when neither can move (it also frees the slot ring for the fills K pieces ahead).
bool ShmOp::step() {
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
  if (!complete()) {
    auto missing = waiting_for();
    if (!missing.empty()) {
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      what += fmt::format(" (piece {} of {}), waiting for world rank(s) {}", drained_ + 1, pieces_,
                          list_ranks(missing));
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
  // Data in a registered window goes zero-copy (shm_window.cpp), except small messages in
  // groups of more than two: there the one-shot's single round of flags beats the window's
  // two (4 ranks on 2 cores: 5.8 vs 8.3 us at 4 KiB, docs/benchmarks.md), while with two
  // ranks the copies it saves win at every size.
  if (size() == 2 || count * dtype_size(dtype) > one_shot_max())
    if (RequestPtr r = windows_.all_reduce_async(data, count, dtype)) return r;
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
  wait_stepped(op, Deadline::after(opts_.deadline), opts_.wait);
}

}  // namespace trellis::transport::detail::shm

namespace trellis::transport {

using namespace detail;
using namespace detail::shm;

namespace {

std::atomic<std::uint64_t> g_segment_counter{0};

// What a group segment's header must say: every member computes it from its own settings.
struct SegmentShape {
  std::size_t members, slot_bytes, slots;
};

std::unique_ptr<ShmSegment> create_segment(const std::string& name, std::size_t bytes, const SegmentShape& want) {
  auto seg = ShmSegment::create(name, bytes);
  auto* h = new (seg->base()) Header{};
  h->magic = kMagic;
  h->size = want.members;
  h->slot_bytes = want.slot_bytes;
  h->slots = want.slots;
  return seg;
}

// A member's mapping of the leader's segment `name` (empty: the leader could not create it).
std::unique_ptr<ShmSegment> open_segment(const std::string& name, int leader, std::size_t bytes,
                                         const SegmentShape& want) {
  if (name.empty()) throw_error(ErrorCode::kIo, "world rank {} could not create the shm segment", leader);
  auto seg = ShmSegment::open(name, bytes);
  const auto* h = reinterpret_cast<const Header*>(seg->base());
  if (h->magic != kMagic || h->size != want.members || h->slot_bytes != want.slot_bytes || h->slots != want.slots)
    throw_error(ErrorCode::kCorruptInput,
                "shm segment {} does not describe a group of {} ranks with {} slots of {} bytes (do all ranks "
                "use the same comm.coll_shm_* settings?)",
                name, want.members, want.slots, want.slot_bytes);
  return seg;
}

}  // namespace

std::unique_ptr<Group> make_shm_group(Bootstrap& world, const std::vector<int>& members, const GroupOptions& options) {
  auto it = std::find(members.begin(), members.end(), world.rank());
  const bool member = it != members.end();
  const int my_index = member ? static_cast<int>(it - members.begin()) : -1;
  if (options.shm_slots < 2)
    throw_error(ErrorCode::kInvalidArgument, "shm collectives need at least 2 ring slots (comm.coll_shm_slots), got {}",
                options.shm_slots);
  GroupOptions o = options;
  o.shm_slot_bytes = round_up(options.shm_slot_bytes, kLine);
  const SegmentShape shape{members.size(), o.shm_slot_bytes, o.shm_slots};
  const std::size_t bytes = segment_bytes(shape.members, shape.slot_bytes, shape.slots);
  auto deadline = Deadline::after(options.deadline);

  // The leader creates the segment and publishes its name; the others map it by that name.
  std::unique_ptr<ShmSegment> seg;
  std::string error, name;
  if (my_index == 0) {
    // The leader's pid in the name (core/shm_names.hpp): a group whose set-up is killed
    // leaves a name the next start sweeps. Windows add "-w<k>" (shm_window.cpp).
    name = shm_name(fmt::format("coll{}", g_segment_counter++));
    try {
      seg = create_segment(name, bytes, shape);
    } catch (const Error& e) {
      error = e.what();
      name.clear();
    }
  }
  auto names = allgather_strings(world, name, deadline);
  if (member && my_index != 0) {
    try {
      seg = open_segment(names[static_cast<std::size_t>(members.front())], members.front(), bytes, shape);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Everybody has mapped it (or failed): the name is no longer needed.
  bool any_failed = world.any(!error.empty(), deadline);
  if (seg) seg->unlink();
  if (any_failed) {
    if (!error.empty()) throw_error(ErrorCode::kIo, "shm group of world ranks {}: {}", list_ranks(members), error);
    throw_error(ErrorCode::kPeerFailed, "shm group creation failed on another rank (see its log)");
  }
  if (!member) return nullptr;
  return std::make_unique<ShmGroup>(std::move(seg), members, my_index, o);
}

}  // namespace trellis::transport
