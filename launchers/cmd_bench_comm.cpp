// `trellis bench comm`: point-to-point latency/bandwidth per link backend, all-reduce per
// algorithm, stage streaming structure-aware vs baseline — each with the peers measured in
// the same run (ucx_perftest, MPI_Allreduce, torch gloo) — and the calibration file the
// planner reads (schema in trellis/transport/calibration.hpp).
#include <spdlog/spdlog.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>

#include <ctime>
#include <set>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cmd_bench_comm.hpp"
#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/transport/calibration.hpp"
#include "trellis/transport/libraries.hpp"

namespace trellis::launchers {
namespace {

using comm::Point;
using comm::Series;
using nlohmann::json;
namespace tp = transport;

struct CommOptions {
  std::string sections = "p2p,allreduce,stream";
  std::string backends = "shm,ucx,tcp,mpi";
  std::string calibration = "trellis-calibration.json";
  std::string python = "/usr/bin/python3";
  std::string script = std::string(TRELLIS_SOURCE_DIR) + "/scripts/bench/gloo_allreduce.py";
  std::string max_size = "64MiB";
  std::size_t hidden = 4096;
  std::string stream_backend = "auto";
  bool no_peers = false;
  bool json_out = false;
  int iters = 0;
};

// 8 B, then every power of 4 from 64 B (4 KiB, 64 KiB, 4 MiB and 64 MiB among them: the
// targets' and ucx_perftest's sizes), then `max` if it is none of those.
std::vector<std::size_t> p2p_sizes(std::size_t max) {
  std::vector<std::size_t> v = {8};
  for (std::size_t n = 64; n <= max; n *= 4) v.push_back(n);
  if (v.back() != max) v.push_back(max);
  return v;
}

const std::vector<std::size_t> kAllReduceSizes = {256, 4096, 16384, 65536, 262144, 1u << 20, 4u << 20, 16u << 20};
const std::vector<std::size_t> kBatches = {1, 8, 32, 64, 128, 256};

json series_json(const Series& s, bool allreduce) {
  std::vector<tp::TimedSize> ts;
  json samples = json::array();
  for (const auto& p : s.points) {
    if (p.seconds > 0) ts.push_back({p.bytes, p.seconds});
    samples.push_back({{"bytes", p.bytes}, {"seconds", p.seconds},
                       {allreduce ? "bus_bandwidth_Bps" : "bandwidth_Bps", p.bandwidth}, {"verified", p.verified}});
  }
  auto fit = tp::fit_alpha_bandwidth(ts);
  json j = {{"class", s.link_class}, {allreduce ? "algorithm" : "backend", s.name}, {"alpha_us", fit.alpha_s * 1e6},
            {"samples", samples}, {"note", s.note}};
  if (allreduce) {
    j["ranks"] = s.ranks;
    if (!s.points.empty()) j["bus_bandwidth_GBps"] = s.points.back().bandwidth / 1e9;
  } else {
    // Streaming bandwidth of the largest size is what a stage transfer sees.
    j["bandwidth_GBps"] = (s.points.empty() ? fit.bandwidth : std::max(fit.bandwidth, s.points.back().bandwidth)) / 1e9;
    if (!s.points.empty()) {
      j["min_bytes"] = s.points.front().bytes;
      j["max_bytes"] = s.points.back().bytes;
    }
  }
  return j;
}

json machine_json(Session& s, std::string& summary) {
  auto hosts = tp::allgather_strings(s.world(), s.world().hostname(), s.deadline());
  struct utsname u {};
  uname(&u);
  struct sysinfo si {};
  sysinfo(&si);
  std::string cpu = "?";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (starts_with(line, "model name")) {
      cpu = std::string(trim(line.substr(line.find(':') + 1)));
      break;
    }
  auto lib = tp::query_libraries();
  double mem = static_cast<double>(si.totalram) * si.mem_unit;
  summary = fmt::format("{}: {}, {} cores, {}, Linux {}, {}, UCX {}", hosts[0], cpu, std::thread::hardware_concurrency(),
                        format_bytes(mem), u.release, lib.mpi.substr(0, lib.mpi.find(',')), lib.ucx);
  return {{"hosts", hosts}, {"cpu", cpu}, {"cores", std::thread::hardware_concurrency()}, {"memory_bytes", mem},
          {"kernel", u.release}, {"mpi", lib.mpi}, {"ucx", lib.ucx}, {"ranks", s.size()}};
}

void print_series(const Series& s, bool allreduce) {
  std::cout << fmt::format("\n{} {} ({} ranks, class {}){}\n", allreduce ? "all-reduce" : "p2p", s.name, s.ranks,
                           s.link_class, s.note.empty() ? "" : " — " + s.note);
  std::cout << fmt::format("{:>10}  {:>12}  {:>14}  {}\n", "size", "latency", allreduce ? "bus bandwidth" : "bandwidth", "data");
  for (const auto& p : s.points)
    std::cout << fmt::format("{:>10}  {:>12}  {:>9.1f} MB/s  {}\n", format_bytes(static_cast<double>(p.bytes)),
                             p.seconds > 0 ? format_seconds(p.seconds) : "-", p.bandwidth / 1e6,
                             p.verified ? "ok" : "FAILED");
}

// All-reduce for groups of 2 and of the whole world: our algorithms, the MPI group, MPI_Allreduce, gloo.
void run_allreduce(Session& s, const CommOptions& o, const comm::Budget& b, json& out, bool& ok) {
  auto hosts = tp::host_map(s.world(), s.deadline());
  std::vector<int> sizes = {2};
  if (s.size() > 2) sizes.push_back(s.size());
  for (int p : sizes) {
    std::vector<int> members(static_cast<std::size_t>(p));
    for (int i = 0; i < p; ++i) members[static_cast<std::size_t>(i)] = i;
    std::set<int> distinct;
    for (int m : members) distinct.insert(hosts[static_cast<std::size_t>(m)]);
    const std::string cls = distinct.size() == 1 ? "shm" : "tcp";
    auto opts = tp::GroupOptions::from_config(s.config);
    std::vector<std::pair<std::string, std::unique_ptr<tp::Group>>> groups;
    opts.algorithm = tp::Algorithm::kAuto;
    groups.emplace_back("auto", tp::make_group(s.world(), members, opts, s.config, hosts));
    if (distinct.size() == 1) {
      opts.algorithm = tp::Algorithm::kRing;
      try {
        groups.emplace_back("ring", tp::make_group(s.world(), members, opts, s.config, hosts));
      } catch (const Error& e) {
        if (s.is_root()) spdlog::warn("ring all-reduce over {} not measured: {}", to_string(opts.cross_host), e.what());
      }
    }
    // The auto algorithm again, on a registered window (Group::allocate_window) where it has
    // one: in a host the shm all-reduce then copies nothing in or out; a hierarchical group
    // runs its in-host phase in place. Rings (one rank per host) have none: not measured.
    std::vector<std::span<std::byte>> windows;
    {
      opts.algorithm = tp::Algorithm::kAuto;
      auto g = tp::make_group(s.world(), members, opts, s.config, hosts);
      auto w = g ? g->allocate_window(kAllReduceSizes.back()) : std::span<std::byte>();
      if (!s.world().any(g != nullptr && w.empty(), s.deadline())) {
        windows.resize(groups.size());
        windows.push_back(w);
        groups.emplace_back("window", std::move(g));
      }
    }
    groups.emplace_back("mpi", tp::make_mpi_group(s.world(), members, opts.deadline));
    groups.emplace_back("MPI_Allreduce", tp::make_mpi_peer_group(s.world(), members));
    std::vector<tp::Group*> raw;
    for (auto& [label, g] : groups) raw.push_back(g.get());
    auto all = comm::measure_allreduce(s, raw, kAllReduceSizes, b, windows);
    for (std::size_t gi = 0; gi < all.size(); ++gi) {
      auto& series = all[gi];
      series.ranks = p;
      series.link_class = cls;
      if (series.name.empty()) series.name = groups[gi].first;
      // The calibration keys the algorithm family ("ring"); the rest names the links.
      if (auto sp = series.name.find(' '); sp != std::string::npos) {
        series.note = series.name.substr(sp + 1);
        series.name.resize(sp);
      }
      if (series.name == "mpi") series.note = "MPI_Iallreduce polled against the deadline (the fallback group)";
      if (groups[gi].first == "window")
        series.note = series.name == "shm" ? "in a registered window (zero-copy)"
                                           : series.note + ", in its hosts' registered windows (in-host phase in place)";
      for (const auto& pt : series.points) ok = ok && pt.verified;
      if (s.is_root()) print_series(series, true);
      out.push_back(series_json(series, true));
    }
    if (!o.no_peers) {
      auto gloo = comm::run_gloo(s, o.script, o.python, p, kAllReduceSizes, distinct.size() > 1);
      if (s.is_root()) print_series(gloo, true);
      out.push_back(series_json(gloo, true));
    }
  }
}

void run_stream(Session& s, const CommOptions& o, const comm::Budget& b, json& out, bool& ok) {
  const bool same = comm::link_class_between(s, 0, 1) == "shm";
  auto backend = o.stream_backend != "auto" ? tp::parse_backend(o.stream_backend)
                                            : same ? tp::Backend::kShm : tp::Backend::kUcx;
  auto points = comm::measure_stream(s, backend, kBatches, o.hidden, b);
  if (s.is_root())
    std::cout << fmt::format("\nstage streaming rank 0 -> 1 over {} (hidden {} + residual {}, one-way per iteration; "
                             "baseline: a round trip per message, eager: sends leave at once)\n"
                             "{:>5} {:>5}  {:>12} {:>12} {:>7}  {:>12} {:>7}  {:>7} {:>6} {:>6}  {:>6} {:>6}\n",
                             to_string(backend), o.hidden, o.hidden, "dtype", "batch", "aware", "baseline", "ratio",
                             "eager", "ratio", "msgs/it", "(base)", "(eager)", "meta B", "(base)");
  for (std::size_t i = 0; i + 2 < points.size(); i += 3) {
    const auto& a = points[i];
    const auto& base = points[i + 1];
    const auto& eager = points[i + 2];
    ok = ok && a.verified && base.verified && eager.verified;
    if (s.is_root())
      std::cout << fmt::format(
          "{:>5} {:>5}  {:>12} {:>12} {:>6.2f}x  {:>12} {:>6.2f}x  {:>7.1f} {:>6.1f} {:>6.1f}  {:>6.0f} {:>6.0f}\n", a.dtype,
          a.batch, format_seconds(a.seconds), format_seconds(base.seconds), base.seconds / a.seconds,
          format_seconds(eager.seconds), eager.seconds / a.seconds, a.messages_per_iter, base.messages_per_iter,
          eager.messages_per_iter, a.metadata_bytes_per_iter, base.metadata_bytes_per_iter);
    for (const auto* p : {&a, &base, &eager})
      out.push_back({{"backend", to_string(backend)}, {"mode", p->mode}, {"dtype", p->dtype}, {"batch", p->batch},
                     {"hidden", o.hidden}, {"seconds", p->seconds}, {"messages_per_iter", p->messages_per_iter},
                     {"metadata_bytes_per_iter", p->metadata_bytes_per_iter},
                     {"payload_bytes_per_iter", p->payload_bytes_per_iter}, {"verified", p->verified}});
  }
}

int run_comm(Session& s, const CommOptions& o) {
  if (!s.require_world(s.size() >= 2, fmt::format("bench comm needs at least 2 ranks; this job has {}. Run it under "
                                                  "mpirun, e.g. mpirun -np 4 trellis bench comm",
                                                  s.size())))
    return 1;
  comm::Budget b;
  b.iters = o.iters > 0 ? o.iters : static_cast<int>(s.config.get_int("bench.iters"));
  b.warmup = static_cast<int>(s.config.get_int("bench.warmup"));
  const auto sections = split(o.sections, ',');
  auto want = [&](const char* name) { return std::find(sections.begin(), sections.end(), name) != sections.end(); };
  std::string summary;
  json cal = {{"schema", "trellis.calibration.v1"}, {"machine_detail", machine_json(s, summary)}};
  cal["machine"] = summary;
  cal["links"] = json::array();
  cal["link_backends"] = json::array();
  cal["allreduce"] = json::array();
  cal["stream"] = json::array();
  bool ok = true;
  if (s.is_root()) std::cout << "machine: " << summary << "\n";
  if (want("p2p")) {
    const auto sizes = p2p_sizes(parse_size(o.max_size, "--max-size"));
    for (const auto& name : split(o.backends, ',')) {
      std::string why;
      auto series = comm::measure_p2p(s, tp::parse_backend(name), sizes, b, why);
      if (!series) {
        if (s.is_root()) std::cout << fmt::format("\np2p {}: not measured: {}\n", name, why);
        cal["link_backends"].push_back({{"backend", name}, {"note", "not measured: " + why}});
        continue;
      }
      for (const auto& p : series->points) ok = ok && p.verified;
      if (s.is_root()) print_series(*series, false);
      auto j = series_json(*series, false);
      cal["link_backends"].push_back(j);
      // The policy's backend for the class: shm in a host, ucx across hosts.
      if ((series->link_class == "shm" && name == "shm") || (series->link_class != "shm" && name == "ucx"))
        cal["links"].push_back(j);
    }
    if (!o.no_peers) {
      // tag_lat at the sizes where our links are compared with it (the 1.3x target at 4 KiB,
      // the rendezvous range above), up to --max-size.
      std::vector<std::size_t> lat;
      for (std::size_t n : {std::size_t{8}, std::size_t{4096}, std::size_t{65536}, std::size_t{256u << 10}, std::size_t{4u << 20}})
        if (n <= sizes.back()) lat.push_back(n);
      auto perf = comm::run_ucx_perftest(s, lat, {65536, 4u << 20});
      if (s.is_root()) print_series(perf, false);
      cal["link_backends"].push_back(series_json(perf, false));
    }
  }
  if (want("allreduce")) run_allreduce(s, o, b, cal["allreduce"], ok);
  if (want("stream")) run_stream(s, o, b, cal["stream"], ok);
  if (s.is_root()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    cal["created_utc"] = stamp;
    if (!o.calibration.empty()) {
      std::ofstream f(o.calibration);
      if (!f) throw_error(ErrorCode::kIo, "--calibration: cannot write {}", o.calibration);
      f << cal.dump(2) << "\n";
      std::cout << "\ncalibration written to " << o.calibration << "\n";
    }
    if (o.json_out) std::cout << versioned_json(cal) << "\n";
    if (!ok) spdlog::error("some data arrived wrong (see FAILED rows)");
  }
  return ok ? 0 : 1;
}

}  // namespace

Action define_bench_comm(CLI::App& sub) {
  auto o = std::make_shared<CommOptions>();
  sub.add_option("--sections", o->sections, "Comma-separated: p2p, allreduce, stream")->capture_default_str();
  sub.add_option("--backends", o->backends, "Link backends for p2p (shm, ucx, tcp, mpi, nccl)")->capture_default_str();
  sub.add_option("--max-size", o->max_size, "Largest p2p message (8 B, then powers of 4 from 64 B)")->capture_default_str();
  sub.add_option("--hidden", o->hidden, "Hidden size of the streamed states")->capture_default_str();
  sub.add_option("--stream-backend", o->stream_backend, "Link backend for streaming (auto: shm in a host, ucx across)")
      ->capture_default_str();
  sub.add_option("--calibration", o->calibration, "Where to write the calibration JSON ('' for nowhere)")
      ->capture_default_str();
  sub.add_option("--python", o->python, "Python with torch for the gloo peer")->capture_default_str();
  sub.add_option("--gloo-script", o->script, "The gloo peer script")->capture_default_str();
  sub.add_option("--iters", o->iters, "Iterations per latency point (default: setting bench.iters)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--no-peers", o->no_peers, "Skip ucx_perftest and gloo");
  sub.add_flag("--json", o->json_out, "Also print the calibration JSON");
  return [o](Session& s) { return run_comm(s, *o); };
}

}  // namespace trellis::launchers
