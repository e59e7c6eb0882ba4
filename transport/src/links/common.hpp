// Pieces shared by the link backends: how a request describes itself in errors, the base
// classes of every request, link and transport (what describe(), peer(), backend() and
// link(peer) need, without formatting anything on the fast path), and the per-peer send
// and receive bookkeeping of the backends that match tags themselves (shm, tcp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "trellis/core/process.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/link.hpp"
#include "trellis/transport/request.hpp"

namespace trellis::transport::links {

enum class OpKind : std::uint8_t { kSend, kRecv };

// What an operation is; formatted only when an error or a log needs it.
struct OpInfo {
  OpKind kind = OpKind::kSend;
  Backend backend = Backend::kMpi;
  int peer = -1;
  std::uint32_t tag = 0;
  std::size_t bytes = 0;  // buffer size
};

// "receive of 4 KiB from rank 3 (tag 7) over ucx"
std::string describe_op(const OpInfo& op);

class LinkRequest : public Request {
 public:
  explicit LinkRequest(const OpInfo& info) : info_(info) {}
  std::size_t bytes() const override { return done_bytes_; }
  std::string describe() const override { return describe_op(info_); }

 protected:
  OpInfo info_;
  std::size_t done_bytes_ = 0;
};

// What every backend's Link holds: its peer and backend, and the OpInfo of an operation.
class PeerLink : public Link {
 public:
  PeerLink(Backend backend, int peer) : backend_(backend), peer_(peer) {}
  int peer() const final { return peer_; }
  Backend backend() const final { return backend_; }

 protected:
  OpInfo op_info(OpKind kind, std::uint32_t tag, std::size_t bytes) const {
    return {kind, backend_, peer_, tag, bytes};
  }

  const Backend backend_;
  const int peer_;
};

// Throws kInvalidArgument: "<backend> transport has no link to rank <peer> (not in its peer list)".
[[noreturn]] void throw_no_link(Backend backend, int peer);

// What every backend's Transport holds: its links by peer (world rank), and link(peer).
template <typename LinkT>
class TransportOf : public Transport {
 public:
  explicit TransportOf(Backend backend) : backend_(backend) {}
  Backend backend() const final { return backend_; }
  Link& link(int peer) final { return find(peer); }

 protected:
  LinkT& find(int peer) const {
    auto it = links_.find(peer);
    if (it == links_.end()) throw_no_link(backend_, peer);
    return *it->second;
  }

  std::map<int, std::unique_ptr<LinkT>> links_;

 private:
  const Backend backend_;
};

// Settings every backend reads, resolved once at connect time.
struct LinkSettings {
  Millis connect_timeout{20000};
  Millis deadline{30000};
  static LinkSettings from(const Config& config);
};

// Checks a peer list for connect(): valid world ranks, no duplicates, not this rank.
void check_peers(const Bootstrap& world, const std::vector<int>& peers, Backend backend);

// A random 128-bit value drawn on world rank 0 and broadcast to every rank, as 32 hex
// characters. Names shared-memory segments and authenticates TCP connections, so two jobs
// on one host never see each other's messages.
std::string job_token(Bootstrap& world, Deadline deadline);

// "hostname/boot-id": equal for two ranks exactly when they share a kernel and a hostname
// (the emulated cluster's hosts share a kernel but not a hostname).
std::string host_identity(const Bootstrap& world);
// Whether a process of this host still runs: core's (a zombie counts as dead).
using ::trellis::process_alive;

// Returns the Transport for one backend (defined in links/<backend>/).
std::unique_ptr<Transport> connect_mpi(Bootstrap& world, const std::vector<int>& peers, const Config& config);
std::unique_ptr<Transport> connect_shm(Bootstrap& world, const std::vector<int>& peers, const Config& config);
std::unique_ptr<Transport> connect_ucx(Bootstrap& world, const std::vector<int>& peers, const Config& config);
std::unique_ptr<Transport> connect_tcp(Bootstrap& world, const std::vector<int>& peers, const Config& config);
std::unique_ptr<Transport> connect_nccl(Bootstrap& world, const std::vector<int>& peers, const Config& config);

// Tag matching for backends that receive a byte stream per peer (shm, tcp): posted
// receives wait in order per tag; a message that arrives before its receive is kept whole
// in `unexpected` (copied), which is what keeps different tags independent.
struct RecvOp {
  std::span<std::byte> buffer;
  std::uint32_t tag = 0;
  std::size_t received = 0;  // bytes that arrived (the message size once complete)
  bool complete = false;
  bool cancelled = false;    // the request was destroyed; drop what arrives for it
  std::string error;         // set when the message could not be delivered (too large)
};

struct SendOp {
  std::span<const std::byte> data;
  std::uint32_t tag = 0;
  std::size_t sent = 0;
  bool complete = false;
};

struct UnexpectedMessage {
  std::uint32_t tag = 0;
  std::vector<std::byte> data;
};

// "rank 3 sent 8192 bytes, more than the 4096-byte buffer holds": a receive's error.
std::string too_large(int peer, std::size_t sent, std::size_t buffer);

class TagMatcher {
 public:
  // A new receive: served at once from an unexpected message of the same tag if one waits
  // (when it does not fit, op->error says so and the message is dropped), else queued.
  void post(const std::shared_ptr<RecvOp>& op, const OpInfo& info);
  // The posted receive that the next message with `tag` belongs to, or nullptr.
  std::shared_ptr<RecvOp> match(std::uint32_t tag);
  void add_unexpected(UnexpectedMessage m) { unexpected_.push_back(std::move(m)); }
  void remove(const RecvOp* op);

 private:
  std::deque<std::shared_ptr<RecvOp>> posted_;
  std::deque<UnexpectedMessage> unexpected_;
};

// The message a stream link is reading from its peer: where its bytes go (the posted
// receive of its tag, a copy kept for a receive not posted yet, or nowhere when it is too
// large for the receive it matched or that receive was cancelled).
struct IncomingMessage {
  bool active = false;
  bool discard = false;  // too large for its receive: read and dropped
  std::uint32_t tag = 0;
  std::uint64_t total = 0, got = 0;
  std::shared_ptr<RecvOp> dest;
  std::vector<std::byte> unexpected;

  // The header of a message of `total` bytes on `tag` from `peer` arrived.
  void start(TagMatcher& matcher, std::uint32_t t, std::uint64_t n, int peer) {
    *this = IncomingMessage{};
    active = true;
    tag = t;
    total = n;
    dest = matcher.match(tag);
    if (dest && total > dest->buffer.size()) {
      dest->error = too_large(peer, total, dest->buffer.size());
      dest.reset();
      discard = true;
    } else if (!dest) {
      unexpected.resize(total);
    }
  }
  // Where the next payload byte goes, or nullptr when it is dropped.
  std::byte* target() {
    if (dest) return dest->cancelled ? nullptr : dest->buffer.data() + got;
    return discard ? nullptr : unexpected.data() + got;
  }
  // Every byte arrived: the receive completes, or the copy goes to a receive posted while
  // it arrived, or it waits as an unexpected message.
  void finish(TagMatcher& matcher, int peer) {
    active = false;
    if (dest) {
      dest->received = total;
      dest->complete = true;
    } else if (!discard) {
      if (auto late = matcher.match(tag)) {
        if (total > late->buffer.size()) {
          late->error = too_large(peer, total, late->buffer.size());
        } else {
          std::memcpy(late->buffer.data(), unexpected.data(), total);
          late->received = total;
          late->complete = true;
        }
      } else {
        matcher.add_unexpected({tag, std::move(unexpected)});
      }
    }
    dest.reset();
  }
};

// A request whose state lives in its link (shm, tcp). LinkT provides drive() (progress of
// the whole transport, so a rank waiting on one peer still feeds the others),
// check_failed(request) (throws naming the peer when the link broke), cancel(RecvOp&) and
// finish_or_abandon(SendOp&).
template <typename LinkT, typename OpT>
class MatchedRequest final : public LinkRequest {
  static constexpr bool kRecv = std::is_same_v<OpT, RecvOp>;

 public:
  MatchedRequest(LinkT& link, std::shared_ptr<OpT> op, const OpInfo& info)
      : LinkRequest(info), link_(link), op_(std::move(op)) {}
  ~MatchedRequest() override {
    if (op_->complete) return;
    if constexpr (kRecv) link_.cancel(*op_);
    else link_.finish_or_abandon(*op_);
  }
  bool test() override {
    if (!op_->complete) link_.drive();
    if constexpr (kRecv)
      if (!op_->error.empty())
        throw_scoped(ErrorScope::kRequest, ErrorCode::kCorruptInput, "{}: {}", describe(), op_->error);
    if (!op_->complete) {
      link_.check_failed(*this);
      return false;
    }
    if constexpr (kRecv) done_bytes_ = op_->received;
    else done_bytes_ = op_->data.size();
    return true;
  }

 private:
  LinkT& link_;
  std::shared_ptr<OpT> op_;
};

// The Link of a backend that matches tags itself over a byte stream per peer (shm, tcp):
// isend queues the message and lets the link write what it can now (Derived::queue_send),
// irecv posts the receive and lets it read what has arrived (Derived::receive_now); both
// fail at once on a broken link. Derived also provides what MatchedRequest needs (the
// calls are static: no virtual call beyond Link's own).
template <typename Derived>
class StreamLink : public PeerLink {
 public:
  using PeerLink::PeerLink;

  RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) final {
    const OpInfo info = op_info(OpKind::kSend, tag, data.size());
    throw_if_failed(info);
    auto op = std::make_shared<SendOp>();
    op->data = data;
    op->tag = tag;
    self().queue_send(op);
    return std::make_unique<MatchedRequest<Derived, SendOp>>(self(), std::move(op), info);
  }
  RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) final {
    const OpInfo info = op_info(OpKind::kRecv, tag, data.size());
    throw_if_failed(info);
    auto op = std::make_shared<RecvOp>();
    op->buffer = data;
    op->tag = tag;
    matcher_.post(op, info);
    self().receive_now();
    return std::make_unique<MatchedRequest<Derived, RecvOp>>(self(), std::move(op), info);
  }
  // For MatchedRequest: a receive destroyed unfinished drops what arrives for it.
  void cancel(RecvOp& op) {
    op.cancelled = true;
    matcher_.remove(&op);
  }

 protected:
  void throw_if_failed(const OpInfo& info) const {
    if (!failed_.empty()) throw_scoped(ErrorScope::kLink, failed_code_, "{}: {}", describe_op(info), failed_);
  }

  TagMatcher matcher_;
  IncomingMessage cur_;
  std::string failed_;  // why the link broke; empty while it works
  ErrorCode failed_code_ = ErrorCode::kPeerFailed;

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace trellis::transport::links
