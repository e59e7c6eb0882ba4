#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport {
namespace {

std::string os_hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

class LocalBootstrap final : public Bootstrap {
 public:
  LocalBootstrap() : host_(os_hostname()) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& hostname() const override { return host_; }
  bool is_mpi() const override { return false; }
  void barrier(Deadline) override {}
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine, Deadline) override {
    return {std::vector<std::byte>(mine.begin(), mine.end())};
  }
  void broadcast(std::vector<std::byte>&, int root, Deadline) override { check_peer(root, "broadcast"); }
  bool any(bool mine, Deadline) override { return mine; }
  double max(double mine, Deadline) override { return mine; }
  void send(int peer, int, std::span<const std::byte>, Deadline) override { check_peer(peer, "send"); }
  void recv(int peer, int, std::span<std::byte>, Deadline) override { check_peer(peer, "recv"); }
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in, int,
                Deadline) override {
    check_peer(to, "sendrecv");
    check_peer(from, "sendrecv");
    if (in.size() != out.size())
      throw_error(ErrorCode::kCorruptInput, "sendrecv to self: sent {} bytes, expected {}", out.size(), in.size());
    std::copy(out.begin(), out.end(), in.begin());
  }
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }

 private:
  static void check_peer(int peer, const char* op) {
    if (peer != 0) throw_error(ErrorCode::kInvalidArgument, "{} to rank {} in a world of one rank", op, peer);
  }
  std::string host_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_local_bootstrap() { return std::make_unique<LocalBootstrap>(); }

std::vector<std::string> allgather_strings(Bootstrap& world, const std::string& mine, Deadline deadline) {
  auto parts = world.allgather(std::as_bytes(std::span(mine.data(), mine.size())), deadline);
  std::vector<std::string> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.emplace_back(reinterpret_cast<const char*>(p.data()), p.size());
  return out;
}

}  // namespace trellis::transport
