// Names of the POSIX shared-memory segments trellis creates, and the sweep of those a dead
// job left behind.
//
// Every segment is named "/trellis-<pid>-<pidns>-<what>": the pid of the process that
// created it and its pid namespace (hex inode of /proc/self/ns/pid), then what it is (the
// job and the channel, link or group). Segments are unlinked as soon as every party has
// mapped them; a job killed before that point leaves its names in /dev/shm. The creator's
// pid in the name lets a later start tell such a leftover (creator gone) from a segment a
// live job is still setting up, without opening it. The namespace guards against a
// container that shares /dev/shm but not pids: its pids mean nothing here, so its
// segments are never counted stale.
//
// Threading: free functions, no state; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trellis {

// "/trellis-<creator_pid>-<this process's pid namespace>-<what>". `what` must be a valid
// file name part (no '/'); the caller makes it unique per job.
std::string shm_name(std::int64_t creator_pid, std::string_view what);
// The same with this process as the creator.
std::string shm_name(std::string_view what);

struct ShmSegmentInfo {
  std::string name;           // as shm_open takes it: "/trellis-..."
  std::int64_t pid = 0;       // creator, from the name
  std::uint64_t bytes = 0;    // size of the segment
  bool stale = false;         // the creator is gone (same pid namespace): safe to remove
};

// Segments in /dev/shm named by shm_name and owned by this user, in name order. Segments of
// another pid namespace are listed with stale = false.
std::vector<ShmSegmentInfo> list_shm_segments();
// Unlinks every stale segment of list_shm_segments() and returns those it removed. Mappings
// that still exist stay valid (unlinking only removes the name). Never throws: a segment
// that cannot be removed is left for the next start.
std::vector<ShmSegmentInfo> sweep_stale_shm_segments();

}  // namespace trellis
