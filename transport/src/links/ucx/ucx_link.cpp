// The ucx backend: one UCP worker per rank, one endpoint per peer, tag messages.
//
// UCX chooses the wire per endpoint: shared memory (posix/sysv/cma) between ranks of one
// host, tcp between hosts here, and RDMA (rc/dc/ud verbs) on InfiniBand/RoCE clusters, with
// no change in this code. Tags carry the sender's world rank in the high 32 bits and the
// link tag in the low 32, so a receive matches exactly one peer and one tag.
//
// The fast path is lean on purpose (the target is ucx_perftest's latency within 1.3x): no
// copies, no allocation beyond the Request object; progress is ucp_worker_progress polled
// by Request::test().
//
// Dead peers: endpoints to other hosts use peer error handling (UCX's keepalive), so a peer
// that dies fails the operations on its link with kPeerFailed naming the rank. UCX 1.13
// offers no shared-memory transport under peer error handling, so endpoints inside a host
// use none (and get shm/cma, the latency target), and a same-host peer's death is noticed
// by its pid instead, as in the shm backend.
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <exception>
#include <map>
#include <vector>

#include "src/links/common.hpp"
#include "src/wait.hpp"

namespace trellis::transport::links {
namespace {

constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

ucp_tag_t make_tag(int rank, std::uint32_t tag) {
  return (static_cast<ucp_tag_t>(static_cast<std::uint32_t>(rank)) << 32) | tag;
}

void check_ucs(ucs_status_t st, const char* what) {
  if (st != UCS_OK) throw_error(ErrorCode::kIo, "UCX {} failed: {}", what, ucs_status_string(st));
}

class UcxTransport;

// Per-peer state the endpoint's error callback writes.
struct PeerState {
  int peer = -1;
  ucp_ep_h ep = nullptr;
  ucs_status_t failure = UCS_OK;
  bool same_host = false;
  std::int64_t pid = 0;
  Clock::time_point last_check = Clock::now();

  // Slow path of a pending operation: has a same-host peer died? (checked every 100 ms)
  void check_alive() {
    if (!same_host || failure != UCS_OK) return;
    auto now = Clock::now();
    if (now - last_check < std::chrono::milliseconds(100)) return;
    last_check = now;
    if (!process_alive(pid)) failure = UCS_ERR_ENDPOINT_TIMEOUT;
  }
};

// Written by UCX's receive callback. UCX 1.13 fills neither recv_info on immediate
// completion nor the info of ucp_tag_recv_request_test for eager unexpected messages
// (openucx/ucx#9425), so receives always run with a callback and no immediate completion.
struct RecvCompletion {
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::size_t length = 0;
};

void on_recv_complete(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* c = static_cast<RecvCompletion*>(user);
  c->status = status;
  c->length = info ? info->length : 0;
  c->done = true;
}

class UcxRequest final : public LinkRequest {
 public:
  // Requests come and go twice per message on the latency path: recycle their memory
  // per thread instead of calling malloc (a few tens of ns of a ~0.4 us round trip).
  static void* operator new(std::size_t n) {
    auto& pool = free_list();
    if (n != sizeof(UcxRequest) || pool.empty()) return ::operator new(n);
    void* p = pool.back();
    pool.pop_back();
    return p;
  }
  static void operator delete(void* p, std::size_t n) {
    auto& pool = free_list();
    if (n != sizeof(UcxRequest) || pool.size() >= 256) return ::operator delete(p);
    pool.push_back(p);
  }

  UcxRequest(const OpInfo& info, ucp_worker_h worker, PeerState& peer)
      : LinkRequest(info), worker_(worker), peer_(peer) {}
  ~UcxRequest() override {
    if (!req_) return;
    // Cancel a receive; a send cannot be cancelled, give it a moment to drain.
    if (info_.kind == OpKind::kRecv) ucp_request_cancel(worker_, req_);
    auto until = Clock::now() + std::chrono::seconds(1);
    while (!finished() && Clock::now() < until) ucp_worker_progress(worker_);
    ucp_request_free(req_);
  }
  void set(void* req) { req_ = req; }
  void completed_in_place(std::size_t bytes) { done_bytes_ = bytes; }
  RecvCompletion* completion() { return &recv_; }

  bool test() override {
    if (!req_) return true;
    if (!finished()) {
      if (ucp_worker_progress(worker_) != 0) detail::note_progress();
      if (!finished()) {
        // A tag receive is not tied to an endpoint; the peer's failure is.
        if ((++polls_ & 255) == 0) peer_.check_alive();
        if (peer_.failure != UCS_OK) fail(peer_.failure);
        return false;
      }
    }
    ucs_status_t st = info_.kind == OpKind::kRecv ? recv_.status : ucp_request_check_status(req_);
    ucp_request_free(req_);
    req_ = nullptr;
    if (st != UCS_OK) fail(st);
    done_bytes_ = info_.kind == OpKind::kRecv ? recv_.length : info_.bytes;
    return true;
  }

  [[noreturn]] void fail(ucs_status_t st) const {
    if (st == UCS_ERR_MESSAGE_TRUNCATED)
      throw_scoped(ErrorScope::kRequest, ErrorCode::kCorruptInput, "{}: rank {} sent more than the buffer holds",
                   describe(), info_.peer);
    if (peer_.same_host && !process_alive(peer_.pid))
      throw_scoped(ErrorScope::kLink, ErrorCode::kPeerFailed, "{}: rank {} (pid {}, same host) died", describe(),
                   info_.peer, peer_.pid);
    throw_scoped(ErrorScope::kLink, ErrorCode::kPeerFailed, "{}: link to rank {} failed: {}", describe(), info_.peer,
                 ucs_status_string(st));
  }

 private:
  bool finished() const {
    return info_.kind == OpKind::kRecv ? recv_.done : ucp_request_check_status(req_) != UCS_INPROGRESS;
  }

  static std::vector<void*>& free_list() {
    // Leaks at most 256 blocks per thread at exit, by design (no destructor ordering issues).
    thread_local auto* pool = new std::vector<void*>();
    return *pool;
  }

  ucp_worker_h worker_;
  void* req_ = nullptr;
  PeerState& peer_;
  RecvCompletion recv_;
  unsigned polls_ = 0;
};

// Buffers registered with ucp_mem_map, by start address. An operation inside one passes
// its handle (UCP_OP_ATTR_FIELD_MEMH); the lookup is one map search, skipped while empty.
class MemoryRegistry {
 public:
  void add(const std::byte* begin, std::size_t size, ucp_mem_h memh) { regions_[begin] = {size, memh}; }
  void remove(const std::byte* begin) { regions_.erase(begin); }
  ucp_mem_h find(const void* p, std::size_t n) const {
    if (regions_.empty() || !p) return nullptr;
    auto* b = static_cast<const std::byte*>(p);
    auto it = regions_.upper_bound(b);
    if (it == regions_.begin()) return nullptr;
    --it;
    return b + n <= it->first + it->second.size ? it->second.memh : nullptr;
  }

 private:
  struct Region {
    std::size_t size;
    ucp_mem_h memh;
  };
  std::map<const std::byte*, Region> regions_;
};

void set_memh(ucp_request_param_t& p, const MemoryRegistry& reg, const void* data, std::size_t n) {
  if (ucp_mem_h m = reg.find(data, n)) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = m;
  }
}

class UcxLink final : public PeerLink {
 public:
  UcxLink(ucp_worker_h worker, int my_rank, PeerState& peer, const MemoryRegistry& reg)
      : PeerLink(Backend::kUcx, peer.peer), worker_(worker), my_rank_(my_rank), state_(peer), registry_(reg) {}

  RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) override {
    const OpInfo info = op_info(OpKind::kSend, tag, data.size());
    auto r = std::make_unique<UcxRequest>(info, worker_, state_);
    if (state_.failure != UCS_OK) r->fail(state_.failure);
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    set_memh(p, registry_, data.data(), data.size());
    ucs_status_ptr_t sp = ucp_tag_send_nbx(state_.ep, data.data(), data.size(), make_tag(my_rank_, tag), &p);
    if (UCS_PTR_IS_ERR(sp)) r->fail(UCS_PTR_STATUS(sp));
    if (!sp) r->completed_in_place(data.size());  // no string formatting on the fast path
    if (sp) r->set(sp);
    return r;
  }

  RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) override {
    const OpInfo info = op_info(OpKind::kRecv, tag, data.size());
    auto r = std::make_unique<UcxRequest>(info, worker_, state_);
    if (state_.failure != UCS_OK) r->fail(state_.failure);
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    p.cb.recv = on_recv_complete;
    p.user_data = r->completion();
    set_memh(p, registry_, data.data(), data.size());
    ucs_status_ptr_t sp =
        ucp_tag_recv_nbx(worker_, data.data(), data.size(), make_tag(state_.peer, tag), kFullMask, &p);
    if (UCS_PTR_IS_ERR(sp)) r->fail(UCS_PTR_STATUS(sp));
    r->set(sp);
    return r;
  }

 private:
  ucp_worker_h worker_;
  int my_rank_;
  PeerState& state_;
  const MemoryRegistry& registry_;
};

class UcxRegistration final : public Registration {
 public:
  UcxRegistration(ucp_context_h ctx, MemoryRegistry& reg, std::span<std::byte> data, ucp_mem_h memh)
      : ctx_(ctx), reg_(reg), data_(data), memh_(memh) {
    reg_.add(data.data(), data.size(), memh);
  }
  ~UcxRegistration() override {
    reg_.remove(data_.data());
    ucp_mem_unmap(ctx_, memh_);
  }
  std::span<std::byte> data() const override { return data_; }

 private:
  ucp_context_h ctx_;
  MemoryRegistry& reg_;
  std::span<std::byte> data_;
  ucp_mem_h memh_;
};

void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<PeerState*>(arg);
  if (peer->failure == UCS_OK) peer->failure = status;
}

class UcxTransport final : public TransportOf<UcxLink> {
 public:
  UcxTransport() : TransportOf(Backend::kUcx) {
    ucp_config_t* cfg = nullptr;
    check_ucs(ucp_config_read(nullptr, nullptr, &cfg), "ucp_config_read");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG;
    params.name = "trellis";
    ucs_status_t st = ucp_init(&params, cfg, &context_);
    ucp_config_release(cfg);
    check_ucs(st, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // one thread at a time per Transport (link.hpp)
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) {
      ucp_cleanup(context_);
      check_ucs(st, "ucp_worker_create");
    }
  }
  ~UcxTransport() override {
    links_.clear();
    // Torn down while an error unwinds the stack (a peer that stopped answering, a cut
    // link): no peer is waited for, every endpoint is closed by force.
    const bool failing = std::uncaught_exceptions() > 0;
    if (!close_endpoints(failing)) {
      // An endpoint UCX still counts as open makes ucp_worker_destroy assert (a link cut
      // across hosts: 4 of 6 ranks died inside UCX without a word). The process is on its way
      // out; its exit reclaims the worker.
      return;
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  std::vector<std::byte> worker_address() {
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    check_ucs(ucp_worker_get_address(worker_, &addr, &len), "ucp_worker_get_address");
    const auto* p = reinterpret_cast<const std::byte*>(addr);
    std::vector<std::byte> out(p, p + len);
    ucp_worker_release_address(worker_, addr);
    return out;
  }

  void add_peer(int my_rank, int peer, const std::vector<std::byte>& address, bool same_host, std::int64_t pid) {
    auto state = std::make_unique<PeerState>();
    state->peer = peer;
    state->same_host = same_host;
    state->pid = pid;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_endpoint_error;
    ep.err_handler.arg = state.get();
    ucs_status_t st = ucp_ep_create(worker_, &ep, &state->ep);
    if (st != UCS_OK)
      throw_error(ErrorCode::kLinkFailed, "UCX endpoint to rank {} failed: {}", peer, ucs_status_string(st));
    links_.emplace(peer, std::make_unique<UcxLink>(worker_, my_rank, *state, registry_));
    peers_.emplace(peer, std::move(state));
  }

  // Sends a zero-byte message on every endpoint and waits for the peers' ones: the
  // endpoints are wired up (and any failure shows) before connect() returns.
  void warm_up(Deadline d) {
    std::vector<RequestPtr> reqs;
    for (auto& [peer, link] : links_) reqs.push_back(link->irecv({}, 0xffffffffu));
    for (auto& [peer, link] : links_) reqs.push_back(link->isend({}, 0xffffffffu));
    for (auto& r : reqs) r->wait(d);
  }

  Capabilities capabilities() const override { return {false, false, false, 0}; }
  void progress() override {
    if (ucp_worker_progress(worker_) != 0) detail::note_progress();
  }
  std::unique_ptr<Registration> register_buffer(std::span<std::byte> data) override {
    if (data.empty()) return Transport::register_buffer(data);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = data.data();
    mp.length = data.size();
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(context_, &mp, &memh);
    if (st != UCS_OK)
      throw_error(ErrorCode::kResourceExhausted, "ucx: registering {} bytes failed: {}", data.size(),
                  ucs_status_string(st));
    return std::make_unique<UcxRegistration>(context_, registry_, data, memh);
  }
  std::string describe() const override {
    return fmt::format("ucx ({} peers; UCX picks shm in a host, rdma or tcp across)", links_.size());
  }

 private:
  // Flush first so messages already sent are delivered, unless `force` or the peer is known
  // gone (it cannot answer a flush). Returns false when a close did not complete within its
  // wait (a peer behind a cut link never answers): the endpoint is then still open to UCX.
  bool close_endpoints(bool force) {
    bool all_closed = true;
    for (auto& [peer, state] : peers_) {
      if (!state->ep) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = force || state->failure != UCS_OK ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      ucs_status_ptr_t sp = ucp_ep_close_nbx(state->ep, &p);
      state->ep = nullptr;
      if (!UCS_PTR_IS_PTR(sp)) continue;
      auto until = Clock::now() + std::chrono::milliseconds(500);
      while (ucp_request_check_status(sp) == UCS_INPROGRESS && Clock::now() < until) ucp_worker_progress(worker_);
      if (ucp_request_check_status(sp) == UCS_INPROGRESS) {
        ucp_request_cancel(worker_, sp);
        all_closed = false;
      }
      ucp_request_free(sp);
    }
    return all_closed;
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  MemoryRegistry registry_;
  std::map<int, std::unique_ptr<PeerState>> peers_;
};

}  // namespace

std::unique_ptr<Transport> connect_ucx(Bootstrap& world, const std::vector<int>& peers, const Config& config) {
  auto d = Deadline::after(LinkSettings::from(config).connect_timeout);
  std::unique_ptr<UcxTransport> t;
  std::vector<std::byte> mine;
  std::string error;
  try {
    t = std::make_unique<UcxTransport>();
    mine = t->worker_address();
  } catch (const Error& e) {
    error = e.what();
  }
  if (world.any(!error.empty(), d))
    throw_error(ErrorCode::kIo, "ucx setup: {}", error.empty() ? "another rank failed (see its log)" : error);
  auto all = world.allgather(mine, d);
  auto hosts = allgather_strings(world, host_identity(world), d);
  auto pids = allgather_strings(world, std::to_string(getpid()), d);
  for (int p : peers) t->add_peer(world.rank(), p, all[p], hosts[p] == hosts[world.rank()], std::stoll(pids[p]));
  t->warm_up(d);
  return t;
}

}  // namespace trellis::transport::links
