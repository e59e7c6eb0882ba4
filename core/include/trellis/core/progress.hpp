// Progress of work that takes more than a couple of seconds (start-up, a study's
// measurements), for a person watching a terminal: a short line on stderr as each step
// starts ("study 3/12: batch 8 (4.1 s)") and one when all are done. It is quiet unless stderr
// is a terminal, so logs, pipes and CI output stay as they were; commands also pass
// enabled = false for --json and on ranks other than 0.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "trellis/core/clock.hpp"

namespace trellis {

class Progress {
 public:
  // `total` steps (0: unknown, shown without "/total"). Writes to `out` (stderr by default)
  // only when `enabled` and, for stderr, when it is a terminal.
  Progress(std::string label, int total, bool enabled, std::FILE* out = nullptr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Starts the next step, named `what`.
  void step(std::string_view what);
  // Ends the line now (also done by the destructor).
  void done();
  bool active() const { return out_ != nullptr; }

  // Whether stderr is a terminal.
  static bool stderr_is_terminal();

 private:
  std::string label_;
  int total_, done_steps_ = 0;
  std::FILE* out_;
  double start_s_;
};

}  // namespace trellis
