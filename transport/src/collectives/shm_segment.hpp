// A POSIX shared-memory segment mapped into this process (RAII). The creator names it,
// the other members open it by that name, and the creator unlinks it as soon as everybody
// has it mapped, so a crashed job leaves nothing behind in /dev/shm.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace trellis::transport::detail {

class ShmSegment {
 public:
  // Creates (exclusively) and maps `bytes` zeroed bytes; throws kIo naming the segment.
  static std::unique_ptr<ShmSegment> create(const std::string& name, std::size_t bytes);
  // Maps an existing segment; throws kIo naming it when it is missing or too small.
  static std::unique_ptr<ShmSegment> open(const std::string& name, std::size_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void unlink();
  std::byte* base() const { return base_; }
  std::size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, std::byte* base, std::size_t bytes, bool owner)
      : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner) {}
  std::string name_;
  std::byte* base_;
  std::size_t bytes_;
  bool owner_;
};

}  // namespace trellis::transport::detail
