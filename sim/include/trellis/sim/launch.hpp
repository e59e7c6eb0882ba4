// How to start a plan's pick: the hostfile and `mpirun ... trellis serve` / `trellis run`
// lines of each data-parallel replica, and a Slurm batch script (`trellis plan --sbatch`). Each replica is its own mpirun of p x t ranks; hosts
// are filled in rank order as topology::place() does (a TP group stays in a host when t
// divides the devices per host) and replicas are packed one after another, as the planner
// placed them; replicas that share a host get their GPUs by CUDA_VISIBLE_DEVICES and a port
// each. Pure function; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "trellis/sim/planner.hpp"

namespace trellis::sim {

struct Launch {
  struct Replica {
    std::string hostfile;   // "node0 slots=8\nnode1 slots=8\n" (a comment names the GPUs of a shared host)
    std::string devices;    // CUDA_VISIBLE_DEVICES when the replica shares its host ("" otherwise)
    int port = 8000;
    std::string serve, run;  // the mpirun command lines
  };
  std::vector<Replica> replicas;
  std::string model;               // the --model argument as written in the commands
  std::vector<std::string> notes;  // what the commands cannot say themselves
};

// `hosts`: the cluster's host names in rank order (missing ones are called hostN);
// `checkpoint`: the checkpoint path to load, or empty for "$TRELLIS_MODEL" (with a note).
Launch launch_commands(const PlanRequest& r, const Candidate& c, const std::vector<std::string>& hosts,
                       const std::string& checkpoint);

// A Slurm batch script for a pick: one job step of p x t tasks started by `srun --mpi=pmix`
// (each replica one task of a job array), as many tasks per node as the plan put ranks on a
// host, one GPU per task on GPU clusters, `--cpus-per-task` from `cores_per_host` (0: left
// out). `checkpoint` as for launch_commands (empty: the script wants TRELLIS_MODEL);
// `command_line` goes into its header. docs/launch.md.
std::string sbatch_script(const PlanRequest& r, const Candidate& c, const std::string& checkpoint,
                          const std::string& command_line, int cores_per_host);

// Quotes a word for a POSIX shell when it needs it.
std::string shell_quote(const std::string& word);

}  // namespace trellis::sim
