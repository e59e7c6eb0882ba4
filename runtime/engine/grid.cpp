// Where every rank sits (EngineGrid) and whom each rank talks to (engine_peers): pure
// functions of the grid, split from the engine's threads in engine.cpp.
#include <algorithm>

#include "engine_internal.hpp"

namespace trellis::runtime {

int EngineGrid::stage_of(int rank) const {
  auto it = std::find(rank_of.begin(), rank_of.end(), rank);
  if (it == rank_of.end()) throw_error(ErrorCode::kInvalidArgument, "rank {} is not in the {}x{} grid", rank, pp, tp);
  return static_cast<int>(it - rank_of.begin()) / tp;
}

int EngineGrid::tp_of(int rank) const {
  auto it = std::find(rank_of.begin(), rank_of.end(), rank);
  if (it == rank_of.end()) throw_error(ErrorCode::kInvalidArgument, "rank {} is not in the {}x{} grid", rank, pp, tp);
  return static_cast<int>(it - rank_of.begin()) % tp;
}

EngineGrid EngineGrid::contiguous(int pp, int tp, std::vector<int> host_of) {
  EngineGrid g;
  g.pp = pp;
  g.tp = tp;
  for (int r = 0; r < pp * tp; ++r) g.rank_of.push_back(r);
  g.host_of = host_of.empty() ? std::vector<int>(static_cast<std::size_t>(pp * tp), 0) : std::move(host_of);
  return g;
}

namespace detail {
// Lowest rank of each host (the ring producer there: rank 0 on its host, a relay elsewhere).
std::vector<int> host_leaders(const EngineGrid& g) {
  std::vector<int> leaders;
  std::vector<int> seen;
  for (int r = 0; r < static_cast<int>(g.host_of.size()); ++r) {
    int h = g.host_of[static_cast<std::size_t>(r)];
    if (std::find(seen.begin(), seen.end(), h) != seen.end()) continue;
    seen.push_back(h);
    leaders.push_back(r);
  }
  return leaders;
}
}  // namespace detail

std::vector<int> engine_peers(const EngineGrid& g, int rank) {
  std::vector<int> peers;
  auto add = [&](int p) {
    if (p != rank && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  };
  const int s = g.stage_of(rank), k = g.tp_of(rank), sampler = g.sampler_rank();
  if (s > 0) add(g.rank_at(s - 1, k));
  if (s + 1 < g.pp) add(g.rank_at(s + 1, k));
  if (rank == sampler) {
    for (int j = 0; j < g.tp; ++j) add(g.rank_at(g.pp - 1, j));
    add(0);
  }
  if (s == g.pp - 1) add(sampler);
  if (rank == 0) add(sampler);
  // Serving metrics: each middle stage's TP rank 0 reports its time shares to rank 0.
  if (rank == 0)
    for (int m = 1; m < g.pp - 1; ++m) add(g.rank_at(m, 0));
  if (s > 0 && s < g.pp - 1 && k == 0) add(0);
  const int h0 = g.host_of[0];
  for (int leader : detail::host_leaders(g)) {
    if (g.host_of[static_cast<std::size_t>(leader)] == h0) continue;
    if (rank == 0) add(leader);
    if (rank == leader) add(0);
  }
  std::sort(peers.begin(), peers.end());
  return peers;
}

}  // namespace trellis::runtime
