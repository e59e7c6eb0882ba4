#include "src/collectives/shm_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trellis/core/error.hpp"

namespace trellis::transport::detail {
namespace {

std::byte* map(int fd, std::size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED)
    throw_error(ErrorCode::kIo, "mmap of shared-memory segment {} ({} bytes) failed: {}", name, bytes,
                std::strerror(err));
  return static_cast<std::byte*>(p);
}

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw_error(ErrorCode::kIo, "cannot create shared-memory segment {}: {}", name, std::strerror(errno));
  // posix_fallocate reserves the pages now: with ftruncate alone a full /dev/shm shows up
  // later as SIGBUS on the first touch of a page, in whichever rank touches it.
  int err = ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    throw_error(ErrorCode::kIo, "cannot size shared-memory segment {} to {} bytes: {} (is /dev/shm full?)", name,
                bytes, std::strerror(err));
  }
  try {
    return std::unique_ptr<ShmSegment>(new ShmSegment(name, map(fd, bytes, name), bytes, true));
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    throw_error(ErrorCode::kIo, "cannot open shared-memory segment {}: {} (is the peer on another host?)", name,
                std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    close(fd);
    throw_error(ErrorCode::kIo, "shared-memory segment {} is smaller than the {} bytes expected", name, bytes);
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, map(fd, bytes, name), bytes, false));
}

void ShmSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

ShmSegment::~ShmSegment() {
  munmap(base_, bytes_);
  unlink();
}

}  // namespace trellis::transport::detail
