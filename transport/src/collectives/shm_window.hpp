// The registered windows of an shm group (Group::allocate_window) and the zero-copy
// all-reduce on them (the algorithm: shm_window.cpp). Built on the group's public
// collectives (a window is set up with a broadcast and an all-gather) and its ShmSync (the
// operations publish, park, fail and take turns with the copying ones through it); it knows
// nothing of the group's own segment or pipeline.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/collectives/shm_sync.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::transport::detail::shm {

struct ShmWindow;  // one window's segment and layout (shm_window.cpp)

class ShmWindows {
 public:
  // `group` and `sync` must outlive this; window segments are named "<prefix>-w<index>".
  ShmWindows(Group& group, ShmSync& sync, std::string prefix);
  ~ShmWindows();
  ShmWindows(const ShmWindows&) = delete;
  ShmWindows& operator=(const ShmWindows&) = delete;

  // Group::allocate_window: collective over the group (same `bytes`, same order on every
  // member); throws naming the member that could not map the window.
  std::span<std::byte> allocate(std::size_t bytes);
  // The zero-copy all-reduce when all of `data` (count elements of dtype) lies in one of
  // this rank's windows, started (tested once) like the group's other operations; nullptr
  // when it does not, so the caller takes the copying path.
  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype);

 private:
  ShmWindow* find(const void* data, std::size_t bytes, std::size_t& offset) const;

  Group& group_;
  ShmSync& sync_;
  std::string prefix_;
  std::vector<std::unique_ptr<ShmWindow>> windows_;
};

}  // namespace trellis::transport::detail::shm
