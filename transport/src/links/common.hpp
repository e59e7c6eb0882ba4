// Pieces shared by the link backends: how a request describes itself in errors, the base
// class that stores what describe() needs without formatting anything on the fast path,
// and the per-peer receive bookkeeping of backends that match tags themselves (shm, tcp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
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

// Requests whose state lives in the backend (shm, tcp). LinkT provides drive() (progress of
// the whole transport, so a rank waiting on one peer still feeds the others), check_failed
// (throws naming the peer when the link broke), cancel(RecvOp&) and
// finish_or_abandon(SendOp&).
template <typename LinkT>
class MatchedRecvRequest final : public LinkRequest {
 public:
  MatchedRecvRequest(LinkT& link, std::shared_ptr<RecvOp> op, const OpInfo& info)
      : LinkRequest(info), link_(link), op_(std::move(op)) {}
  ~MatchedRecvRequest() override {
    if (!op_->complete) link_.cancel(*op_);
  }
  bool test() override {
    if (!op_->complete) link_.drive();
    if (!op_->error.empty())
      throw_scoped(ErrorScope::kRequest, ErrorCode::kCorruptInput, "{}: {}", describe(), op_->error);
    if (!op_->complete) {
      link_.check_failed(*this);
      return false;
    }
    done_bytes_ = op_->received;
    return true;
  }

 private:
  LinkT& link_;
  std::shared_ptr<RecvOp> op_;
};

template <typename LinkT>
class MatchedSendRequest final : public LinkRequest {
 public:
  MatchedSendRequest(LinkT& link, std::shared_ptr<SendOp> op, const OpInfo& info)
      : LinkRequest(info), link_(link), op_(std::move(op)) {}
  ~MatchedSendRequest() override {
    if (!op_->complete) link_.finish_or_abandon(*op_);
  }
  bool test() override {
    if (!op_->complete) link_.drive();
    if (!op_->complete) {
      link_.check_failed(*this);
      return false;
    }
    done_bytes_ = op_->data.size();
    return true;
  }

 private:
  LinkT& link_;
  std::shared_ptr<SendOp> op_;
};

}  // namespace trellis::transport::links
