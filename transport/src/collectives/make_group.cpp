// The hierarchical Group and make_group, which picks an algorithm from the members' hosts.
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <set>

#include <spdlog/spdlog.h>

#include "src/collectives/internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/dtype.hpp"

namespace trellis::transport {
namespace {

using detail::AsyncGroup;
using detail::Phase;

std::unique_ptr<AsyncGroup> as_async(std::unique_ptr<Group> g) {
  if (!g) return nullptr;
  auto* a = dynamic_cast<AsyncGroup*>(g.get());
  if (a == nullptr) throw_error(ErrorCode::kInternal, "group {} has no asynchronous operations", g->describe());
  g.release();
  return std::unique_ptr<AsyncGroup>(a);
}

// A hierarchical operation issues its phases on the local and leader groups one by one, as it
// is driven. With two in flight, ranks could interleave their phases differently (rank 0 issues
// B's local all-reduce before A's local broadcast, rank 1 the other way) and the sub-groups
// would pair up different operations. So they run one at a time, in issue order; a test() on
// any of them drives the queue from its head, and an abandoned request is still driven.
class FifoQueue {
 public:
  struct Entry {
    RequestPtr req;
    bool done = false;
  };
  std::shared_ptr<Entry> push(RequestPtr r) {
    auto e = std::make_shared<Entry>();
    e->req = std::move(r);
    queue_.push_back(e);
    drive();
    return e;
  }
  void drive() {
    while (!queue_.empty()) {
      if (!queue_.front()->req->test()) return;
      queue_.front()->done = true;
      queue_.front()->req.reset();
      queue_.pop_front();
      ++completed_;
    }
  }
  bool empty() const { return queue_.empty(); }
  std::uint64_t completed() const { return completed_; }
  const Request* head() const { return queue_.empty() ? nullptr : queue_.front()->req.get(); }
  Request* head_mutable() { return queue_.empty() ? nullptr : queue_.front()->req.get(); }

 private:
  std::deque<std::shared_ptr<Entry>> queue_;
  std::uint64_t completed_ = 0;
};

class QueuedRequest final : public detail::SteppedRequest {
 public:
  QueuedRequest(std::shared_ptr<FifoQueue> q, RequestPtr r, std::string what, std::size_t bytes)
      : what_(std::move(what)), bytes_(bytes), queue_(std::move(q)), entry_(queue_->push(std::move(r))) {}
  bool test() override {
    if (!entry_->done) queue_->drive();
    return entry_->done;
  }
  // Progress of whatever runs at the head counts: this request waits behind it.
  std::uint64_t steps_done() const override {
    auto* s = dynamic_cast<const detail::SteppedRequest*>(queue_->head());
    return queue_->completed() * 1000003 + (s ? s->steps_done() : 0);
  }
  // Blocks on whatever runs at the head (test() drives the queue from there).
  bool park(Clock::duration max) override {
    if (entry_->done) return false;
    auto* s = dynamic_cast<detail::SteppedRequest*>(queue_->head_mutable());
    return s != nullptr && s->park(max);
  }
  std::size_t bytes() const override { return bytes_; }
  std::string describe() const override {
    const Request* h = queue_->head();
    if (entry_->done || h == nullptr) return what_;
    if (h == entry_->req.get()) return h->describe();
    return what_ + " (queued behind: " + h->describe() + ")";
  }

 private:
  std::string what_;
  std::size_t bytes_;
  std::shared_ptr<FifoQueue> queue_;
  std::shared_ptr<FifoQueue::Entry> entry_;
};

// In-host shm group per host, ring among the host leaders (the first member of each host).
// Every phase runs in f32, so bf16 is rounded once, at the end.
class HierGroup final : public AsyncGroup {
 public:
  struct Layout {
    std::vector<int> host_of_member;  // host index (in order of first appearance) per group rank
    std::vector<int> local_index;     // index inside its host's group, per group rank
    int hosts = 0;
    int max_local = 0;
  };
  HierGroup(std::vector<int> members, int rank, Layout layout, std::unique_ptr<AsyncGroup> local,
            std::unique_ptr<AsyncGroup> leaders, Millis deadline, Backend cross_host)
      : members_(std::move(members)), rank_(rank), layout_(std::move(layout)), local_(std::move(local)),
        leaders_(std::move(leaders)), deadline_(deadline), cross_host_(cross_host) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  // Every member names the leaders' links, also those that are not leaders themselves.
  std::string describe() const override {
    return fmt::format("hierarchical ({} in each host, ring over {} between hosts)", local_->describe(),
                       to_string(cross_host_));
  }
  Millis deadline() const override { return deadline_; }
  const PollPolicy& wait_policy() const override { return local_->wait_policy(); }
  // The host's shm group's window: the in-host phase of an f32 all-reduce on it runs in
  // place; the ring between hosts and the broadcast back are as for any memory.
  std::span<std::byte> allocate_window(std::size_t bytes) override { return local_->allocate_window(bytes); }

  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override {
    if (count == 0) return make_completed_request(0, "empty all-reduce");
    auto wide = std::make_shared<std::vector<float>>();
    float* buf = static_cast<float*>(data);
    if (dtype == DType::kBF16) {
      wide->resize(count);
      bf16_to_f32(static_cast<const std::uint16_t*>(data), wide->data(), count);
      buf = wide->data();
    }
    std::vector<Phase> phases;
    phases.push_back([this, buf, count] { return local_->all_reduce_async(buf, count, DType::kF32); });
    if (leaders_) phases.push_back([this, buf, count] { return leaders_->all_reduce_async(buf, count, DType::kF32); });
    phases.push_back([this, buf, count] { return local_->broadcast_async(buf, count * 4, 0); });
    auto finish = [wide, data, count, dtype] {
      if (dtype == DType::kBF16) f32_to_bf16(wide->data(), static_cast<std::uint16_t*>(data), count);
    };
    return kick(detail::make_sequence(std::move(phases), finish, what(fmt::format("all-reduce of {} elements", count)),
                                      count * dtype_size(dtype)));
  }

  RequestPtr broadcast_async(void* data, std::size_t bytes, int root) override {
    if (bytes == 0) return make_completed_request(0, "empty broadcast");
    const int root_host = layout_.host_of_member.at(static_cast<std::size_t>(root));
    const bool on_root_host = layout_.host_of_member[rank_] == root_host;
    std::vector<Phase> phases;
    if (on_root_host) {
      int local_root = layout_.local_index[static_cast<std::size_t>(root)];
      phases.push_back([this, data, bytes, local_root] { return local_->broadcast_async(data, bytes, local_root); });
    }
    if (leaders_) phases.push_back([this, data, bytes, root_host] { return leaders_->broadcast_async(data, bytes, root_host); });
    if (!on_root_host) phases.push_back([this, data, bytes] { return local_->broadcast_async(data, bytes, 0); });
    return kick(detail::make_sequence(std::move(phases), nullptr, what(fmt::format("broadcast of {} bytes", bytes)), bytes));
  }

  // Host blocks are padded to the largest host, gathered among leaders, broadcast in each
  // host, then put in group order.
  RequestPtr all_gather_async(const void* in, void* out, std::size_t bytes) override {
    if (bytes == 0) return make_completed_request(0, "empty all-gather");
    const std::size_t block = static_cast<std::size_t>(layout_.max_local) * bytes;
    auto host_block = std::make_shared<std::vector<std::byte>>(block);
    auto all = std::make_shared<std::vector<std::byte>>(block * static_cast<std::size_t>(layout_.hosts));
    std::vector<Phase> phases;
    phases.push_back([this, in, bytes, host_block] { return local_->all_gather_async(in, host_block->data(), bytes); });
    if (leaders_)
      phases.push_back([this, host_block, all, block] {
        return leaders_->all_gather_async(host_block->data(), all->data(), block);
      });
    phases.push_back([this, all] { return local_->broadcast_async(all->data(), all->size(), 0); });
    auto finish = [this, all, out, bytes, block] {
      for (std::size_t m = 0; m < members_.size(); ++m)
        std::memcpy(static_cast<std::byte*>(out) + m * bytes,
                    all->data() + static_cast<std::size_t>(layout_.host_of_member[m]) * block +
                        static_cast<std::size_t>(layout_.local_index[m]) * bytes,
                    bytes);
    };
    return kick(detail::make_sequence(std::move(phases), finish, what(fmt::format("all-gather of {} bytes", bytes)),
                                      bytes * members_.size()));
  }

  void barrier() override {
    if (!queue_->empty()) {
      // Sub-group barriers must not overtake operations still queued on the same sub-groups.
      auto drained = make_completed_request(0, "barrier");
      QueuedRequest last(queue_, std::move(drained), what("barrier"), 0);
      detail::wait_stepped(last, Deadline::after(deadline_), wait_policy());
    }
    local_->barrier();
    if (leaders_) leaders_->barrier();
    local_->barrier();
  }

 private:
  RequestPtr kick(RequestPtr r) {
    std::string what = r->describe();
    std::size_t bytes = r->bytes();
    return std::make_unique<QueuedRequest>(queue_, std::move(r), std::move(what), bytes);
  }
  std::string what(const std::string& op) const {
    return fmt::format("hierarchical {} over world ranks {}", op, detail::list_ranks(members_));
  }
  std::vector<int> members_;
  int rank_;
  Layout layout_;
  std::unique_ptr<AsyncGroup> local_, leaders_;
  Millis deadline_;
  Backend cross_host_;
  std::shared_ptr<FifoQueue> queue_ = std::make_shared<FifoQueue>();
};

void check_members(const Bootstrap& world, const std::vector<int>& members) {
  if (members.empty()) throw_error(ErrorCode::kInvalidArgument, "a group needs at least one member");
  std::set<int> seen;
  for (int m : members) {
    if (m < 0 || m >= world.size())
      throw_error(ErrorCode::kInvalidArgument, "group member {} is not a rank of a world of {}", m, world.size());
    if (!seen.insert(m).second) throw_error(ErrorCode::kInvalidArgument, "group member {} is listed twice", m);
  }
}

}  // namespace

std::unique_ptr<Group> make_group(Bootstrap& world, const std::vector<int>& members, const GroupOptions& options,
                                  const Config& config, std::vector<int> hosts) {
  check_members(world, members);
  if (hosts.empty()) hosts = host_map(world, Deadline::after(options.deadline));
  if (hosts.size() != static_cast<std::size_t>(world.size()))
    throw_error(ErrorCode::kInvalidArgument, "host map has {} entries for a world of {}", hosts.size(), world.size());
  const int me = world.rank();
  auto it = std::find(members.begin(), members.end(), me);
  const bool member = it != members.end();
  const int my_rank = member ? static_cast<int>(it - members.begin()) : -1;

  HierGroup::Layout layout;
  std::vector<int> host_ids;                 // distinct hosts, first appearance order
  std::vector<std::vector<int>> per_host;    // members (world ranks) per host
  for (int m : members) {
    auto h = std::find(host_ids.begin(), host_ids.end(), hosts[static_cast<std::size_t>(m)]);
    if (h == host_ids.end()) {
      host_ids.push_back(hosts[static_cast<std::size_t>(m)]);
      per_host.emplace_back();
      h = host_ids.end() - 1;
    }
    int hi = static_cast<int>(h - host_ids.begin());
    layout.host_of_member.push_back(hi);
    layout.local_index.push_back(static_cast<int>(per_host[hi].size()));
    per_host[hi].push_back(m);
  }
  layout.hosts = static_cast<int>(host_ids.size());
  for (const auto& l : per_host) layout.max_local = std::max(layout.max_local, static_cast<int>(l.size()));

  Algorithm alg = options.algorithm;
  if (alg == Algorithm::kAuto) {
    if (layout.hosts == 1) alg = Algorithm::kShm;
    else if (layout.max_local == 1) alg = Algorithm::kRing;
    else alg = Algorithm::kHierarchical;
  }
  if (members.size() == 1) return member ? make_single_group(me) : nullptr;
  switch (alg) {
    case Algorithm::kMpi: return make_mpi_group(world, members, options.deadline);
    case Algorithm::kShm:
      if (layout.hosts != 1)
        throw_error(ErrorCode::kInvalidArgument, "the shm algorithm needs every member on one host; world ranks {} are on {} hosts",
                    detail::list_ranks(members), layout.hosts);
      return make_shm_group(world, member ? members : std::vector<int>{}, options);
    case Algorithm::kRing: return make_ring_group(world, members, options, config);
    case Algorithm::kHierarchical: break;
    case Algorithm::kAuto: break;
  }
  const std::vector<int> no_one;
  const std::vector<int>& local = member ? per_host[static_cast<std::size_t>(layout.host_of_member[my_rank])] : no_one;
  auto local_group = as_async(make_shm_group(world, local, options));
  std::vector<int> leaders;
  for (const auto& l : per_host) leaders.push_back(l.front());
  const bool leader = member && local.front() == me;
  auto leader_group = as_async(make_ring_group(world, leader ? leaders : no_one, options, config));
  if (!member) return nullptr;
  return std::make_unique<HierGroup>(members, my_rank, std::move(layout), std::move(local_group),
                                     std::move(leader_group), options.deadline, options.cross_host);
}

}  // namespace trellis::transport
