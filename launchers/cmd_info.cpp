// `trellis info`: what this build is, what it can reach, how it is configured, how it was
// launched (mpirun, srun with PMIx/PMI-2, Slurm job and step) and where every rank runs.
#include <spdlog/spdlog.h>
#include <spdlog/version.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/process.hpp"
#include "trellis/core/shm_names.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/runtime/build_info.hpp"
#include "trellis/topology/library.hpp"
#include "trellis/transport/nccl_group.hpp"
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
    if (s.numeric()) {
      rows.back()["min"] = s.min;
      rows.back()["max"] = s.max;
    }
  }
  return rows;
}

void print_config(const Config& config) {
  std::cout << fmt::format("{:<26} {:<7} {:<12} {:<12} {:<30} {}\n", "setting", "type", "value", "source",
                           "environment", "range");
  for (const auto& s : all_settings()) {
    std::cout << fmt::format("{:<26} {:<7} {:<12} {:<12} {:<30} {}\n", s.name, to_string(s.type), config.raw(s.name),
                             to_string(config.source(s.name)), s.env.empty() ? "-" : s.env,
                             s.numeric() ? s.range_text() : "-");
    std::cout << fmt::format("    {}\n", s.description);
  }
}

// This host's trellis segments in /dev/shm (this user's): a stale one outlived its creator
// (a job killed during set-up) and goes at the next start of any other command.
nlohmann::json shm_json() {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& seg : list_shm_segments())
    rows.push_back({{"name", seg.name}, {"bytes", seg.bytes}, {"creator_pid", seg.pid}, {"stale", seg.stale}});
  return rows;
}

void print_shm(const nlohmann::json& rows) {
  std::cout << fmt::format("\nshared memory (this host, /dev/shm/trellis-*): {}\n",
                           rows.empty() ? "none left over" : std::to_string(rows.size()) + " segment(s)");
  for (const auto& r : rows)
    std::cout << fmt::format("  {}  {}  creator pid {} {}\n", r["name"].get<std::string>(),
                             format_bytes(r["bytes"].get<double>()), r["creator_pid"].get<std::int64_t>(),
                             r["stale"].get<bool>() ? "is gone: stale, removed at the next start"
                                                    : "runs (or belongs to another pid namespace)");
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
  j["onednn"] = kernels::onednn_description();
  // Which library a prefill matmul (M > 8) runs, by weight type (kernels/README.md).
  j["prefill_gemm"] = kernels::prefill_gemm_choice(kernels::DType::kF32);
  j["prefill_gemm_bf16"] = kernels::prefill_gemm_choice(kernels::DType::kBF16);
  const auto& c = lib.cuda;
  j["cuda"] = c.built ? nlohmann::json{{"built", true}, {"runtime", c.runtime}, {"driver", c.driver},
                                       {"devices", c.device_count}, {"nccl", c.nccl}, {"note", c.why}}
                      : nlohmann::json{{"built", false}, {"why", c.why}};
  // How a GPU model's TP all-reduce runs (issue 18): the engine decides per layout at start.
  j["tp_collectives"] = transport::nccl_group_built()
                            ? "a GPU model's TP all-reduce: NCCL in GPU memory when every rank of a TP group has its own "
                              "GPU, else staged through host memory (comm.tp_collectives; the run logs which and why)"
                            : "a GPU model's TP all-reduce: staged through host memory (no NCCL in this build)";
  // The CUDA kernels (kernels/cuda/) and the GPUs they see; the lines above are transport's
  // view (runtime, driver, NCCL).
  const kernels::CudaKernelsInfo k = kernels::cuda_kernels_info();
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : k.gpus)
    gpus.push_back({{"index", g.index}, {"name", g.name}, {"compute_capability", fmt::format("{}.{}", g.major, g.minor)},
                    {"multiprocessors", g.multiprocessors}, {"memory_bytes", g.memory_bytes}});
  j["cuda_kernels"] = {{"built", k.built}, {"architectures", k.architectures}, {"cublaslt", k.cublaslt},
                       {"gpus", gpus}, {"why", k.why}};
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
  for (const char* k : {"mpi", "ucx", "hwloc", "spdlog", "fmt", "blas", "onednn", "cpu_isa"})
    std::cout << fmt::format("  {:<8} {}\n", k, j[k].get<std::string>());
  std::cout << fmt::format("  {:<8} f32 weights: {}; bf16: {}\n", "prefill", j["prefill_gemm"].get<std::string>(),
                           j["prefill_gemm_bf16"].get<std::string>());
  const auto& c = j["cuda"];
  if (c["built"].get<bool>()) {
    std::cout << fmt::format("  {:<8} CUDA runtime {}, driver {}, {} device(s){}; NCCL {}\n", "cuda",
                             c["runtime"].get<std::string>(), c["driver"].get<std::string>(),
                             c["devices"].get<int>(),
                             c["note"].get<std::string>().empty() ? "" : " (" + c["note"].get<std::string>() + ")",
                             c["nccl"].get<std::string>());
    std::cout << fmt::format("  {:<8} {}\n", "tp-comm", j["tp_collectives"].get<std::string>());
  } else {
    std::cout << fmt::format("  {:<8} not built: {}\n", "cuda", c["why"].get<std::string>());
  }
  const auto& k = j["cuda_kernels"];
  if (k["built"].get<bool>()) {
    std::cout << fmt::format("  {:<8} CUDA backend built for sm {} (cuBLASLt {}); {}\n", "kernels",
                             k["architectures"].get<std::string>(), k["cublaslt"].get<std::string>(),
                             k["gpus"].empty() ? "no GPU: " + k["why"].get<std::string>()
                                               : std::to_string(k["gpus"].size()) + " GPU(s)");
    for (const auto& g : k["gpus"])
      std::cout << fmt::format("    GPU {}  {}  sm {}  {} SMs  {}\n", g["index"].get<int>(), g["name"].get<std::string>(),
                               g["compute_capability"].get<std::string>(), g["multiprocessors"].get<int>(),
                               format_bytes(g["memory_bytes"].get<double>()));
  } else {
    std::cout << fmt::format("  {:<8} CUDA backend not built: {}\n", "kernels", k["why"].get<std::string>());
  }
  std::cout << "\nUCX transports and devices\n";
  for (const auto& r : j["ucx_resources"])
    std::cout << fmt::format("  {:<10} {:<16} {}\n", r["transport"].get<std::string>(),
                             r["device"].get<std::string>(), r["type"].get<std::string>());
}

nlohmann::json launch_json(const LaunchInfo& l) {
  nlohmann::json j = {{"launcher", l.launcher()}, {"description", l.describe()}};
  if (!l.slurm_job.empty()) {
    j["slurm"] = {{"job", l.slurm_job}, {"step", l.slurm_step}, {"cluster", l.slurm_cluster},
                  {"nodelist", l.slurm_nodelist}, {"nodes", l.slurm_nodes}, {"tasks", l.slurm_tasks},
                  {"mpi", l.slurm_mpi}, {"task", l.slurm_task}, {"local_task", l.slurm_local_task},
                  {"node_index", l.slurm_node_index}, {"node", l.slurm_node}};
  }
  if (!l.pmix_namespace.empty()) j["pmix_namespace"] = l.pmix_namespace;
  nlohmann::json vars = nlohmann::json::object();
  for (const auto& [k, v] : l.variables) vars[k] = v;
  j["environment"] = vars;
  return j;
}

// The launcher and the variables it set that trellis reads (rank 0's view). The rank, the
// world and the hosts themselves come from MPI (PMIx under srun), not from these.
void print_launch(const LaunchInfo& l) {
  std::cout << "\nlaunch\n  " << l.describe() << "\n";
  static constexpr const char* kShown[] = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_JOB_ID",
      "SLURM_STEP_ID",        "SLURM_PROCID",         "SLURM_LOCALID",              "SLURM_NODEID",
      "SLURMD_NODENAME",      "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",       "SLURM_STEP_NODELIST",
      "SLURM_STEP_TASKS_PER_NODE", "SLURM_MPI_TYPE",  "SLURM_JOB_NODELIST",         "SLURM_NTASKS",
      "PMIX_RANK",            "PMIX_NAMESPACE",       "PMIX_VERSION",               "PMI_RANK",
      "PMI_SIZE"};
  std::string line;
  for (const char* name : kShown) {
    for (const auto& [k, v] : l.variables) {
      if (k != name) continue;
      line += fmt::format("{}{}={}", line.empty() ? "" : " ", k, v);
    }
  }
  if (!line.empty()) std::cout << "  " << line << "\n";
}

// "0-3,8" for {0,1,2,3,8}; "?" when unknown.
std::string cpu_list(const std::vector<int>& cpus) {
  if (cpus.empty()) return "?";
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ",", j == i ? std::to_string(cpus[i])
                                                              : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out;
}

int run_info(Session& s, const InfoOptions& o) {
  // Every rank reports where it runs; rank 0 prints the whole world.
  nlohmann::json me = {{"rank", s.rank()}, {"host", s.world().hostname()}, {"pid", ::getpid()},
                       {"local_rank", s.launch.local_rank}, {"cpus", allowed_cpus()}};
  if (!s.launch.slurm_node.empty()) me["slurm_node"] = s.launch.slurm_node;
  if (s.launch.slurm_task >= 0) me["slurm_task"] = s.launch.slurm_task;
  auto all = transport::allgather_strings(s.world(), me.dump(), s.deadline());
  if (!s.is_root()) return 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : all) ranks.push_back(nlohmann::json::parse(r));
  if (o.config) {
    if (o.json) std::cout << versioned_json(config_json(s.config)) << "\n";
    else print_config(s.config);
    return 0;
  }
  nlohmann::json j = library_json(transport::query_libraries());
  j["world"] = {{"size", s.size()}, {"mpi", s.under_mpirun}, {"launcher", s.launch.launcher()}, {"ranks", ranks}};
  j["launch"] = launch_json(s.launch);
  j["shm_segments"] = shm_json();
  if (o.json) {
    j["config"] = config_json(s.config);
    std::cout << versioned_json(j) << "\n";
    return 0;
  }
  print_libraries(j);
  print_launch(s.launch);
  std::cout << fmt::format("\nranks: {} ({})\n", s.size(),
                           s.under_mpirun ? "under " + s.launch.launcher() : "single process, no MPI");
  for (const auto& r : ranks) {
    const int local = r.value("local_rank", -1);
    std::cout << fmt::format("  rank {:<4} host {:<20} local {:<4} pid {:<8} cpus {}{}\n", r["rank"].get<int>(),
                             r["host"].get<std::string>(), local >= 0 ? std::to_string(local) : "-", r["pid"].get<int>(),
                             cpu_list(r.value("cpus", std::vector<int>{})),
                             r.contains("slurm_node") && r["slurm_node"] != r["host"]
                                 ? " (Slurm node " + r["slurm_node"].get<std::string>() + ")"
                                 : "");
  }
  print_shm(j["shm_segments"]);
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
