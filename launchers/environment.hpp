// The only place that reads environment variables (besides argv in cli.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trellis/core/config.hpp"

namespace trellis::launchers {

// Applies every declared setting's environment variable that is set. Throws
// ErrorCode::kInvalidArgument naming the variable when its value does not parse.
void apply_environment(Config& config);

// How this process was started, read from what the launcher put in its environment.
enum class LaunchKind {
  kProcess,    // a plain process (perhaps inside a Slurm allocation, e.g. an sbatch script)
  kMpirun,     // Open MPI's mpirun/mpiexec: OMPI_COMM_WORLD_*
  kSrunPmix,   // Slurm's srun --mpi=pmix: SLURM_STEP_*, PMIX_*
  kSrunPmi2,   // Slurm's srun --mpi=pmi2: SLURM_STEP_*, PMI_*
  kSrunNoPmi,  // srun without a PMI plugin (--mpi=none, MpiDefault=none): tasks cannot meet
  kPmix,       // another PMIx launcher (prterun, ...): PMIX_RANK
  kPmi,        // another PMI launcher (MPICH's hydra, ...): PMI_RANK / PMI_SIZE
};

struct LaunchInfo {
  LaunchKind kind = LaunchKind::kProcess;
  // Slurm: job and step, this task and its node (empty / -1 outside Slurm).
  std::string slurm_job, slurm_step, slurm_cluster, slurm_node, slurm_nodelist, slurm_mpi;
  int slurm_task = -1, slurm_tasks = 0, slurm_local_task = -1, slurm_node_index = -1, slurm_nodes = 0;
  std::string pmix_namespace;  // PMIX_NAMESPACE
  int local_rank = -1;         // OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID; -1 when unknown
  int world_rank = -1;         // OMPI_COMM_WORLD_RANK or SLURM_PROCID, before MPI_Init; -1 unknown
  bool mpi_recovery = false;   // mpirun --enable-recovery (OMPI_MCA_orte_enable_recovery=1)
  // Every launcher variable found (OMPI_COMM_WORLD_*, SLURM_*, PMIX_*, PMI_*), name and value,
  // for `trellis info`.
  std::vector<std::pair<std::string, std::string>> variables;

  // The job has an MPI world to join (MPI_Init will find its peers).
  bool uses_mpi() const;
  // "mpirun", "srun --mpi=pmix", "srun --mpi=pmi2", "srun without --mpi", "PMIx", "PMI",
  // "single process".
  std::string launcher() const;
  // One line: launcher, Slurm job/step, nodes and tasks, PMIx namespace.
  std::string describe() const;
  // Why the job cannot start, or empty: srun started several tasks without a PMI, so each
  // would run alone as rank 0 of 1.
  std::string refusal() const;
  // A hint to print before MPI_Init, or empty (srun --mpi=pmi2 with an MPI that has PMIx only).
  std::string hint() const;
  // Why mpirun --enable-recovery is refused, or empty when it was not given.
  std::string recovery_refusal() const;
};

LaunchInfo detect_launch();

// True when this process has an MPI world to join: started by mpirun/mpiexec (Open MPI,
// MPICH/PMI or PMIx) or by srun with a PMI plugin (--mpi=pmix, --mpi=pmi2).
bool launched_by_mpirun();

}  // namespace trellis::launchers
