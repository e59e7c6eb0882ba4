// Session: what every command gets — the configuration (defaults < environment < flags)
// and the world of ranks (MPI under mpirun, a single local rank otherwise).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "trellis/core/config.hpp"
#include "environment.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::launchers {

struct Session {
  Config config;
  bool under_mpirun = false;  // an MPI world: mpirun, or srun with a PMI plugin (launch says which)
  LaunchInfo launch;          // how the process was started (launcher, Slurm job/step, PMIx)
  std::unique_ptr<transport::Bootstrap> world_ptr;

  transport::Bootstrap& world() { return *world_ptr; }
  int rank() const { return world_ptr->rank(); }
  int size() const { return world_ptr->size(); }
  bool is_root() const { return rank() == 0; }
  Deadline deadline() const { return Deadline::after(config.get_duration("comm.deadline_ms")); }

  // Checks a world-size requirement that every rank evaluates alike. When it is not met,
  // rank 0 logs `message` once and every rank gets false (the command returns 1), so the
  // job ends everywhere with one clear error and no hang.
  bool require_world(bool ok, std::string_view message) const;
};

// A command flag that stands for a setting (--max-seqs is run.max_seqs), with the text the
// user gave, empty when the flag was not given.
struct FlagSetting {
  const char* setting;
  const char* flag;
  std::string value;
};
// Sets every given flag's setting, as the global --set does: a value the setting refuses
// (type or range, see SettingSpec) is a usage error: rank 0 logs it and every rank gets 2
// (the exit code); otherwise 0.
int apply_flag_settings(Session& s, std::initializer_list<FlagSetting> flags);

}  // namespace trellis::launchers
