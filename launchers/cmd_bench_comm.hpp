// Pieces of `trellis bench comm` (cmd_bench_comm*.cpp): the measurements, the peers run in
// the same job, and the results they produce. Every function here is collective over the
// world (all ranks call it in the same order); results are complete on rank 0.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "session.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/link.hpp"
#include "trellis/transport/stream.hpp"

namespace trellis::launchers::comm {

struct Point {
  std::size_t bytes = 0;
  double seconds = 0;    // median one-way latency (p2p), time per operation (all-reduce)
  double bandwidth = 0;  // bytes/s: p2p streaming bandwidth, all-reduce bus bandwidth
  bool verified = true;
};

struct Series {
  std::string name;       // backend or algorithm ("shm", "ucx", "MPI_Allreduce", "gloo", "ucx_perftest")
  std::string link_class; // "shm" in a host, "tcp" across hosts
  int ranks = 2;
  std::vector<Point> points;
  std::string note;       // why it is missing or what it ran over
};

struct StreamPoint {
  std::string mode;  // "aware", "baseline" (rendezvous per message) or "baseline-eager"
  std::string dtype;
  std::size_t batch = 0;
  double seconds = 0;                 // median one-way latency of one iteration
  double messages_per_iter = 0;       // steady state, sender side
  double metadata_bytes_per_iter = 0;
  double payload_bytes_per_iter = 0;
  bool verified = true;
};

struct Budget {
  int iters = 200;   // iterations per latency point (fewer for large messages)
  int warmup = 20;
};

// Point-to-point between world ranks 0 and 1 over `backend`; nullopt (with `why`) when the
// backend cannot connect here.
std::optional<Series> measure_p2p(Session& s, transport::Backend backend, const std::vector<std::size_t>& sizes,
                                  const Budget& b, std::string& why);

// All-reduce (f32) over each group, interleaved (every world rank calls it; non-members pass
// nullptr entries). A group with a non-empty entry in `windows` (same index; the vector may be
// shorter) works on that memory, its registered window, instead of a private vector. One
// Series per group.
std::vector<Series> measure_allreduce(Session& s, const std::vector<transport::Group*>& groups,
                                      const std::vector<std::size_t>& sizes, const Budget& b,
                                      const std::vector<std::span<std::byte>>& windows = {});

// Stage streaming between ranks 0 and 1 (ping-pong of one iteration's hidden states): for
// every dtype and batch, one point per mode in the order aware, baseline, baseline-eager.
std::vector<StreamPoint> measure_stream(Session& s, transport::Backend backend, const std::vector<std::size_t>& batches,
                                        std::size_t hidden, const Budget& b);

// Peers. ucx_perftest: a server on rank 1, the client on rank 0 (tag_lat: one-way latency;
// tag_bw: bandwidth). gloo: scripts/bench/gloo_allreduce.py: rank 0 spawns all `ranks` on its
// host, or, `across_hosts`, world ranks 0..ranks-1 each run one beside themselves.
Series run_ucx_perftest(Session& s, const std::vector<std::size_t>& lat_sizes, const std::vector<std::size_t>& bw_sizes);
Series run_gloo(Session& s, const std::string& script, const std::string& python, int ranks,
                const std::vector<std::size_t>& sizes, bool across_hosts);

// "same host" -> "shm", otherwise "tcp" (this build sees no RDMA NIC; UCX would say so).
std::string link_class_between(Session& s, int a, int b);

}  // namespace trellis::launchers::comm
