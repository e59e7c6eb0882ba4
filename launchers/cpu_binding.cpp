#include "cpu_binding.hpp"

#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "trellis/core/process.hpp"
#include "trellis/topology/binding.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::launchers {
namespace {

int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v = fallback;
  if (!(in >> v)) return fallback;
  return v;
}

// Physical core of every CPU up to the highest allowed one (package and core id from sysfs;
// a number of its own where sysfs does not say).
std::vector<int> core_ids(const std::vector<int>& cpus) {
  std::vector<int> core(cpus.empty() ? 0 : static_cast<std::size_t>(cpus.back() + 1), -1);
  for (std::size_t c = 0; c < core.size(); ++c) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const int pkg = read_int(dir + "physical_package_id", -1), id = read_int(dir + "core_id", -1);
    core[c] = pkg < 0 || id < 0 ? (1 << 20) + static_cast<int>(c) : pkg * 65536 + id;
  }
  return core;
}

// What tells machines apart: the kernel's boot id. Emulated hosts (network and UTS
// namespaces of one machine, scripts/cluster) have hostnames of their own but share the
// CPUs, so their ranks must be bound as one machine's.
std::string machine_id(const std::string& hostname) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (std::getline(in, id) && !id.empty()) return id;
  return "host:" + hostname;
}

// "CPU 3", "CPUs 0-7", "CPUs 0-3,8-11": runs of consecutive CPUs joined.
std::string cpu_list(const std::vector<int>& cpus) {
  if (cpus.empty()) return "no CPU";
  std::vector<int> c = cpus;
  std::sort(c.begin(), c.end());
  std::string out = c.size() == 1 ? "CPU " : "CPUs ";
  for (std::size_t i = 0; i < c.size();) {
    std::size_t j = i;
    while (j + 1 < c.size() && c[j + 1] == c[j] + 1) ++j;
    out += fmt::format("{}{}", i ? "," : "", c[i]);
    if (j > i) out += fmt::format("-{}", c[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

void bind_host_ranks(Session& s) {
  if (s.size() < 2 || !s.config.get_bool("comm.bind_cores")) return;
  const auto cpus = allowed_cpus();
  const std::string machine = machine_id(s.world().hostname());
  const nlohmann::json me = {{"machine", machine}, {"cpus", cpus}, {"cores", core_ids(cpus)}};
  const auto all = transport::allgather_strings(s.world(), me.dump(), s.deadline());
  // Group this rank's host mates (in rank order) with what each may run on.
  std::vector<std::vector<int>> allowed;
  std::vector<int> ranks, cores;
  int mine = -1;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto j = nlohmann::json::parse(all[static_cast<std::size_t>(r)]);
    if (j.at("machine").get<std::string>() != machine) continue;
    if (r == s.rank()) mine = static_cast<int>(ranks.size());
    ranks.push_back(r);
    allowed.push_back(j.at("cpus").get<std::vector<int>>());
    if (r == s.rank()) cores = j.at("cores").get<std::vector<int>>();
  }
  const auto plan = topology::plan_core_binding(allowed, ranks, s.world().hostname(), cores);
  const bool first = !ranks.empty() && ranks.front() == s.rank();
  if (first && !plan.warning.empty()) spdlog::warn("{}", plan.warning);
  if (!plan.changed() || mine < 0) return;
  const auto& to = plan.cpus[static_cast<std::size_t>(mine)];
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : to) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    spdlog::warn("rank {}: could not bind to {} (comm.bind_cores): {}", s.rank(), cpu_list(to), std::strerror(errno));
    return;
  }
  if (first) {
    std::string list;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      list += fmt::format("{}rank {} -> {}", i ? ", " : "", ranks[i], cpu_list(plan.cpus[i]));
    spdlog::info("host {}: the launcher left {} ranks free to share CPUs; bound {} (comm.bind_cores=false keeps the "
                 "launcher's binding)", s.world().hostname(), ranks.size(), list);
  }
}

}  // namespace trellis::launchers
