// The peers `trellis bench comm` measures in the same run: ucx_perftest (server on rank 1,
// client on rank 0, same environment and so the same UCX_TLS as our ucx link) and
// torch.distributed gloo (scripts/bench/gloo_allreduce.py under /usr/bin/python3).
// While a peer runs, the other ranks wait in a bootstrap barrier, which sleeps between
// polls once it has waited a while, so they leave the cores to the peer.
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cmd_bench_comm.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::launchers::comm {
namespace {

// Runs a shell command and returns its output (stdout and stderr). Throws kIo when it
// cannot start; the exit status goes to `status`.
std::string run_command(const std::string& cmd, int& status) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) throw_error(ErrorCode::kIo, "cannot run '{}'", cmd);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  status = pclose(f);
  return out;
}

// The numbers of ucx_perftest's "Final:" line: iterations, latency 50%ile / average /
// overall (usec), bandwidth average / overall (MB/s), message rate average / overall.
std::vector<double> final_line(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    auto words = split(line, ' ');
    if (!words.empty() && words[0] == "Final:") {
      std::vector<double> v;
      for (std::size_t i = 1; i < words.size(); ++i) v.push_back(std::stod(words[i]));
      return v;
    }
  }
  return {};
}

Deadline long_wait() { return Deadline::after(std::chrono::minutes(10)); }

}  // namespace

Series run_ucx_perftest(Session& s, const std::vector<std::size_t>& lat_sizes, const std::vector<std::size_t>& bw_sizes) {
  Series series{"ucx_perftest", link_class_between(s, 0, 1), 2, {}, ""};
  // Rank 1's address as rank 0 can reach it: loopback in a host, its first address otherwise.
  std::string addr;
  if (s.rank() == 1) {
    int st = 0;
    auto ips = split(std::string(trim(run_command("hostname -I", st))), ' ');
    addr = series.link_class == "shm" || ips.empty() ? "127.0.0.1" : ips[0];
  }
  addr = transport::allgather_strings(s.world(), addr, s.deadline())[1];
  struct Test {
    std::string kind;
    std::size_t bytes;
  };
  std::vector<Test> tests;
  for (auto n : lat_sizes) tests.push_back({"tag_lat", n});
  for (auto n : bw_sizes) tests.push_back({"tag_bw", n});
  int port = 13337;
  for (const auto& t : tests) {
    ++port;
    FILE* server = nullptr;
    if (s.rank() == 1) {
      server = popen(fmt::format("timeout 120 ucx_perftest -p {} >/dev/null 2>&1", port).c_str(), "r");
      // The server must listen before the client connects; it prints nothing we need.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    s.world().barrier(long_wait());
    Point p{t.bytes, 0, 0, true};
    std::string error;
    if (s.rank() == 0) {
      int iters = t.bytes >= (1u << 20) ? (t.kind == "tag_lat" ? 100 : 200) : t.bytes > (64u << 10) ? 1000 : t.kind == "tag_lat" ? 5000 : 2000;
      // timeout: a client whose server went away spins forever instead of failing.
      auto cmd = fmt::format("timeout 100 ucx_perftest {} -p {} -t {} -s {} -n {} -w {}", addr, port, t.kind, t.bytes,
                             iters, iters / 10);
      int st = 0;
      auto out = run_command(cmd, st);
      auto v = final_line(out);
      if (st != 0 || v.size() < 6) {
        error = fmt::format("'{}' failed (status {}): {}", cmd, st, out.substr(0, 300));
      } else if (t.kind == "tag_lat") {
        p.seconds = v[1] * 1e-6;  // 50th percentile, one way
      } else {
        p.bandwidth = v[5] * 1e6 * 1.048576;  // overall, ucx_perftest's MB is 2^20 bytes
      }
      series.note = "ucx_perftest " + addr + " -t tag_lat|tag_bw (UCX_TLS as in this job's environment)";
    }
    if (server) pclose(server);
    s.world().barrier(long_wait());
    if (!error.empty()) {
      spdlog::warn("ucx_perftest: {}", error);
      p.verified = false;
    }
    series.points.push_back(p);
  }
  return series;
}

Series run_gloo(Session& s, const std::string& script, const std::string& python, int ranks,
                const std::vector<std::size_t>& sizes, bool across_hosts) {
  Series series{"gloo", across_hosts ? "tcp" : "shm", ranks, {}, ""};
  std::string list;
  for (auto n : sizes) list += (list.empty() ? "" : ",") + std::to_string(n);
  // Across hosts every world rank below `ranks` runs one gloo rank beside itself, in its own
  // host, and rendezvous at rank 0's address; in a host rank 0 spawns them all.
  std::string master;
  if (across_hosts && s.rank() == 0) {
    int st = 0;
    auto ips = split(std::string(trim(run_command("hostname -I", st))), ' ');
    master = fmt::format("{}:{}", ips.empty() ? "127.0.0.1" : ips[0], 29400 + getpid() % 500);
  }
  if (across_hosts) master = transport::allgather_strings(s.world(), master, s.deadline())[0];
  if (s.rank() == 0 || (across_hosts && s.rank() < ranks)) {
    auto cmd = fmt::format("timeout 300 {} {} --ranks {} --sizes {}", python, script, ranks, list);
    if (across_hosts) cmd += fmt::format(" --rank {} --master {}", s.rank(), master);
    int st = 0;
    auto out = run_command(cmd, st);
    if (s.rank() != 0) {
      if (st != 0) spdlog::warn("gloo peer on rank {}: '{}' failed (status {}): {}", s.rank(), cmd, st, out.substr(0, 300));
      s.world().barrier(long_wait());
      return series;
    }
    try {
      auto start = out.rfind("\n{");
      auto j = nlohmann::json::parse(out.substr(start == std::string::npos ? out.find('{') : start + 1));
      for (const auto& p : j.at("points")) {
        double t = p.at("seconds").get<double>();
        auto b = p.at("bytes").get<std::size_t>();
        series.points.push_back({b, t, 2.0 * (ranks - 1) / ranks * static_cast<double>(b) / t, p.at("verified").get<bool>()});
      }
      series.note = fmt::format("torch {} gloo via {}", j.value("torch", "?"), python);
    } catch (const std::exception& e) {
      series.note = fmt::format("'{}' failed (status {}): {} {}", cmd, st, e.what(), out.substr(0, 300));
      spdlog::warn("gloo peer: {}", series.note);
    }
  }
  s.world().barrier(long_wait());
  return series;
}

}  // namespace trellis::launchers::comm
