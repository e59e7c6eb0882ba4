#include "trellis/core/shm_names.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>

#include "trellis/core/process.hpp"

namespace trellis {
namespace {

constexpr std::string_view kPrefix = "trellis-";
constexpr const char* kShmDir = "/dev/shm";  // where glibc's shm_open keeps its names

std::uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

struct ParsedName {
  std::int64_t pid;
  std::uint64_t ns;
};

// "trellis-<pid>-<ns hex>-<what>" (a file name in /dev/shm, no leading '/').
std::optional<ParsedName> parse_name(std::string_view file) {
  if (!file.starts_with(kPrefix)) return std::nullopt;
  file.remove_prefix(kPrefix.size());
  ParsedName p{};
  auto [after_pid, e1] = std::from_chars(file.data(), file.data() + file.size(), p.pid);
  if (e1 != std::errc() || p.pid <= 0 || after_pid == file.data() + file.size() || *after_pid != '-')
    return std::nullopt;
  const char* ns_begin = after_pid + 1;
  auto [after_ns, e2] = std::from_chars(ns_begin, file.data() + file.size(), p.ns, 16);
  if (e2 != std::errc() || after_ns == file.data() + file.size() || *after_ns != '-') return std::nullopt;
  return p;
}

}  // namespace

std::string shm_name(std::int64_t creator_pid, std::string_view what) {
  return fmt::format("/{}{}-{:x}-{}", kPrefix, creator_pid, pid_namespace(), what);
}

std::string shm_name(std::string_view what) { return shm_name(::getpid(), what); }

std::vector<ShmSegmentInfo> list_shm_segments() {
  std::vector<ShmSegmentInfo> out;
  const std::uint64_t my_ns = pid_namespace();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kShmDir, ec)) {
    const std::string file = entry.path().filename().string();
    const auto parsed = parse_name(file);
    if (!parsed) continue;
    struct stat st {};
    // Another user's segments are theirs to sweep (and /dev/shm is sticky: only they can).
    if (::lstat(entry.path().c_str(), &st) != 0 || st.st_uid != ::geteuid() || !S_ISREG(st.st_mode)) continue;
    ShmSegmentInfo info;
    info.name = "/" + file;
    info.pid = parsed->pid;
    info.bytes = static_cast<std::uint64_t>(st.st_size);
    info.stale = parsed->ns == my_ns && !process_alive(parsed->pid);
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::vector<ShmSegmentInfo> sweep_stale_shm_segments() {
  std::vector<ShmSegmentInfo> removed;
  for (auto& s : list_shm_segments())
    if (s.stale && ::shm_unlink(s.name.c_str()) == 0) removed.push_back(std::move(s));
  return removed;
}

}  // namespace trellis
