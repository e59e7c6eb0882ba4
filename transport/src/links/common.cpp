#include "src/links/common.hpp"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <array>
#include <random>
#include <set>

#include "trellis/core/strings.hpp"

namespace trellis::transport::links {

std::string describe_op(const OpInfo& op) {
  const bool send = op.kind == OpKind::kSend;
  return fmt::format("{} of {} {} rank {} (tag {}) over {}", send ? "send" : "receive",
                     format_bytes(static_cast<double>(op.bytes)), send ? "to" : "from", op.peer, op.tag,
                     to_string(op.backend));
}

void throw_no_link(Backend backend, int peer) {
  throw_error(ErrorCode::kInvalidArgument, "{} transport has no link to rank {} (not in its peer list)",
              to_string(backend), peer);
}

std::string too_large(int peer, std::size_t sent, std::size_t buffer) {
  return fmt::format("rank {} sent {} bytes, more than the {}-byte buffer holds", peer, sent, buffer);
}

LinkSettings LinkSettings::from(const Config& config) {
  LinkSettings s;
  s.connect_timeout = config.get_duration("comm.connect_timeout_ms");
  s.deadline = config.get_duration("comm.deadline_ms");
  return s;
}

void check_peers(const Bootstrap& world, const std::vector<int>& peers, Backend backend) {
  std::set<int> seen;
  for (int p : peers) {
    if (p < 0 || p >= world.size())
      throw_error(ErrorCode::kInvalidArgument, "{} link to rank {}: the world has ranks 0..{}", to_string(backend), p,
                  world.size() - 1);
    if (p == world.rank())
      throw_error(ErrorCode::kInvalidArgument, "{} link from rank {} to itself", to_string(backend), p);
    if (!seen.insert(p).second)
      throw_error(ErrorCode::kInvalidArgument, "{} link to rank {} listed twice", to_string(backend), p);
  }
}

std::string job_token(Bootstrap& world, Deadline deadline) {
  std::vector<std::byte> token;
  if (world.rank() == 0) {
    std::random_device rd;  // the kernel's CSPRNG on Linux
    token.resize(16);
    for (auto& b : token) b = static_cast<std::byte>(rd() & 0xff);
  }
  world.broadcast(token, 0, deadline);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (auto b : token) {
    out += kHex[static_cast<unsigned>(b) >> 4];
    out += kHex[static_cast<unsigned>(b) & 15];
  }
  return out;
}

std::string host_identity(const Bootstrap& world) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  return world.hostname() + "/" + boot;
}

void TagMatcher::post(const std::shared_ptr<RecvOp>& op, const OpInfo& info) {
  auto it = std::find_if(unexpected_.begin(), unexpected_.end(),
                         [&](const UnexpectedMessage& m) { return m.tag == op->tag; });
  // A receive posted after an earlier one of the same tag must not overtake it.
  bool earlier_waiting = std::any_of(posted_.begin(), posted_.end(),
                                     [&](const auto& p) { return p->tag == op->tag; });
  if (it == unexpected_.end() || earlier_waiting) {
    posted_.push_back(op);
    return;
  }
  if (it->data.size() > op->buffer.size()) {
    // Reported by the request's test(), like a message that arrives later.
    op->error = too_large(info.peer, it->data.size(), op->buffer.size());
    unexpected_.erase(it);
    return;
  }
  std::copy(it->data.begin(), it->data.end(), op->buffer.begin());
  op->received = it->data.size();
  op->complete = true;
  unexpected_.erase(it);
}

std::shared_ptr<RecvOp> TagMatcher::match(std::uint32_t tag) {
  auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& p) { return p->tag == tag; });
  if (it == posted_.end()) return nullptr;
  auto op = *it;
  posted_.erase(it);
  return op;
}

void TagMatcher::remove(const RecvOp* op) {
  auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& p) { return p.get() == op; });
  if (it != posted_.end()) posted_.erase(it);
}

}  // namespace trellis::transport::links
