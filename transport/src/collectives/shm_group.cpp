// The in-host shared-memory Group (see collectives.hpp for the algorithm).
//
// Segment layout: Header | arrive[P] | done[P] | slots[2 parities][P ranks][slot_bytes].
// Every operation is cut into pieces of at most slot_bytes per rank; piece number s (a
// sequence number shared by all members, since they issue the same operations in the same
// order) uses parity s % 2. A rank may overwrite its parity-p slot for piece s only when
// every member has arrived at piece s-1, i.e. finished reading piece s-2, the last user of
// that parity: that single rule makes the slots safe without any other lock.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include <spdlog/spdlog.h>

#include "src/collectives/internal.hpp"
#include "src/collectives/shm_segment.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport {
namespace {

constexpr std::uint64_t kMagic = 0x7472656c6c697331ull;  // "trellis1"
constexpr std::size_t kLine = 64;

struct alignas(kLine) Flag {
  std::atomic<std::uint64_t> value;
};
static_assert(sizeof(Flag) == kLine && std::atomic<std::uint64_t>::is_always_lock_free);

struct alignas(kLine) Header {
  std::uint64_t magic;
  std::uint64_t size;
  std::uint64_t slot_bytes;
  std::atomic<std::int64_t> failed;  // world rank + 1 of a member that gave up; 0: none
  char reason[256];                  // its error, written before `failed`
};

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::size_t segment_bytes(std::size_t p, std::size_t slot) {
  return sizeof(Header) + 2 * p * sizeof(Flag) + 2 * p * slot;
}

enum class OpKind { kAllReduce, kBroadcast, kAllGather, kBarrier };
enum class Stage { kEnter, kArrived, kReduced };

class ShmOp;

class ShmGroup final : public detail::AsyncGroup {
 public:
  ShmGroup(std::unique_ptr<detail::ShmSegment> seg, std::vector<int> members, int rank, const GroupOptions& o)
      : seg_(std::move(seg)), members_(std::move(members)), rank_(rank), opts_(o) {
    header_ = reinterpret_cast<Header*>(seg_->base());
    flags_ = reinterpret_cast<Flag*>(seg_->base() + sizeof(Header));
    data_ = seg_->base() + sizeof(Header) + 2 * members_.size() * sizeof(Flag);
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
  std::atomic<std::uint64_t>& arrive(int r) { return flags_[r].value; }
  std::atomic<std::uint64_t>& done(int r) { return flags_[size() + r].value; }
  std::byte* slot(std::uint64_t seq, int r) const {
    return data_ + ((seq & 1) * members_.size() + static_cast<std::size_t>(r)) * opts_.shm_slot_bytes;
  }
  std::size_t slot_bytes() const { return opts_.shm_slot_bytes; }
  std::size_t one_shot_max() const { return opts_.one_shot_max_bytes; }
  std::uint64_t next_seq() { return ++seq_; }
  void check_peers() const {
    auto f = header_->failed.load(std::memory_order_acquire);
    if (f != 0)
      throw_error(ErrorCode::kPeerFailed, "shm group of world ranks {}: world rank {} gave up: {}",
                  detail::list_ranks(members_), f - 1, std::string(header_->reason));
  }
  void mark_failed(const std::string& why) {
    std::int64_t expected = 0;
    // Only the first failure is recorded: it is the cause, the others are consequences.
    if (header_->failed.load() != 0) return;
    std::snprintf(header_->reason, sizeof(header_->reason), "%s", why.c_str());
    header_->failed.compare_exchange_strong(expected, members_[rank_] + 1, std::memory_order_release);
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
};

// One collective, as a state machine over pieces (see the file comment for the rule).
class ShmOp final : public detail::SteppedRequest {
 public:
  ShmOp(ShmGroup& g, OpKind kind, void* data, const void* in, std::size_t total, DType dtype, int root)
      : g_(g), kind_(kind), data_(data), in_(in), total_(total), dtype_(dtype), root_(root) {
    esize_ = kind == OpKind::kAllReduce ? dtype_size(dtype) : 1;
    per_piece_ = g.slot_bytes() / esize_;
    g_.begin(this);
  }
  ~ShmOp() override {
    if (!complete_) g_.mark_failed(fmt::format("it abandoned {}", describe()));
    g_.end(this);
  }

  bool test() override {
    if (complete_) return true;
    try {
      while (step()) {
        ++steps_;
        if (complete_) return true;
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

 private:
  std::size_t piece_len() const { return std::min(per_piece_, std::max<std::size_t>(total_, 1) - offset_); }
  bool all_at_least(bool use_done, std::uint64_t s) {
    for (int r = 0; r < g_.size(); ++r) {
      auto& f = use_done ? g_.done(r) : g_.arrive(r);
      if (f.load(std::memory_order_acquire) < s) return false;
    }
    return true;
  }
  bool step();  // advances one stage; false when it must wait
  void enter();
  void after_arrival();
  void finish_piece();
  void copy_out_chunks();

  ShmGroup& g_;
  OpKind kind_;
  void* data_;
  const void* in_;
  std::size_t total_;  // elements (all-reduce) or bytes
  DType dtype_;
  int root_;
  std::size_t esize_, per_piece_;
  std::size_t offset_ = 0;
  std::uint64_t seq_ = 0;
  Stage stage_ = Stage::kEnter;
  bool complete_ = false;
  std::uint64_t steps_ = 0;
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

std::string ShmOp::describe() const {
  std::string what;
  switch (kind_) {
    case OpKind::kAllReduce: what = fmt::format("all-reduce of {} elements", total_); break;
    case OpKind::kBroadcast: what = fmt::format("broadcast of {} bytes from group rank {}", total_, root_); break;
    case OpKind::kAllGather: what = fmt::format("all-gather of {} bytes per rank", total_); break;
    case OpKind::kBarrier: what = "barrier"; break;
  }
  std::vector<int> missing;
  if (seq_ != 0 && !complete_) {
    for (int r = 0; r < g_.size(); ++r) {
      bool waiting_done = stage_ == Stage::kReduced;
      auto need = stage_ == Stage::kEnter ? seq_ - 1 : seq_;
      auto& f = waiting_done ? g_.done(r) : g_.arrive(r);
      if (f.load(std::memory_order_acquire) < need) missing.push_back(g_.members()[r]);
    }
  }
  what += " over " + g_.who();
  if (!missing.empty()) what += ", waiting for world rank(s) " + detail::list_ranks(missing);
  return what;
}

bool ShmOp::step() {
  switch (stage_) {
    case Stage::kEnter:
      if (seq_ == 0) seq_ = g_.next_seq();
      if (!all_at_least(false, seq_ - 1)) return false;
      enter();
      return true;
    case Stage::kArrived:
      if (kind_ == OpKind::kBroadcast ? g_.rank() != root_ && g_.arrive(root_).load(std::memory_order_acquire) < seq_
                                      : !all_at_least(false, seq_))
        return false;
      after_arrival();
      return true;
    case Stage::kReduced:
      if (!all_at_least(true, seq_)) return false;
      copy_out_chunks();
      finish_piece();
      return true;
  }
  return false;
}

void ShmOp::enter() {
  const int me = g_.rank();
  std::size_t n = piece_len();
  switch (kind_) {
    case OpKind::kAllReduce:
      std::memcpy(g_.slot(seq_, me), static_cast<const std::byte*>(data_) + offset_ * esize_, n * esize_);
      break;
    case OpKind::kAllGather:
      std::memcpy(g_.slot(seq_, me), static_cast<const std::byte*>(in_) + offset_, n);
      break;
    case OpKind::kBroadcast:
      if (me == root_) std::memcpy(g_.slot(seq_, me), static_cast<const std::byte*>(data_) + offset_, n);
      break;
    case OpKind::kBarrier: break;
  }
  g_.arrive(me).store(seq_, std::memory_order_release);
  stage_ = Stage::kArrived;
}

void ShmOp::after_arrival() {
  const int p = g_.size(), me = g_.rank();
  std::size_t n = piece_len();
  std::vector<const void*> srcs(static_cast<std::size_t>(p));
  switch (kind_) {
    case OpKind::kAllReduce: {
      if (n * esize_ <= g_.one_shot_max()) {
        for (int r = 0; r < p; ++r) srcs[r] = g_.slot(seq_, r);
        detail::sum_into(dtype_, srcs.data(), p, static_cast<std::byte*>(data_) + offset_ * esize_, n);
        break;
      }
      // Two-shot: chunks of whole cache lines, so no two ranks write the same line.
      std::size_t chunk = round_up((n + p - 1) / p, kLine / esize_);
      std::size_t lo = std::min(n, chunk * me), hi = std::min(n, lo + chunk);
      for (int r = 0; r < p; ++r) srcs[r] = g_.slot(seq_, r) + lo * esize_;
      if (hi > lo) detail::sum_into(dtype_, srcs.data(), p, g_.slot(seq_, me) + lo * esize_, hi - lo);
      g_.done(me).store(seq_, std::memory_order_release);
      stage_ = Stage::kReduced;
      return;
    }
    case OpKind::kAllGather:
      for (int r = 0; r < p; ++r)
        std::memcpy(static_cast<std::byte*>(data_) + r * total_ + offset_, g_.slot(seq_, r), n);
      break;
    case OpKind::kBroadcast:
      if (me != root_) std::memcpy(static_cast<std::byte*>(data_) + offset_, g_.slot(seq_, root_), n);
      break;
    case OpKind::kBarrier: break;
  }
  finish_piece();
}

void ShmOp::copy_out_chunks() {
  const int p = g_.size();
  std::size_t n = piece_len();
  std::size_t chunk = round_up((n + p - 1) / p, kLine / esize_);
  auto* out = static_cast<std::byte*>(data_) + offset_ * esize_;
  for (int r = 0; r < p; ++r) {
    std::size_t lo = std::min(n, chunk * r), hi = std::min(n, lo + chunk);
    if (hi > lo) std::memcpy(out + lo * esize_, g_.slot(seq_, r) + lo * esize_, (hi - lo) * esize_);
  }
}

void ShmOp::finish_piece() {
  offset_ += piece_len();
  stage_ = Stage::kEnter;
  seq_ = 0;
  if (offset_ >= total_) {
    complete_ = true;
    g_.end(this);
  }
}

// The first test() copies this rank's input in and publishes its arrival, so peers can go
// ahead while the caller computes.
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
  const std::size_t slot = round_up(options.shm_slot_bytes, kLine);
  const std::size_t bytes = segment_bytes(members.size(), slot);
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
      if (h->magic != kMagic || h->size != members.size() || h->slot_bytes != slot)
        throw_error(ErrorCode::kCorruptInput, "shm segment {} does not describe a group of {} ranks", leader_name,
                    members.size());
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
