// Binds the ranks of each host to CPUs of their own at start when the launcher left them
// sharing (topology/binding.hpp has the rule and the why). Collective: every rank calls it
// once, before any thread of its own starts (threads inherit the binding).
#pragma once

#include "session.hpp"

namespace trellis::launchers {

// No-op for a world of one or with comm.bind_cores=false. Logs (the host's first rank) what
// was bound, or a warning naming ranks that must share CPUs.
void bind_host_ranks(Session& s);

}  // namespace trellis::launchers
