// The Link-based Group: recursive doubling for small power-of-two all-reduces, the ring
// (reduce-scatter then all-gather) otherwise; broadcast and all-gather straight over the
// links. Every member connects to every other member (groups of host leaders are small).
//
// Each collective is a state machine of steps; a step posts its receive before its send (so
// no backend has to buffer an unexpected large message) and completes when both are done.
// Steps on one link reuse one tag: links deliver in order per tag, so step k's message can
// never be matched by step k+1's receive.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "src/collectives/internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/dtype.hpp"

namespace trellis::transport {
namespace {

constexpr std::uint32_t kTagBase = 0x4000;
enum TagKind : std::uint32_t { kReduceTag = 0, kBcastTag = 1, kGatherTag = 2 };

class RingGroup;

// A sequence of steps; step i posts requests (start) and, once they all completed, runs
// `apply`. Subclasses say how many steps there are and what each does.
class StepOp : public detail::SteppedRequest {
 public:
  StepOp(RingGroup& g, std::string what);
  ~StepOp() override;
  bool test() override;
  std::size_t bytes() const override { return bytes_; }
  std::string describe() const override;
  std::uint64_t steps_done() const override { return static_cast<std::uint64_t>(step_ + 1); }

 protected:
  virtual int steps() const = 0;
  virtual void start(int step) = 0;  // fills reqs_
  virtual void apply(int) {}
  virtual void finish() {}
  RingGroup& g_;
  std::vector<RequestPtr> reqs_;
  std::size_t bytes_ = 0;

 private:
  std::string what_;
  int step_ = -1;
  bool complete_ = false;
};

class RingGroup final : public detail::AsyncGroup {
 public:
  RingGroup(std::unique_ptr<Transport> t, std::vector<int> members, int rank, const GroupOptions& o, std::uint32_t id)
      : t_(std::move(t)), members_(std::move(members)), rank_(rank), opts_(o), tag_(kTagBase + id * 4) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  // "ring over ucx": which links carry it is what a user checks first (is the fast path in use?).
  std::string describe() const override { return "ring over " + std::string(to_string(t_->backend())); }
  Millis deadline() const override { return opts_.deadline; }
  const PollPolicy& wait_policy() const override { return opts_.wait; }

  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override;
  RequestPtr broadcast_async(void* data, std::size_t bytes, int root) override;
  RequestPtr all_gather_async(const void* in, void* out, std::size_t bytes) override;
  void barrier() override {
    std::byte in{};
    std::vector<std::byte> out(static_cast<std::size_t>(size()));
    all_gather(&in, out.data(), 1);
  }

  Link& link_to(int group_rank) { return t_->link(members_[static_cast<std::size_t>(group_rank)]); }
  std::uint32_t tag(TagKind k) const { return tag_ + k; }
  const GroupOptions& options() const { return opts_; }
  std::string who() const { return "ring group of world ranks " + detail::list_ranks(members_); }
  // A group has one operation in flight: a new one first completes the previous one.
  void begin(Request* op) {
    if (active_ != nullptr) detail::wait_stepped(*active_, Deadline::after(opts_.deadline), opts_.wait);
    active_ = op;
  }
  void end(Request* op) {
    if (active_ == op) active_ = nullptr;
  }

 private:
  std::unique_ptr<Transport> t_;
  std::vector<int> members_;
  int rank_;
  GroupOptions opts_;
  std::uint32_t tag_;
  Request* active_ = nullptr;
};

// The op takes its place in the group's order when it is created (after the previous one
// completed); its first step is posted by the first test(), which the factories call
// before returning, so the data moves while the caller computes.
StepOp::StepOp(RingGroup& g, std::string what) : g_(g), what_(std::move(what)) { g_.begin(this); }
StepOp::~StepOp() { g_.end(this); }

bool StepOp::test() {
  if (complete_) return true;
  if (step_ < 0) {
    step_ = 0;
    if (steps() > 0) start(0);
  }
  while (step_ < steps()) {
    for (auto& r : reqs_)
      if (r && !r->test()) return false;
    reqs_.clear();
    apply(step_);
    if (++step_ < steps()) start(step_);
  }
  finish();
  complete_ = true;
  g_.end(this);
  return true;
}

std::string StepOp::describe() const {
  std::string s = what_ + " over " + g_.who();
  if (step_ >= 0 && !complete_) {
    s += fmt::format(", step {} of {}", step_ + 1, steps());
    for (const auto& r : reqs_)
      if (r) s += "; " + r->describe();
  }
  return s;
}

// All-reduce on f32 data (bf16 is widened by the caller and narrowed in finish()).
class AllReduceOp final : public StepOp {
 public:
  AllReduceOp(RingGroup& g, void* data, std::size_t count, DType dtype)
      : StepOp(g, fmt::format("all-reduce of {} elements", count)), user_(data), n_(count), dtype_(dtype) {
    bytes_ = count * dtype_size(dtype);
    if (dtype == DType::kBF16) {
      wide_.resize(count);
      bf16_to_f32(static_cast<const std::uint16_t*>(data), wide_.data(), count);
      buf_ = wide_.data();
    } else {
      buf_ = static_cast<float*>(data);
    }
    const int p = g.size();
    doubling_ = (p & (p - 1)) == 0 && count * 4 <= g.options().doubling_max_bytes;
    if (doubling_) {
      while ((1 << log_p_) < p) ++log_p_;
      tmp_.resize(count);
    } else {
      tmp_.resize(count / static_cast<std::size_t>(p) + 1);
    }
  }

 protected:
  int steps() const override { return doubling_ ? log_p_ : 2 * (g_.size() - 1); }
  void start(int s) override {
    const int p = g_.size(), r = g_.rank();
    auto tag = g_.tag(kReduceTag);
    if (doubling_) {
      Link& l = g_.link_to(r ^ (1 << s));
      reqs_.push_back(l.irecv(as_bytes(tmp_.data(), n_), tag));
      reqs_.push_back(l.isend(as_cbytes(buf_, n_), tag));
      return;
    }
    Link& next = g_.link_to((r + 1) % p);
    Link& prev = g_.link_to((r + p - 1) % p);
    int send_chunk, recv_chunk;
    if (s < p - 1) {
      send_chunk = mod(r - s, p);
      recv_chunk = mod(r - s - 1, p);
      reqs_.push_back(prev.irecv(as_bytes(tmp_.data(), chunk_len(recv_chunk)), tag));
    } else {
      int t = s - (p - 1);
      send_chunk = mod(r + 1 - t, p);
      recv_chunk = mod(r - t, p);
      reqs_.push_back(prev.irecv(as_bytes(buf_ + chunk_lo(recv_chunk), chunk_len(recv_chunk)), tag));
    }
    recv_chunk_ = recv_chunk;
    reqs_.push_back(next.isend(as_cbytes(buf_ + chunk_lo(send_chunk), chunk_len(send_chunk)), tag));
  }
  void apply(int s) override {
    if (doubling_) {
      // a + b == b + a exactly, so both partners hold the same bits after every step.
      for (std::size_t i = 0; i < n_; ++i) buf_[i] += tmp_[i];
      return;
    }
    if (s >= g_.size() - 1) return;  // all-gather steps received in place
    float* dst = buf_ + chunk_lo(recv_chunk_);
    std::size_t len = chunk_len(recv_chunk_);
    // The partial sum that travelled the ring comes first, this rank's value second: the
    // order is fixed by the ring, and each chunk is reduced once and then copied.
    for (std::size_t i = 0; i < len; ++i) dst[i] = tmp_[i] + dst[i];
  }
  void finish() override {
    if (dtype_ == DType::kBF16) f32_to_bf16(wide_.data(), static_cast<std::uint16_t*>(user_), n_);
  }

 private:
  static int mod(int a, int p) { return ((a % p) + p) % p; }
  std::size_t chunk_lo(int c) const { return n_ * static_cast<std::size_t>(c) / static_cast<std::size_t>(g_.size()); }
  std::size_t chunk_len(int c) const { return chunk_lo(c + 1) - chunk_lo(c); }
  static std::span<std::byte> as_bytes(float* p, std::size_t n) { return {reinterpret_cast<std::byte*>(p), n * 4}; }
  static std::span<const std::byte> as_cbytes(const float* p, std::size_t n) {
    return {reinterpret_cast<const std::byte*>(p), n * 4};
  }

  void* user_;
  std::size_t n_;
  DType dtype_;
  float* buf_;
  std::vector<float> wide_, tmp_;
  bool doubling_ = false;
  int log_p_ = 0;
  int recv_chunk_ = 0;
};

// Broadcast: the root sends to every member at once (one step).
class BroadcastOp final : public StepOp {
 public:
  BroadcastOp(RingGroup& g, void* data, std::size_t bytes, int root)
      : StepOp(g, fmt::format("broadcast of {} bytes from group rank {}", bytes, root)), data_(data), root_(root) {
    bytes_ = bytes;
  }

 protected:
  int steps() const override { return 1; }
  void start(int) override {
    auto tag = g_.tag(kBcastTag);
    std::span<std::byte> d(static_cast<std::byte*>(data_), bytes_);
    if (g_.rank() != root_) {
      reqs_.push_back(g_.link_to(root_).irecv(d, tag));
      return;
    }
    for (int r = 0; r < g_.size(); ++r)
      if (r != root_) reqs_.push_back(g_.link_to(r).isend(d, tag));
  }

 private:
  void* data_;
  int root_;
};

// All-gather along the ring: P-1 steps, each forwarding the block received last.
class AllGatherOp final : public StepOp {
 public:
  AllGatherOp(RingGroup& g, const void* in, void* out, std::size_t bytes)
      : StepOp(g, fmt::format("all-gather of {} bytes per rank", bytes)), out_(static_cast<std::byte*>(out)) {
    bytes_ = bytes;
    std::memcpy(out_ + static_cast<std::size_t>(g.rank()) * bytes, in, bytes);
  }

 protected:
  int steps() const override { return g_.size() - 1; }
  void start(int s) override {
    const int p = g_.size(), r = g_.rank();
    auto tag = g_.tag(kGatherTag);
    auto block = [&](int b) { return out_ + static_cast<std::size_t>((b % p + p) % p) * bytes_; };
    reqs_.push_back(g_.link_to((r + p - 1) % p).irecv({block(r - s - 1), bytes_}, tag));
    reqs_.push_back(g_.link_to((r + 1) % p).isend({block(r - s), bytes_}, tag));
  }

 private:
  std::byte* out_;
};

RequestPtr kick(RequestPtr op) {
  op->test();
  return op;
}

RequestPtr RingGroup::all_reduce_async(void* data, std::size_t count, DType dtype) {
  if (count == 0 || size() == 1) return make_completed_request(count * dtype_size(dtype), "all-reduce over one rank");
  return kick(std::make_unique<AllReduceOp>(*this, data, count, dtype));
}

RequestPtr RingGroup::broadcast_async(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size())
    throw_error(ErrorCode::kInvalidArgument, "broadcast root {} is not a rank of {}", root, who());
  if (bytes == 0 || size() == 1) return make_completed_request(bytes, "broadcast over one rank");
  return kick(std::make_unique<BroadcastOp>(*this, data, bytes, root));
}

RequestPtr RingGroup::all_gather_async(const void* in, void* out, std::size_t bytes) {
  if (bytes == 0) return make_completed_request(0, "empty all-gather");
  return kick(std::make_unique<AllGatherOp>(*this, in, out, bytes));
}

std::atomic<std::uint32_t> g_ring_counter{0};

}  // namespace

std::unique_ptr<Group> make_ring_group(Bootstrap& world, const std::vector<int>& members, const GroupOptions& options,
                                       const Config& config) {
  const std::uint32_t id = g_ring_counter++ % 1024;
  auto it = std::find(members.begin(), members.end(), world.rank());
  std::vector<int> peers;
  if (it != members.end())
    for (int m : members)
      if (m != world.rank()) peers.push_back(m);
  auto t = connect(options.cross_host, world, peers, config);
  if (it == members.end()) return nullptr;
  return std::make_unique<RingGroup>(std::move(t), members, static_cast<int>(it - members.begin()), options, id);
}

}  // namespace trellis::transport
