// Placement of the PP × TP grid on a Topology: a pure function
//   place(model shape, topology, p, t, options) -> Placement
// that says, for every rank, its (stage, tp index), host, GPU or core set, NUMA node and
// NIC, plus the link class of every TP group and every stage boundary.
//
// Policy (see docs/topology.md): TP groups stay inside the fastest domain available — an
// NVLink island, else one host (PCIe / shared memory), else a NUMA node for CPU ranks;
// stage boundaries cross hosts only where they must; each rank uses the NIC closest to it;
// CPU ranks get disjoint core sets on their NUMA node. The MPI-rank -> grid mapping is the
// placement's choice (Placement::ranks is indexed by MPI rank).
//
// Validation throws Error{kInvalidArgument} naming the constraint that failed:
//   p*t == ranks available; heads % t == 0; kv_heads % t == 0; layers >= p; p,t >= 1;
//   a given split has p entries, each >= 1, summing to the layers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "trellis/topology/topology.hpp"

namespace trellis::topology {

// What placement needs to know about the model.
struct ModelShape {
  int layers = 32;
  int heads = 32;
  int kv_heads = 8;
  // What the last stage pays per token beyond its layers (the LM head: a vocabulary x hidden
  // matrix read every decode step), in units of one decoder layer's cost. 0: nothing, and
  // the split is even. SmolLM2-135M: its tied 49,152 x 576 head is ~8 layers of parameters,
  // ~14 layers of bytes when the layers stay Q4_1 and the head Q8_0.
  double head_cost = 0;
  // Layers per stage as the user gave them (--layer-split 22,8); empty: split_layers().
  std::vector<int> split;
  bool operator==(const ModelShape&) const = default;
};

// Layers per stage that make the slowest stage as fast as possible when every layer costs
// the same and the last stage also pays `head_cost` layers: the last stage takes fewer
// layers, the others share the rest evenly (earlier stages take the remainder). Among
// splits as good as the best, the one nearest the even split. head_cost <= 0: the even
// split. Throws kInvalidArgument when layers < p or p < 1.
std::vector<int> split_layers(int layers, int p, double head_cost);

enum class RankKind { kAuto, kGpu, kCpu };
std::string_view to_string(RankKind k);  // "auto", "gpu", "cpu"

struct PlaceOptions {
  // kAuto: one rank per GPU when the hosts have GPUs (and, if ranks were discovered, at
  // least as many GPUs as ranks on each host); otherwise CPU ranks.
  RankKind kind = RankKind::kAuto;
  // CPU ranks per host when the topology has no discovered ranks; 0 = one per NUMA node.
  int cpu_ranks_per_host = 0;
  // Treat NVLink as absent (applies without_nvlink() first).
  bool no_nvlink = false;
  bool operator==(const PlaceOptions&) const = default;
};

struct RankPlacement {
  int rank = -1;            // MPI rank
  int stage = -1;           // 0..p-1
  int tp = -1;              // 0..t-1
  int host = -1;            // index into Topology::hosts
  int device = -1;          // GPU index on the host; -1 for a CPU rank
  int numa = -1;            // NUMA node OS index (-1 unknown)
  std::vector<int> cores;   // PU OS indexes this rank should bind to (disjoint for CPU ranks)
  std::string nic;          // closest NIC name; "" if the host has none
  bool operator==(const RankPlacement&) const = default;
};

// The slowest link inside a group (TP group or stage boundary).
struct GroupLink {
  LinkClass link_class = LinkClass::kSameProcess;
  double bandwidth = 0;     // bytes/s of that slowest link; 0 unknown
  bool operator==(const GroupLink&) const = default;
};

struct Placement {
  int pp = 0, tp = 0;
  ModelShape model;
  RankKind kind = RankKind::kCpu;         // what the ranks are (kGpu or kCpu)
  bool nvlink_disabled = false;
  std::vector<RankPlacement> ranks;       // indexed by MPI rank, size p*t
  std::vector<GroupLink> tp_groups;       // per stage: the slowest pair in its TP group
  // Per boundary s (stage s -> s+1, size p-1): the slowest of the t links (s,i)->(s+1,i).
  std::vector<GroupLink> boundaries;
  std::vector<std::string> notes;         // choices worth telling the user

  // MPI rank at grid position (stage, tp); throws kInvalidArgument when out of range.
  int rank_at(int stage, int tp_index) const;
  // Layers per stage: model.split when given, else split_layers(layers, pp, head_cost).
  std::vector<int> layers_per_stage() const;
  bool operator==(const Placement&) const = default;
};

// How many ranks the topology offers for `options` (what p*t must equal).
int ranks_available(const Topology& topo, const PlaceOptions& options = {});

Placement place(const ModelShape& model, const Topology& topo, int p, int t,
                const PlaceOptions& options = {});

// A grid: one row per rank with stage/tp/host/device/cores/NIC, then the TP groups and
// stage boundaries with their link classes.
std::string format_placement(const Placement& placement, const Topology& topo);
std::string placement_to_json_text(const Placement& placement, int indent = 2);
Placement placement_from_json_text(std::string_view text, std::string_view what = "placement JSON");

}  // namespace trellis::topology
