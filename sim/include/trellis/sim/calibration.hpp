// Calibration: measured link and compute figures that replace catalog constants, so the
// same model predicts a measured machine. Read from the JSON file `trellis bench comm`
// (and the kernel benchmarks) write; sim/ may not include transport headers, so this is
// sim's own reader of that file format. The accepted schema is in docs/planner.md:
//
//   { "schema": "trellis.calibration.v1", "machine": "...",
//     "links": [ { "class": "shm|tcp|rdma|nvlink|pcie|same-process",
//                  // either fitted figures ...
//                  "alpha_us": 3.1, "bandwidth_GBps": 9.5, "min_bytes": 8, "max_bytes": 4194304,
//                  // ... or raw points, fitted here by least squares (time = alpha + bytes/bw)
//                  "points": [ { "bytes": 8, "seconds": 3.2e-6 }, ... ] } ],
//     "allreduce": [ { "class": "shm", "algorithm": "ring", "ranks": 4, "alpha_us": 9.0,
//                      "bus_bandwidth_GBps": 2.1 } ],
//     "compute": { "device": "cpu", "flops": 1.1e11, "memory_bandwidth": 1.2e10 } }
//
// This is the file transport/'s calibration.hpp writes; a bandwidth_GBps of 0 (the writer
// could not fit one) keeps the catalog bandwidth with the measured alpha.
//
// Unknown top-level keys are ignored (the file may carry more); a present field of the
// wrong type, a missing required field or an impossible value throws kCorruptInput naming
// the file and the field path (e.g. "links[1].points[3].seconds").
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "trellis/sim/catalog.hpp"

namespace trellis::sim {

struct CalibratedLink {
  double alpha_s = 0;
  double bandwidth = 0;       // bytes/s; 0 = not measured (keep the catalog's)
  double min_bytes = 0;       // measured range
  double max_bytes = 0;
};

// A measured all-reduce: time(bytes) = alpha + 2 (P-1)/P * bytes / bus_bandwidth.
struct CalibratedAllreduce {
  std::string algorithm;      // "ring", "hierarchical", "shm", ...
  int ranks = 0;
  double alpha_s = 0;
  double bus_bandwidth = 0;   // bytes/s
  double seconds(double bytes) const {
    return alpha_s + (ranks > 1 ? 2.0 * (ranks - 1) / ranks * bytes / bus_bandwidth : 0);
  }
};

struct CalibratedCompute {
  std::string device;         // what was measured ("cpu", "H100-SXM")
  double flops = 0;           // sustained FLOP/s of the GEMMs the model runs
  double memory_bandwidth = 0;  // sustained bytes/s of streaming reads
};

class Calibration {
 public:
  static Calibration parse(std::string_view json_text, std::string_view origin);
  static Calibration load(const std::string& path);

  const std::string& origin() const { return origin_; }
  const std::string& machine() const { return machine_; }
  // The measured figures for a link class, if the file has them.
  const CalibratedLink* link(LinkKind kind) const;
  const std::optional<CalibratedCompute>& compute() const { return compute_; }
  // The fastest trellis all-reduce measured on `kind` with exactly `ranks` ranks (peers
  // such as MPI_Allreduce and gloo are not trellis algorithms and are skipped), or null.
  const CalibratedAllreduce* allreduce(LinkKind kind, int ranks) const;
  const std::map<std::pair<LinkKind, int>, CalibratedAllreduce>& allreduce_fits() const { return allreduce_; }

 private:
  std::string origin_, machine_;
  std::map<LinkKind, CalibratedLink> links_;
  std::map<std::pair<LinkKind, int>, CalibratedAllreduce> allreduce_;
  std::optional<CalibratedCompute> compute_;
};

// Maps "shm", "tcp", "rdma", "ib", "roce", "nvlink", "pcie", "same-process" to a LinkKind;
// kInvalidArgument otherwise.
LinkKind parse_link_kind(std::string_view name);

}  // namespace trellis::sim
