#include "trellis/core/process.hpp"

#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace trellis {

namespace {

// The state letter of /proc/PID/stat, or 0 when it cannot be read. It follows the command
// name, which is in parentheses and may itself contain spaces or ')': the last ')' ends it.
char state_letter(std::int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return 0;
  return line[paren + 2];
}

}  // namespace

bool process_alive(std::int64_t pid) {
  if (pid <= 0) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  const char state = state_letter(pid);
  return state != 'Z' && state != 'X';
}

bool process_stopped(std::int64_t pid) {
  if (pid <= 0) return false;
  const char state = state_letter(pid);
  return state == 'T' || state == 't';
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

}  // namespace trellis
