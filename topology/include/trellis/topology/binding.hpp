// Core binding of the ranks one host runs: which CPUs each should be bound to, given where
// the launcher let them run.
//
// Why: under `mpirun --bind-to none` (or socket binding, Open MPI's default above two ranks)
// the ranks of a host start free to run anywhere, and the kernel often starts them on one
// core and separates them only after a second or so; whatever a job measures first then
// runs with a context switch per message (docs/benchmarks.md: the first link measured 2x
// slower than ucx_perftest in 8 of 12 runs). Binding each rank to CPUs of its own at start
// makes the first measurement like the later ones. A rank gets a share of the cores, not one
// CPU: it runs several threads (a GPU rank's engine threads, a CPU rank's kernel workers).
#pragma once

#include <string>
#include <vector>

namespace trellis::topology {

struct CoreBinding {
  // Per local rank (same order as the input): the CPUs to bind it to; empty = leave it.
  std::vector<std::vector<int>> cpus;
  // Empty, or why the ranks must share CPUs (more ranks than CPUs), naming them.
  std::string warning;
  bool changed() const;
};

// `allowed[i]`: the CPUs (OS indexes) local rank i may run on now; `ranks[i]` its rank in the
// job (for messages); `host` for messages; `core_of_cpu[c]`: the physical core of CPU c (a
// number unique on the host; empty or shorter: every CPU its own core). When the sets already
// are pairwise disjoint, or a set is empty (unknown), nothing changes. Otherwise, when the
// union holds at least one physical core per rank, each rank gets an even share of whole
// cores with all their hardware threads (the first cores % ranks ranks one core more), in
// core and rank order so a stage's TP ranks sit next to each other; with fewer cores than
// ranks but a CPU per rank, rank i gets one CPU, distinct cores first (the first hardware
// thread of each core, then the second ones); with fewer CPUs than ranks nothing is bound
// (the kernel balances better than a fixed overload) and the warning names the ranks.
CoreBinding plan_core_binding(const std::vector<std::vector<int>>& allowed, const std::vector<int>& ranks,
                              const std::string& host, const std::vector<int>& core_of_cpu = {});

}  // namespace trellis::topology
