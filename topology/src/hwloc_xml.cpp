// Reading an hwloc XML topology in a child process. The XML comes from outside (--topo-file),
// and hwloc 2.9 (Debian 12) crashes inside hwloc_topology_load on some malformed files
// (SIGSEGV in hwloc_bitmap_compare_first; found by fuzz/topology_fuzz.cpp). trellis cannot
// fix hwloc, so it parses the file in a forked child and turns a crash, a hang or a refusal
// into an error that names the file, and tells a crash of hwloc from one of its own reader.
//
// The child answers on a pipe, each record a tag byte then text to the end of the stream:
//   'L'            hwloc loaded the file (written before trellis's reader runs)
//   'J' json       the Host, as host_to_json writes it
//   'E' c message  a trellis::Error: c is the ErrorCode's number
// so a child that dies before 'L' crashed in hwloc, and one that dies after it in trellis.
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hwloc_reader.hpp"
#include "json_detail.hpp"
#include "trellis/core/error.hpp"

namespace trellis::topology::detail {
namespace {

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::string error_record(ErrorCode code, const char* message) {
  std::string r(1, 'E');
  r.push_back(static_cast<char>('0' + static_cast<int>(code)));
  r.append(message);
  return r;
}

// In the child: load, read, answer; never returns.
[[noreturn]] void child(int fd, const XmlSource& src) {
  // A crash here is expected on bad input and reported by the parent; handlers installed by
  // libraries (UCX prints a backtrace on SIGSEGV) would only add noise.
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
  std::string out;
  try {
    std::unique_ptr<hwloc_topology, void (*)(hwloc_topology*)> topo(open_hwloc_topology(), hwloc_topology_destroy);
    errno = 0;
    const int set = src.path.empty()
                        ? hwloc_topology_set_xmlbuffer(topo.get(), src.buffer.c_str(), static_cast<int>(src.buffer.size() + 1))
                        : hwloc_topology_set_xml(topo.get(), src.path.c_str());
    if (set != 0) {
      const int err = errno;
      throw_error(ErrorCode::kCorruptInput, "hwloc cannot open {}: {} ({})", src.what,
                  err ? std::strerror(err) : "no reason given", src.hint);
    }
    errno = 0;
    if (hwloc_topology_load(topo.get()) != 0) {
      const int err = errno;
      throw_error(ErrorCode::kCorruptInput, "hwloc cannot load {}: {} ({})", src.what,
                  err ? std::strerror(err) : "no reason given", src.hint);
    }
    write_all(fd, "L", 1);
    out = host_to_json(host_from_hwloc(topo.get(), src.source)).dump();
    out.insert(out.begin(), 'J');
  } catch (const Error& e) {
    out = error_record(e.code(), e.what());
  } catch (const std::exception& e) {
    out = error_record(ErrorCode::kInternal, e.what());
  }
  write_all(fd, out.data(), out.size());
  ::_exit(0);
}

}  // namespace

Host host_from_xml_isolated(const XmlSource& src) {
  int fds[2];
  if (::pipe(fds) != 0) throw_error(ErrorCode::kIo, "reading {}: pipe failed: {}", src.what, std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw_error(ErrorCode::kIo, "reading {}: fork failed: {}", src.what, std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1], src);
  }
  ::close(fds[1]);
  // Read the answer until the child closes its end or the deadline passes.
  std::string got;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + src.deadline;
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // the deadline check above ends the loop
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const bool loaded = !got.empty() && got[0] == 'L';
  const std::string answer = loaded ? got.substr(1) : got;
  if (timed_out)
    throw_error(ErrorCode::kCorruptInput, "{}: {} did not finish within {} s; the file is malformed or too large",
                src.what, loaded ? "trellis's topology reader" : "hwloc", src.deadline.count() / 1000.0);
  if (!answer.empty() && answer[0] == 'J') {
    try {
      return host_from_json(nlohmann::json::parse(answer.substr(1)));
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kInternal, "{}: the reader's answer does not parse: {}", src.what, e.what());
    }
  }
  if (answer.size() >= 2 && answer[0] == 'E') {
    const int code = answer[1] - '0';
    const auto ec = code >= 0 && code <= static_cast<int>(ErrorCode::kInternal) ? static_cast<ErrorCode>(code)
                                                                                : ErrorCode::kInternal;
    throw Error(ec, answer.substr(2));
  }
  const std::string how = WIFSIGNALED(status) ? fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)))
                                              : fmt::format("exit status {}", WEXITSTATUS(status));
  if (!loaded)
    throw_error(ErrorCode::kCorruptInput,
                "hwloc {} crashed reading {} ({}): the file is malformed (this hwloc has no guard against it); "
                "export it again with lstopo --of xml",
                HWLOC_VERSION, src.what, how);
  throw_error(ErrorCode::kInternal, "trellis's topology reader crashed on {} ({}) after hwloc loaded it: a bug, please report it",
              src.what, how);
}

}  // namespace trellis::topology::detail
