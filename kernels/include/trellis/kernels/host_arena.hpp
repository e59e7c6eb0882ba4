// Host memory for large, long-lived data that a decode streams through on every token (a
// model's weights) and for the buffer that measures the limit of that streaming. It comes from
// 2 MiB-aligned anonymous mappings that the kernel is asked to back with transparent huge pages
// (madvise MADV_HUGEPAGE): a weight stream then walks one page table entry per 2 MiB instead of
// one per 4 KiB, and small matrices are packed side by side so that they share huge pages too.
// Huge pages are a request, not a promise: with /sys/kernel/mm/transparent_hugepage/enabled
// at "never", or memory too fragmented to find 2 MiB, the kernel uses 4 KiB pages and nothing
// else changes. huge_page_bytes() says what was granted (read back from /proc/self/smaps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace trellis::kernels {

class HostArena {
 public:
  struct Options {
    bool huge_pages = true;                        // madvise(MADV_HUGEPAGE) on every chunk
    std::size_t chunk_bytes = std::size_t{64} << 20;  // mapping size (a larger request gets its own)
  };
  HostArena() : HostArena(Options{}) {}
  explicit HostArena(Options opt);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // `bytes` (> 0) of uninitialised memory, 64-byte aligned; the returned pointer keeps its
  // chunk mapped (chunks outlive the arena while any of their blocks is held). Blocks are
  // packed in order of allocation; memory is returned to the system when every block of a
  // chunk is released. Throws kResourceExhausted naming the bytes when mmap fails.
  std::shared_ptr<std::byte> allocate(std::size_t bytes);

  bool huge_pages() const { return opt_.huge_pages; }
  std::size_t used_bytes() const { return used_; }          // sum of the blocks handed out
  std::size_t reserved_bytes() const;                       // mapped, live chunks
  // Bytes of this arena's live chunks that the kernel backs with huge pages now.
  std::size_t huge_page_bytes() const;

 private:
  struct Chunk;
  Options opt_;
  std::vector<std::weak_ptr<Chunk>> chunks_;
  std::shared_ptr<Chunk> current_;
  std::size_t current_used_ = 0;
  std::size_t used_ = 0;
};

// One line for logs: "weights 270 MiB, 268 MiB on 2 MiB pages" or the reason there are none
// ("4 KiB pages: kernels.huge_pages=false", "... transparent huge pages are 'never'").
std::string describe_huge_pages(const HostArena& arena, std::string_view what);

// The kernel's transparent-huge-page mode: "always", "madvise", "never", or "unavailable"
// when /sys/kernel/mm/transparent_hugepage/enabled cannot be read.
std::string transparent_huge_page_mode();

// Huge-page bytes inside the address ranges [first, second) according to `smaps` (the text of
// /proc/<pid>/smaps): each mapping that overlaps them counts its AnonHugePages, at most the
// bytes of its overlap (the kernel merges neighbouring mappings with equal flags, so one
// mapping may hold memory outside the ranges). Exposed for tests.
std::size_t smaps_huge_bytes(std::string_view smaps, std::span<const std::pair<std::uintptr_t, std::uintptr_t>> ranges);

}  // namespace trellis::kernels
