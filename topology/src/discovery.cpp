// Live discovery, XML files and gathering across ranks: three ways to the same Host value.
#include "trellis/topology/discovery.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>

#include "hwloc_reader.hpp"
#include "json_detail.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::topology {
namespace {

struct HwlocDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using HwlocPtr = std::unique_ptr<hwloc_topology, HwlocDeleter>;

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(trim(line));
}

// The version attribute of <topology version="...">, "" when not found in the head.
std::string xml_version(const std::string& head) {
  static const std::regex re(R"(<topology[^>]*version="([^"]*)\")");
  std::smatch m;
  return std::regex_search(head, m, re) ? m[1].str() : std::string();
}

// Why hwloc refused a file, in words a user can act on.
std::string hwloc_hint(const std::string& head) {
  const std::string v = xml_version(head);
  if (head.find("<topology") == std::string::npos)
    return "no <topology> element in the first 4 KiB: not an hwloc XML export";
  if (!v.empty() && v[0] != '2' && v[0] != '1')
    return fmt::format("the file is hwloc XML version {}; hwloc {} reads versions 1.x and 2.x", v, HWLOC_VERSION);
  return "the XML is malformed or truncated";
}

}  // namespace

Host load_xml_host(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw_error(ErrorCode::kNotFound, "topology file '{}' does not exist", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kIo, "topology file '{}' cannot be read: {}", path, std::strerror(errno));
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  if (head.empty()) throw_error(ErrorCode::kCorruptInput, "topology file '{}' is empty", path);

  detail::XmlSource src;
  src.path = path;
  src.what = fmt::format("topology file '{}'", path);
  src.hint = hwloc_hint(head);
  src.source = "xml:" + path;
  Host host = detail::host_from_xml_isolated(src);
  if (host.name.empty()) {
    std::string stem = std::filesystem::path(path).stem().string();
    if (starts_with(stem, "hwloc-")) stem = stem.substr(6);
    host.name = stem;
  }
  host.boot_id = "xml:" + std::filesystem::path(path).filename().string();
  return host;
}

Topology load_xml_hosts(const std::vector<std::string>& specs) {
  static const std::regex count_re(R"(^(\d+)\s*(?:x|X|\xC3\x97)\s*(.+)$)");  // N x F, N×F
  Topology topo;
  std::map<std::string, Host> cache;  // one hwloc load per distinct file
  for (const auto& spec : specs) {
    int copies = 1;
    std::string path = spec;
    std::smatch m;
    if (!std::filesystem::exists(spec) && std::regex_match(spec, m, count_re)) {
      copies = static_cast<int>(parse_int(m[1].str(), fmt::format("--topo-file '{}': host count", spec)));
      path = m[2].str();
      if (copies < 1 || copies > 4096)
        throw_error(ErrorCode::kInvalidArgument, "--topo-file '{}': host count {} is not in 1..4096", spec, copies);
    }
    auto it = cache.find(path);
    if (it == cache.end()) it = cache.emplace(path, load_xml_host(path)).first;
    for (int i = 0; i < copies; ++i) topo.hosts.push_back(it->second);
  }
  if (topo.hosts.empty()) throw_error(ErrorCode::kInvalidArgument, "no topology file given");
  // Copies of one machine must still be distinct hosts: suffix repeated names.
  std::map<std::string, int> seen, next;
  for (const auto& h : topo.hosts) ++seen[h.name];
  for (auto& h : topo.hosts) {
    if (seen[h.name] < 2) continue;
    const int k = next[h.name]++;
    h.boot_id += fmt::format("#{}", k);
    h.name += fmt::format("-{}", k);
  }
  topo.fabric = derive_fabric(topo.hosts);
  return topo;
}

Host discover_local_host(const DiscoverOptions& options) {
  HwlocPtr topo(detail::open_hwloc_topology());
  if (hwloc_topology_load(topo.get()) != 0)
    throw_error(ErrorCode::kInternal, "hwloc cannot discover this machine: {}", std::strerror(errno));
  Host host = detail::host_from_hwloc(topo.get(), "hwloc");
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) host.name = name;
  host.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  if (host.boot_id.empty()) host.notes.push_back("boot id unreadable: hosts are told apart by hostname only");
  if (options.use_nvml) detail::add_nvml_links(host);
  else host.notes.push_back("NVML not consulted (disabled): no NVLink information");
  detail::add_sysfs_rates(host);
  if (options.use_ucx) detail::add_ucx_devices(host);  // after sysfs: rates for what hwloc knows
  return host;
}

Topology gather_topology(const Host& mine, int my_rank, int pid, std::vector<int> bound_pus,
                         const AllgatherFn& allgather) {
  nlohmann::json me = {{"rank", my_rank}, {"pid", pid}, {"bound", bound_pus},
                       {"host", detail::host_to_json(mine)}};
  const std::vector<std::string> all = allgather(me.dump());
  Topology topo;
  std::map<std::pair<std::string, std::string>, int> host_index;
  for (std::size_t r = 0; r < all.size(); ++r) {
    try {
      auto j = nlohmann::json::parse(all[r]);
      Host h = detail::host_from_json(j.at("host"));
      auto key = std::make_pair(h.name, h.boot_id);
      auto it = host_index.find(key);
      if (it == host_index.end()) {
        it = host_index.emplace(key, static_cast<int>(topo.hosts.size())).first;
        topo.hosts.push_back(std::move(h));
      }
      RankInfo info;
      info.rank = static_cast<int>(r);
      info.host = it->second;
      info.pid = j.at("pid").get<int>();
      info.bound_pus = j.at("bound").get<std::vector<int>>();
      topo.ranks.push_back(std::move(info));
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kCorruptInput, "topology from rank {} does not parse: {}", r, e.what());
    }
  }
  topo.fabric = derive_fabric(topo.hosts);
  return topo;
}

void add_nvml_links(Host& host) { detail::add_nvml_links(host); }

}  // namespace trellis::topology
