// connect() and the backend names: the one place that knows which backends were built.
#include <array>

#include "src/links/common.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::transport {

namespace {
constexpr std::array<std::string_view, 5> kNames = {"shm", "ucx", "tcp", "mpi", "nccl"};
}

std::string_view to_string(Backend b) { return kNames[static_cast<std::size_t>(b)]; }

Backend parse_backend(std::string_view name) {
  auto lower = to_lower(trim(name));
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (lower == kNames[i]) return static_cast<Backend>(i);
  throw_error(ErrorCode::kInvalidArgument, "unknown transport '{}': valid names are shm, ucx, tcp, mpi, nccl", name);
}

PollPolicy wait_policy(const Config& config) {
  auto count = [&](const char* name) {
    auto v = config.get_int(name);
    if (v < 0) throw_error(ErrorCode::kInvalidArgument, "{} must not be negative (got {})", name, v);
    return v;
  };
  PollPolicy p;
  p.spins = static_cast<unsigned>(count("comm.wait_spins"));
  p.yields = static_cast<unsigned>(count("comm.wait_yields"));
  p.sleep = std::chrono::microseconds(count("comm.wait_sleep_us"));
  return p;
}

std::vector<Backend> built_backends() {
  std::vector<Backend> out = {Backend::kShm, Backend::kUcx, Backend::kTcp, Backend::kMpi};
#ifdef TRELLIS_HAVE_NCCL
  out.push_back(Backend::kNccl);
#endif
  return out;
}

namespace links {
#ifndef TRELLIS_HAVE_NCCL
std::unique_ptr<Transport> connect_nccl(Bootstrap&, const std::vector<int>&, const Config&) {
  throw_error(ErrorCode::kUnsupported, "the nccl link is not built: this build has no CUDA/NCCL");
}
#endif
}  // namespace links

namespace {
class PlainRegistration final : public Registration {
 public:
  explicit PlainRegistration(std::span<std::byte> data) : data_(data) {}
  std::span<std::byte> data() const override { return data_; }

 private:
  std::span<std::byte> data_;
};
}  // namespace

std::unique_ptr<Registration> Transport::register_buffer(std::span<std::byte> data) {
  return std::make_unique<PlainRegistration>(data);
}

std::unique_ptr<Transport> connect(Backend backend, Bootstrap& world, const std::vector<int>& peers,
                                   const Config& config) {
  links::check_peers(world, peers, backend);
  switch (backend) {
    case Backend::kMpi: return links::connect_mpi(world, peers, config);
    case Backend::kShm: return links::connect_shm(world, peers, config);
    case Backend::kUcx: return links::connect_ucx(world, peers, config);
    case Backend::kTcp: return links::connect_tcp(world, peers, config);
    case Backend::kNccl: return links::connect_nccl(world, peers, config);
  }
  throw_error(ErrorCode::kInternal, "connect: backend {} not handled", static_cast<int>(backend));
}

}  // namespace trellis::transport
