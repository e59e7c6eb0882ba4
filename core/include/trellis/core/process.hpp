// Liveness of another process on this host, for waits on shared memory: a peer that dies
// while we wait on a flag in a segment leaves no closed socket behind, so without this the
// wait would only end at its deadline and could not say who died.
#pragma once

#include <cstdint>
#include <vector>

namespace trellis {

// False only when `pid` certainly no longer runs: it does not exist, or it is a zombie
// (dead, not yet reaped: kill(pid, 0) still succeeds on those). pid <= 0 means "not known"
// and counts as alive. A process we may not signal (EPERM) counts as alive. Costs a system
// call and a small read of /proc: callers check it every ~100 ms of waiting, not per poll.
bool process_alive(std::int64_t pid);

// Whether `pid` is stopped: state T (SIGSTOP, SIGTSTP, Ctrl-Z) or t (stopped by a
// debugger). Such a process is alive but answers nothing, so a peer waiting on it would
// otherwise blame whoever it happens to wait on at its deadline. False when unknown.
bool process_stopped(std::int64_t pid);

// The CPUs (OS indexes, ascending) the calling thread may run on: its affinity as taskset,
// cgroups, a launcher or trellis's own binding left it. Empty when the kernel does not say.
std::vector<int> allowed_cpus();

}  // namespace trellis
