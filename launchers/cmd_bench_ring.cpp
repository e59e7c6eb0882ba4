// `trellis bench ring`: the foundation's multi-rank job. Messages travel around a ring of
// ranks over the MPI bootstrap link; rank 0 reports per-hop latency (token passing) and
// per-link bandwidth (every rank sending to its neighbour at once), and checks every byte.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::launchers {
namespace {

struct RingOptions {
  std::string min_size = "8";
  std::string max_size = "4MiB";
  int iters = 0;  // 0: setting bench.iters
  bool json = false;
};

struct RingPoint {
  std::size_t bytes;
  double hop_latency_s;     // median over iterations, per hop
  double link_bandwidth;    // bytes/s per link, median
  bool verified;
};

std::byte pattern(std::size_t i, int rank, int iter) {
  return static_cast<std::byte>((i * 131 + static_cast<std::size_t>(rank) * 7 + static_cast<std::size_t>(iter)) & 0xff);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

RingPoint measure(Session& s, std::size_t bytes, int iters, int warmup) {
  auto& w = s.world();
  const int n = s.size(), r = s.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::byte> out(bytes), in(bytes);
  std::vector<double> hop, bw;
  bool ok = true;
  for (int it = -warmup; it < iters; ++it) {
    // Token passing: one message at a time goes all the way around.
    for (std::size_t i = 0; i < bytes; ++i) out[i] = pattern(i, r, it);
    w.barrier(s.deadline());
    double t0 = now_seconds();
    if (r == 0) {
      w.send(next, 1, out, s.deadline());
      w.recv(prev, 1, in, s.deadline());
    } else {
      w.recv(prev, 1, in, s.deadline());
      w.send(next, 1, out, s.deadline());
    }
    double t_ring = now_seconds() - t0;
    for (std::size_t i = 0; i < bytes && ok; ++i) ok = in[i] == pattern(i, prev, it);
    // Exchange: every link busy at once.
    w.barrier(s.deadline());
    t0 = now_seconds();
    w.sendrecv(next, out, prev, in, 2, s.deadline());
    double t_x = w.max(now_seconds() - t0, s.deadline());
    for (std::size_t i = 0; i < bytes && ok; ++i) ok = in[i] == pattern(i, prev, it);
    if (it >= 0) {
      hop.push_back(t_ring / n);
      bw.push_back(static_cast<double>(bytes) / t_x);
    }
  }
  bool all_ok = !w.any(!ok, s.deadline());
  return {bytes, median(hop), median(bw), all_ok};
}

int run_ring(Session& s, const RingOptions& o) {
  std::size_t lo = parse_size(o.min_size, "--min-size"), hi = parse_size(o.max_size, "--max-size");
  if (lo == 0 || hi < lo || hi > (1ull << 30))
    throw_error(ErrorCode::kInvalidArgument, "--min-size/--max-size: need 1 <= min <= max <= 1GiB (got {} and {})", lo, hi);
  if (!s.require_world(s.size() >= 2,
                       fmt::format("bench ring needs at least 2 ranks; this job has {}. "
                                   "Run it under mpirun, e.g. mpirun -np 4 trellis bench ring",
                                   s.size())))
    return 1;
  int iters = o.iters > 0 ? o.iters : static_cast<int>(s.config.get_int("bench.iters"));
  int warmup = static_cast<int>(s.config.get_int("bench.warmup"));
  auto hosts = transport::allgather_strings(s.world(), s.world().hostname(), s.deadline());
  std::vector<RingPoint> points;
  for (std::size_t b = lo; b <= hi; b *= 4) {
    // Fewer iterations for large messages keeps the run short on a shared 2-core machine.
    int n_it = b >= (1u << 20) ? std::max(5, iters / 20) : iters;
    points.push_back(measure(s, b, n_it, std::min(warmup, n_it)));
    if (s.is_root()) spdlog::debug("ring {} done", format_bytes(static_cast<double>(b)));
  }
  if (!s.is_root()) return points.back().verified ? 0 : 1;
  bool all_ok = std::all_of(points.begin(), points.end(), [](const RingPoint& p) { return p.verified; });
  if (o.json) {
    nlohmann::json j;
    j["ranks"] = hosts;
    for (const auto& p : points)
      j["points"].push_back({{"bytes", p.bytes}, {"hop_latency_us", p.hop_latency_s * 1e6},
                             {"link_bandwidth_MBps", p.link_bandwidth / 1e6}, {"verified", p.verified}});
    std::cout << versioned_json(j) << "\n";
  } else {
    std::cout << fmt::format("ring of {} ranks over MPI:", s.size());
    for (int i = 0; i < s.size(); ++i) std::cout << fmt::format(" r{}@{}", i, hosts[i]);
    std::cout << fmt::format("\n{:>10}  {:>14}  {:>16}  {}\n", "size", "hop latency", "link bandwidth", "data");
    for (const auto& p : points)
      std::cout << fmt::format("{:>10}  {:>14}  {:>11.1f} MB/s  {}\n", format_bytes(static_cast<double>(p.bytes)),
                               format_seconds(p.hop_latency_s), p.link_bandwidth / 1e6,
                               p.verified ? "verified" : "CORRUPT");
    std::cout << "(medians; hop latency = one trip around the ring / ranks)\n";
  }
  if (!all_ok) spdlog::error("data arrived corrupted on at least one link");
  return all_ok ? 0 : 1;
}

}  // namespace

Action define_bench_ring(CLI::App& sub) {
  auto o = std::make_shared<RingOptions>();
  sub.add_option("--min-size", o->min_size, "Smallest message (e.g. 8, 4K)")->capture_default_str();
  sub.add_option("--max-size", o->max_size, "Largest message (sizes grow by 4x)")->capture_default_str();
  sub.add_option("--iters", o->iters, "Timed iterations per size (default: setting bench.iters)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--json", o->json, "Print JSON");
  return [o](Session& s) { return run_ring(s, *o); };
}

}  // namespace trellis::launchers
