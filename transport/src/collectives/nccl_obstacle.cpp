// nccl_group_obstacle (nccl_group.hpp): plain arithmetic over the placement, in every build,
// so that the engine can say why a TP group stays on host memory before any GPU is touched.
#include <fmt/format.h>

#include <map>
#include <utility>

#include "trellis/transport/nccl_group.hpp"

namespace trellis::transport {

std::string nccl_group_obstacle(const std::vector<int>& members, const std::vector<int>& hosts,
                                const std::vector<int>& gpus) {
  std::map<std::pair<int, int>, int> first;  // (host, gpu) -> first member seen there
  for (int r : members) {
    const auto i = static_cast<std::size_t>(r);
    if (i >= hosts.size() || i >= gpus.size()) return fmt::format("rank {} has no known host or GPU", r);
    auto [it, fresh] = first.emplace(std::make_pair(hosts[i], gpus[i]), r);
    if (!fresh)
      return fmt::format("ranks {} and {} share GPU {} of host {} (NCCL needs one GPU per rank of a communicator)",
                         it->second, r, gpus[i], hosts[i]);
  }
  return "";
}

}  // namespace trellis::transport
