// `trellis info`: what this build is, what it can reach, how it is configured, and (under
// mpirun) where every rank runs.
#include <spdlog/spdlog.h>
#include <spdlog/version.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/runtime/build_info.hpp"
#include "trellis/topology/library.hpp"
#include "trellis/transport/libraries.hpp"

namespace trellis::launchers {
namespace {

struct InfoOptions {
  bool json = false;
  bool config = false;
};

nlohmann::json config_json(const Config& config) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& s : all_settings()) {
    rows.push_back({{"name", s.name}, {"type", to_string(s.type)}, {"value", config.raw(s.name)},
                    {"default", s.default_value}, {"source", to_string(config.source(s.name))},
                    {"env", s.env}, {"description", s.description}});
  }
  return rows;
}

void print_config(const Config& config) {
  std::cout << fmt::format("{:<26} {:<7} {:<12} {:<12} {}\n", "setting", "type", "value", "source", "environment");
  for (const auto& s : all_settings()) {
    std::cout << fmt::format("{:<26} {:<7} {:<12} {:<12} {}\n", s.name, to_string(s.type), config.raw(s.name),
                             to_string(config.source(s.name)), s.env.empty() ? "-" : s.env);
    std::cout << fmt::format("    {}\n", s.description);
  }
}

nlohmann::json library_json(const transport::LibraryReport& lib) {
  auto b = runtime::build_info();
  nlohmann::json j;
  j["trellis"] = {{"version", b.version}, {"compiler", b.compiler}, {"build", b.build_type}};
  j["mpi"] = lib.mpi;
  j["ucx"] = lib.ucx;
  j["hwloc"] = topology::hwloc_version();
  j["spdlog"] = fmt::format("{}.{}.{}", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH);
  j["fmt"] = fmt::format("{}.{}.{}", FMT_VERSION / 10000, FMT_VERSION / 100 % 100, FMT_VERSION % 100);
  j["blas"] = kernels::blas_description();
  j["cpu_isa"] = kernels::compiled_isa();
  const auto& c = lib.cuda;
  j["cuda"] = c.built ? nlohmann::json{{"built", true}, {"runtime", c.runtime}, {"driver", c.driver},
                                       {"devices", c.device_count}, {"nccl", c.nccl}, {"note", c.why}}
                      : nlohmann::json{{"built", false}, {"why", c.why}};
  nlohmann::json res = nlohmann::json::array();
  for (const auto& r : lib.ucx_resources)
    res.push_back({{"transport", r.transport}, {"device", r.device}, {"type", r.device_type},
                   {"component", r.component}, {"memory_domain", r.memory_domain}});
  j["ucx_resources"] = res;
  return j;
}

void print_libraries(const nlohmann::json& j) {
  const auto& t = j["trellis"];
  std::cout << fmt::format("trellis {} ({}, {})\n\n", t["version"].get<std::string>(),
                           t["compiler"].get<std::string>(), t["build"].get<std::string>());
  std::cout << "libraries\n";
  for (const char* k : {"mpi", "ucx", "hwloc", "spdlog", "fmt", "blas", "cpu_isa"})
    std::cout << fmt::format("  {:<8} {}\n", k, j[k].get<std::string>());
  const auto& c = j["cuda"];
  if (c["built"].get<bool>()) {
    std::cout << fmt::format("  {:<8} CUDA runtime {}, driver {}, {} device(s){}; NCCL {}\n", "cuda",
                             c["runtime"].get<std::string>(), c["driver"].get<std::string>(),
                             c["devices"].get<int>(),
                             c["note"].get<std::string>().empty() ? "" : " (" + c["note"].get<std::string>() + ")",
                             c["nccl"].get<std::string>());
  } else {
    std::cout << fmt::format("  {:<8} not built: {}\n", "cuda", c["why"].get<std::string>());
  }
  std::cout << "\nUCX transports and devices\n";
  for (const auto& r : j["ucx_resources"])
    std::cout << fmt::format("  {:<10} {:<16} {}\n", r["transport"].get<std::string>(),
                             r["device"].get<std::string>(), r["type"].get<std::string>());
}

int run_info(Session& s, const InfoOptions& o) {
  // Every rank reports where it runs; rank 0 prints the whole world.
  nlohmann::json me = {{"rank", s.rank()}, {"host", s.world().hostname()}, {"pid", ::getpid()}};
  auto all = transport::allgather_strings(s.world(), me.dump(), s.deadline());
  if (!s.is_root()) return 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : all) ranks.push_back(nlohmann::json::parse(r));
  if (o.config) {
    if (o.json) std::cout << config_json(s.config).dump(2) << "\n";
    else print_config(s.config);
    return 0;
  }
  nlohmann::json j = library_json(transport::query_libraries());
  j["world"] = {{"size", s.size()}, {"mpi", s.under_mpirun}, {"ranks", ranks}};
  if (o.json) {
    j["config"] = config_json(s.config);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_libraries(j);
  std::cout << fmt::format("\nranks: {} ({})\n", s.size(), s.under_mpirun ? "under mpirun" : "single process, no MPI");
  for (const auto& r : ranks)
    std::cout << fmt::format("  rank {:<4} host {:<20} pid {}\n", r["rank"].get<int>(),
                             r["host"].get<std::string>(), r["pid"].get<int>());
  return 0;
}

}  // namespace

Action define_info(CLI::App& sub) {
  auto o = std::make_shared<InfoOptions>();
  sub.add_flag("--json", o->json, "Print JSON instead of text");
  sub.add_flag("--config", o->config, "Print every setting: type, value, where it came from, environment variable");
  return [o](Session& s) { return run_info(s, *o); };
}

}  // namespace trellis::launchers
