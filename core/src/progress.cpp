#include "trellis/core/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

namespace trellis {

bool Progress::stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, int total, bool enabled, std::FILE* out)
    : label_(std::move(label)), total_(total), out_(nullptr), start_s_(now_seconds()) {
  if (!enabled) return;
  if (out == nullptr && !stderr_is_terminal()) return;
  out_ = out != nullptr ? out : stderr;
}

Progress::~Progress() { done(); }

void Progress::step(std::string_view what) {
  if (!out_) return;
  ++done_steps_;
  const std::string count = total_ > 0 ? fmt::format("{}/{}", done_steps_, total_) : std::to_string(done_steps_);
  // One line per step rather than one line rewritten with '\r': log lines printed between
  // steps (at info level) would otherwise land in the middle of the status line.
  std::fputs(fmt::format("{} {}: {} ({:.1f} s)\n", label_, count, what, now_seconds() - start_s_).c_str(), out_);
  std::fflush(out_);
}

void Progress::done() {
  if (!out_) return;
  if (done_steps_ > 0) std::fputs(fmt::format("{}: done in {:.1f} s\n", label_, now_seconds() - start_s_).c_str(), out_);
  std::fflush(out_);
  out_ = nullptr;
}

}  // namespace trellis
