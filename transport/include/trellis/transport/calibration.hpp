// Calibration: what `trellis bench comm` measured, reduced to the alpha + bytes/bandwidth
// model the planner (sim/) uses, and the file it is written to.
//
// File schema (JSON; sim/include/trellis/sim/calibration.hpp reads the "links" part, and
// ignores the keys it does not know):
//
//   {
//     "schema": "trellis.calibration.v1",
//     "machine": "vm: AMD EPYC, 2 cores, 31.3 GiB, Linux 6.1, Open MPI v4.1.4, UCX 1.13.1",
//     "machine_detail": { "hosts": ["vm"], "cpu": "...", "cores": 2, "memory_bytes": ...,
//                         "kernel": "...", "mpi": "...", "ucx": "...", "ranks": 4 },
//     "command": "trellis bench comm ...", "created_utc": "2026-11-22T06:30:00Z",
//     // One entry per link class: the backend the policy picks for it (shm in a host, ucx
//     // across hosts). alpha_us = one-way latency of the smallest messages (median half
//     // round trip); bandwidth_GBps = bytes / (one-way time - alpha) at the largest size
//     // measured; min/max_bytes = the measured range. "samples" (not "points", which the
//     // reader would refit) keep the raw medians.
//     "links": [ { "class": "shm|tcp|rdma", "backend": "shm|ucx|tcp|mpi",
//                  "alpha_us": 1.2, "bandwidth_GBps": 5.1, "min_bytes": 8, "max_bytes": 67108864,
//                  "samples": [ { "bytes": 8, "seconds": 1.2e-6, "bandwidth_Bps": 6.1e6 }, ... ] } ],
//     // Every backend measured, same fields, for comparison.
//     "link_backends": [ ... as in "links" ... ],
//     // All-reduce per algorithm and group size: alpha_us from the smallest size,
//     // bus bandwidth = 2(P-1)/P * bytes / time at the largest.
//     "allreduce": [ { "class": "shm|tcp", "algorithm": "shm|ring|hierarchical|mpi|MPI_Allreduce|gloo",
//                      "ranks": 4, "alpha_us": ..., "bus_bandwidth_GBps": ...,
//                      "samples": [ { "bytes": ..., "seconds": ..., "bus_bandwidth_Bps": ... } ] } ]
//   }
#pragma once

#include <cstddef>
#include <vector>

namespace trellis::transport {

struct TimedSize {
  std::size_t bytes = 0;
  double seconds = 0;  // median time of one operation of `bytes`
};

struct AlphaBandwidth {
  double alpha_s = 0;     // fixed cost per message
  double bandwidth = 0;   // bytes/s beyond it (0 when it could not be fitted)
};

// alpha = median time of the sizes up to `small_bytes` (the smallest size when none is);
// bandwidth = bytes / (time - alpha) at the largest size. `points` may be in any order.
AlphaBandwidth fit_alpha_bandwidth(std::vector<TimedSize> points, std::size_t small_bytes = 64);

}  // namespace trellis::transport
