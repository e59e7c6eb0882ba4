#include "trellis/topology/binding.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace trellis::topology {

bool CoreBinding::changed() const {
  return std::any_of(cpus.begin(), cpus.end(), [](const auto& c) { return !c.empty(); });
}

CoreBinding plan_core_binding(const std::vector<std::vector<int>>& allowed, const std::vector<int>& ranks,
                              const std::string& host, const std::vector<int>& core_of_cpu) {
  CoreBinding b;
  const std::size_t n = allowed.size();
  b.cpus.resize(n);
  if (n < 2) return b;
  std::set<int> all;
  std::size_t total = 0;
  for (const auto& a : allowed) {
    if (a.empty()) return b;  // unknown affinity: nothing to reason about
    all.insert(a.begin(), a.end());
    total += a.size();
  }
  if (total == all.size()) return b;  // pairwise disjoint already (the launcher bound them)
  if (all.size() < n) {
    b.warning = fmt::format("host {}: {} ranks ({}) share {} CPU{} ({}): they take turns on the cores, so timings "
                            "are slower and noisier than with a core each",
                            host, n, fmt::join(ranks, ", "), all.size(), all.size() == 1 ? "" : "s", fmt::join(all, ","));
    return b;
  }
  // Physical cores in core order, each with its CPUs (hardware threads) in CPU order.
  std::map<int, std::vector<int>> by_core;
  for (int c : all)
    by_core[static_cast<std::size_t>(c) < core_of_cpu.size() ? core_of_cpu[static_cast<std::size_t>(c)] : (1 << 20) + c]
        .push_back(c);
  if (by_core.size() >= n) {
    // A share of whole cores each, in rank order (a stage's TP ranks side by side): a rank
    // runs several threads (scheduler, sampler, forward, kernel workers), and a GPU rank's
    // engine threads poll only with cores to spare (run.host_waits). The first
    // cores % ranks ranks take one core more, so no core is left out.
    std::vector<std::vector<int>> cores;
    for (auto& [core, cpus] : by_core) cores.push_back(std::move(cpus));
    const std::size_t per = cores.size() / n, extra = cores.size() % n;
    std::size_t next = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < per + (i < extra ? 1 : 0); ++k, ++next)
        b.cpus[i].insert(b.cpus[i].end(), cores[next].begin(), cores[next].end());
    return b;
  }
  // Fewer cores than ranks but a CPU each: one hardware thread each, the first thread of
  // every core before any second one (siblings share a core's caches and units).
  std::vector<std::pair<std::pair<int, int>, int>> order;  // ((thread rank within its core, core), cpu)
  std::map<int, int> threads_seen;
  for (int c : all) {
    const int core = static_cast<std::size_t>(c) < core_of_cpu.size() ? core_of_cpu[static_cast<std::size_t>(c)] : (1 << 20) + c;
    order.push_back({{threads_seen[core]++, core}, c});
  }
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < n; ++i) b.cpus[i] = {order[i].second};
  return b;
}

}  // namespace trellis::topology
