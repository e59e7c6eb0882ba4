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
//                      "bus_bandwidth_GBps": 2.1,
//                      // optional: the measured points, used by size where they reach
//                      "samples": [ { "bytes": 4096, "seconds": 8.3e-6 }, ... ] } ],
//     "compute": { "device": "cpu", "flops": 1.1e11, "memory_bandwidth": 1.2e10,
//                  // optional, CPU hosts: cores the ranks share, kernel threads per rank, and
//                  // measured linear-layer rates (weight parameters per second) by thread
//                  // count and rows M (decode: M = sequences; prefill: M = tokens)
//                  "cores": 2, "threads_per_rank": 2,
//                  "matmul": [ { "threads": 1, "rows": 1, "params_per_s": 3.1e9,
//                                // optional: TP shard measured, attention context included
//                                "tp": 1, "context": 95.5, "concurrent": 1,
//                                // optional: measured as a pp x tp layout (departure 16)
//                                "coupled": false, "pp": 1 }, ... ] },
//     "runtime": { "step_overhead_us": 230, "step_overhead_per_seq_us": 40 } }
//                  // the engine's cost per iteration (fixed + per sequence), measured
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
#include <vector>

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
  // The measured points behind the fit (bytes, seconds), ascending in bytes; may be empty.
  std::vector<std::pair<double, double>> samples;
  double seconds(double bytes) const {
    return alpha_s + (ranks > 1 ? 2.0 * (ranks - 1) / ranks * bytes / bus_bandwidth : 0);
  }
};

// One measured linear-layer rate: `threads` kernel threads multiplying M = `rows` rows by
// weight matrices of the model's shapes processed `params_per_s` weight parameters per
// second (GEMV at small M reads each weight once; GEMM at large M is FLOP-bound).
//
// Points measured through the whole forward (`trellis bench model --batches`) also carry
// `tp`, the TP degree whose shard shapes were measured (a checkpoint with 1/tp of the heads,
// KV heads, MLP width and vocabulary), and `context`, the attention positions per row the
// forward already included (its attention core, norms and LM head are inside the rate).
struct MatmulPoint {
  int threads = 1;
  double rows = 1;
  double params_per_s = 0;
  int tp = 1;
  double context = 0;  // 0: a kernel-only rate (attention charged separately in full)
  // Copies of the forward that ran at once on the host's cores, each with `threads` kernel
  // threads; the rate is one copy's. Departure 15: k ranks busy at once read the points
  // measured with k copies, so contention (threads oversubscribing the cores, the memory
  // system shared) is measured, not assumed.
  int concurrent = 1;
  // Departure 16: measured with the ranks coupled as a layout couples them, not as
  // independent copies: `trellis bench model` under mpirun as a pp x tp layout, TP groups in
  // lock step with the real all-reduce, the stages handing their hidden state on with
  // microbatches in flight so that `concurrent` ranks compute at once (tp x min(m, pp)). The
  // rate is each forward call's time without the all-reduces' own measured time (the model
  // charges those from the link) and without the waits between calls, but with every wait
  // for the slower TP partner and the CPU that waiting ranks take meanwhile.
  bool coupled = false;
  int pp = 1;  // coupled points: the pipeline stages of the measured layout (pp x tp ranks)
};

struct CalibratedCompute {
  std::string device;         // what was measured ("cpu", "H100-SXM")
  double flops = 0;           // sustained FLOP/s of the GEMMs the model runs
  double memory_bandwidth = 0;  // sustained bytes/s of streaming reads
  int cores = 0;              // CPU: cores of the measured host (0: not given)
  int threads_per_rank = 0;   // CPU: kernel threads each rank runs (0: all cores)
  std::vector<MatmulPoint> matmul;  // CPU: measured rates by (threads, rows); may be empty
};

// The engine's own cost per iteration (scheduling, input preparation hand-off, sampling,
// token return), measured with a model whose compute is negligible.
struct CalibratedRuntime {
  double step_overhead_s = 0;          // per iteration
  double step_overhead_per_seq_s = 0;  // plus this per sequence in the iteration
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
  const std::optional<CalibratedRuntime>& runtime() const { return runtime_; }
  // The fastest trellis all-reduce measured on `kind` with exactly `ranks` ranks (peers
  // such as MPI_Allreduce and gloo are not trellis algorithms and are skipped), or null.
  const CalibratedAllreduce* allreduce(LinkKind kind, int ranks) const;
  const std::map<std::pair<LinkKind, int>, CalibratedAllreduce>& allreduce_fits() const { return allreduce_; }
  // The measured all-reduce time by message size on `kind` with `ranks` ranks: at each
  // measured size the fastest trellis algorithm (the engine picks its algorithm by message
  // size), made non-decreasing in size; ascending (bytes, seconds), empty when not measured.
  std::vector<std::pair<double, double>> allreduce_curve(LinkKind kind, int ranks) const;

 private:
  std::string origin_, machine_;
  std::map<LinkKind, CalibratedLink> links_;
  std::map<std::pair<LinkKind, int>, CalibratedAllreduce> allreduce_;
  std::map<std::pair<LinkKind, int>, std::vector<CalibratedAllreduce>> allreduce_all_;
  std::optional<CalibratedCompute> compute_;
  std::optional<CalibratedRuntime> runtime_;
};

// Maps "shm", "tcp", "rdma", "ib", "roce", "nvlink", "pcie", "same-process" to a LinkKind;
// kInvalidArgument otherwise.
LinkKind parse_link_kind(std::string_view name);

}  // namespace trellis::sim
