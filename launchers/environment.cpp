#include "environment.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

extern char** environ;

namespace trellis::launchers {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

std::string env_str(const char* name) {
  const char* v = env(name);
  return v ? v : "";
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  int out = fallback;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() ? out : fallback;
}

bool is_launcher_variable(std::string_view name) {
  // PMIX_SERVER_URI*, PMIX_DSTORE_* and similar are plumbing; keep the ones that say who we are.
  static constexpr std::string_view kPmix[] = {"PMIX_RANK", "PMIX_NAMESPACE", "PMIX_HOSTNAME", "PMIX_VERSION"};
  if (name.starts_with("OMPI_COMM_WORLD_")) return true;
  if (name.starts_with("SLURM_") || name.starts_with("SLURMD_")) return true;
  if (name.starts_with("PMI_")) return name != "PMI_FD";
  return std::find(std::begin(kPmix), std::end(kPmix), name) != std::end(kPmix);
}

}  // namespace

void apply_environment(Config& config) {
  for (const auto& spec : all_settings()) {
    if (spec.env.empty()) continue;
    std::string var(spec.env);
    if (const char* v = std::getenv(var.c_str()); v != nullptr && *v != '\0') {
      config.set(spec.name, v, SettingSource::kEnvironment, var);
    }
  }
}

LaunchInfo detect_launch() {
  LaunchInfo l;
  // A task of an srun job step has SLURM_STEP_ID and SLURM_STEP_NUM_TASKS; the batch script
  // of an sbatch job has SLURM_JOB_ID but neither (it is not a step with tasks).
  const bool srun_task = env("SLURM_STEP_ID") != nullptr && env("SLURM_STEP_NUM_TASKS") != nullptr;
  const bool pmix = env("PMIX_RANK") != nullptr;
  const bool pmi = env("PMI_RANK") != nullptr || env("PMI_SIZE") != nullptr || env("PMI_FD") != nullptr;
  // Open MPI's mpirun first: its ranks also carry PMIX_* (its own PMIx server), and a
  // mpirun inside an allocation carries the SLURM_* of the step that started its daemons.
  if (env("OMPI_COMM_WORLD_SIZE") != nullptr) {
    l.kind = LaunchKind::kMpirun;
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", -1);
    l.world_rank = env_int("OMPI_COMM_WORLD_RANK", -1);
    l.mpi_recovery = env_str("OMPI_MCA_orte_enable_recovery") == "1";
  } else if (srun_task) {
    l.kind = pmix ? LaunchKind::kSrunPmix : pmi ? LaunchKind::kSrunPmi2 : LaunchKind::kSrunNoPmi;
    l.local_rank = env_int("SLURM_LOCALID", -1);
  } else if (pmix) {
    l.kind = LaunchKind::kPmix;
  } else if (pmi) {
    l.kind = LaunchKind::kPmi;
  }
  l.slurm_job = env_str("SLURM_JOB_ID");
  l.slurm_cluster = env_str("SLURM_CLUSTER_NAME");
  l.slurm_node = env_str("SLURMD_NODENAME");
  l.slurm_mpi = env_str("SLURM_MPI_TYPE");
  const bool step = srun_task && l.kind != LaunchKind::kMpirun;
  if (step) {
    // The step srun started: its tasks are trellis's ranks.
    l.slurm_step = env_str("SLURM_STEP_ID");
    l.slurm_nodelist = env_str("SLURM_STEP_NODELIST");
    l.slurm_task = env_int("SLURM_PROCID", -1);
    l.slurm_tasks = env_int("SLURM_STEP_NUM_TASKS", 0);
    l.slurm_local_task = env_int("SLURM_LOCALID", -1);
    l.slurm_node_index = env_int("SLURM_NODEID", -1);
    l.slurm_nodes = env_int("SLURM_STEP_NUM_NODES", 0);
  } else {
    // The allocation (a batch script, an salloc shell, or mpirun's daemons inside one).
    l.slurm_nodelist = env_str("SLURM_JOB_NODELIST");
    l.slurm_tasks = env_int("SLURM_NTASKS", 0);
    l.slurm_nodes = env_int("SLURM_JOB_NUM_NODES", 0);
  }
  l.pmix_namespace = env_str("PMIX_NAMESPACE");
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || !is_launcher_variable(kv.substr(0, eq))) continue;
    l.variables.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  std::sort(l.variables.begin(), l.variables.end());
  return l;
}

bool LaunchInfo::uses_mpi() const {
  return kind != LaunchKind::kProcess && kind != LaunchKind::kSrunNoPmi;
}

std::string LaunchInfo::launcher() const {
  switch (kind) {
    case LaunchKind::kProcess: return "single process";
    case LaunchKind::kMpirun: return "mpirun";
    case LaunchKind::kSrunPmix: return "srun --mpi=pmix";
    case LaunchKind::kSrunPmi2: return "srun --mpi=pmi2";
    case LaunchKind::kSrunNoPmi: return "srun without --mpi";
    case LaunchKind::kPmix: return "PMIx";
    case LaunchKind::kPmi: return "PMI";
  }
  return "?";
}

std::string LaunchInfo::describe() const {
  std::string out = launcher();
  if (!slurm_job.empty()) {
    const bool step = !slurm_step.empty();
    out += fmt::format("; Slurm job {}{}{}", slurm_job, step ? " step " + slurm_step : std::string(),
                       slurm_cluster.empty() ? "" : " on cluster " + slurm_cluster);
    if (!step && kind == LaunchKind::kProcess) out += " (not a job step: a batch script or an salloc shell)";
    if (slurm_nodes > 0)
      out += fmt::format(", {} node(s) {}, {} task(s){}", slurm_nodes, slurm_nodelist, slurm_tasks,
                         step ? "" : " allocated");
  }
  if (!pmix_namespace.empty() && kind != LaunchKind::kMpirun) out += "; PMIx namespace " + pmix_namespace;
  return out;
}

std::string LaunchInfo::refusal() const {
  if (kind != LaunchKind::kSrunNoPmi || slurm_tasks <= 1) return {};
  return fmt::format(
      "started by srun as task {} of {} without a process-management interface (srun --mpi=none, or the "
      "cluster's MpiDefault=none): the tasks cannot find each other and each would run alone. Start it with "
      "`srun --mpi=pmix ...` (`srun --mpi=list` shows what this Slurm offers; docs/launch.md)",
      slurm_task, slurm_tasks);
}

std::string LaunchInfo::hint() const {
  if (kind != LaunchKind::kSrunPmi2 || slurm_task > 0) return {};
  return "note: srun --mpi=pmi2 needs an MPI built with Slurm's PMI-2 (MPICH, or Open MPI 4 configured "
         "--with-pmi); Open MPI 5 and Debian's Open MPI 4.1 speak PMIx only: if MPI_Init fails below, use "
         "srun --mpi=pmix";
}

std::string LaunchInfo::recovery_refusal() const {
  if (!mpi_recovery) return {};
  return "mpirun --enable-recovery keeps the job running after a rank dies, but trellis cannot recover a lost rank "
         "(its shard of the model and its KV cache are gone): the survivors name the dead rank and exit, and then "
         "mpirun waits for ever (5 of 5 runs across two hosts). Start the job without --enable-recovery; "
         "--set comm.allow_mpi_recovery=true starts it anyway (the fault tests do, to see trellis's own reports)";
}

bool launched_by_mpirun() { return detect_launch().uses_mpi(); }

}  // namespace trellis::launchers
