#include "src/collectives/shm_sync.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "trellis/core/process.hpp"

namespace trellis::transport::detail::shm {

ShmSync::ShmSync(SyncHeader* header, std::vector<int> members, int rank, const GroupOptions& o)
    : header_(header), members_(std::move(members)), rank_(rank), opts_(o) {
  if (rank_ < kPidMembers) header_->pid[rank_].store(::getpid(), std::memory_order_release);
}

ShmSync::~ShmSync() {
  if (active_ != nullptr) mark_failed("its group was destroyed during an operation");
}

void ShmSync::throw_gave_up() const {
  throw_error(ErrorCode::kPeerFailed, "{}: world rank {} gave up: {}", who(),
              header_->failed.load(std::memory_order_acquire) - 1, std::string(header_->reason));
}

void ShmSync::check_liveness() const {
  auto now = Clock::now();
  if (now - last_liveness_ < std::chrono::milliseconds(100)) return;
  last_liveness_ = now;
  for (int r = 0; r < std::min(size(), kPidMembers); ++r) {
    auto pid = header_->pid[r].load(std::memory_order_acquire);
    if (r != rank_ && !process_alive(pid))
      throw_error(ErrorCode::kPeerFailed, "{}: world rank {} (pid {}, same host) died", who(), members_[r], pid);
  }
}

void ShmSync::mark_failed(const std::string& why) {
  std::int64_t expected = 0;
  if (header_->failed.load() != 0) return;
  std::snprintf(header_->reason, sizeof(header_->reason), "%s", why.c_str());
  header_->failed.compare_exchange_strong(expected, members_[rank_] + 1, std::memory_order_release);
  wake();  // the peers blocked in park() must see it now, not after their slice
}

void ShmSync::begin(SteppedRequest* op) {
  if (active_ != nullptr) wait_stepped(*active_, Deadline::after(opts_.deadline), opts_.wait);
  active_ = op;
}

}  // namespace trellis::transport::detail::shm
