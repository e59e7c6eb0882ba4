#include "trellis/kernels/host_arena.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "trellis/core/error.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TRELLIS_ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define TRELLIS_ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define TRELLIS_ARENA_POISON(p, n) ((void)(p), (void)(n))
#define TRELLIS_ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace trellis::kernels {
namespace {

constexpr std::size_t kHuge = std::size_t{2} << 20;
// Under AddressSanitizer each block is followed by a poisoned line, and the chunk's free
// space stays poisoned, so a kernel that reads past its matrix is caught as it would be with
// one malloc per tensor. Without it blocks are packed back to back.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kRedzone = 64;
#else
constexpr std::size_t kRedzone = 0;
#endif

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::string read_file(const char* path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::uintptr_t parse_hex(std::string_view s) {
  std::uintptr_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v, 16);
  return v;
}

}  // namespace

// One 2 MiB-aligned anonymous mapping. munmap when the last block (or the arena) lets go.
struct HostArena::Chunk {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  Chunk(std::size_t n, bool huge) : bytes(n) {
    // Over-map by 2 MiB and trim both ends: mmap only promises 4 KiB alignment, and a huge
    // page needs its 2 MiB-aligned slot inside the mapping.
    const std::size_t span = n + kHuge;
    void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw_error(ErrorCode::kResourceExhausted, "host memory: cannot map {} MiB: {}", n >> 20, std::strerror(errno));
    auto* raw = static_cast<std::byte*>(p);
    const auto addr = reinterpret_cast<std::uintptr_t>(raw);
    std::byte* aligned = raw + (round_up(addr, kHuge) - addr);
    if (aligned > raw) ::munmap(raw, static_cast<std::size_t>(aligned - raw));
    const std::size_t tail = static_cast<std::size_t>((raw + span) - (aligned + n));
    if (tail > 0) ::munmap(aligned + n, tail);
    base = aligned;
    // A refusal (a kernel built without THP) leaves 4 KiB pages: still correct memory, and
    // huge_page_bytes() reports 0, which is how the user learns of it.
    if (huge) ::madvise(base, n, MADV_HUGEPAGE);
    TRELLIS_ARENA_POISON(base, n);
  }
  ~Chunk() {
    TRELLIS_ARENA_UNPOISON(base, bytes);  // the address range may be mapped again
    ::munmap(base, bytes);
  }
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;
};

HostArena::HostArena(Options opt) : opt_(opt) {
  if (opt_.chunk_bytes < kHuge) opt_.chunk_bytes = kHuge;
  opt_.chunk_bytes = round_up(opt_.chunk_bytes, kHuge);
}

HostArena::~HostArena() = default;

std::shared_ptr<std::byte> HostArena::allocate(std::size_t bytes) {
  if (bytes == 0) throw_error(ErrorCode::kInvalidArgument, "HostArena::allocate: 0 bytes");
  const std::size_t need = round_up(bytes, 64) + kRedzone;
  std::shared_ptr<Chunk> chunk;
  std::size_t offset = 0;
  if (need > opt_.chunk_bytes) {
    // A block larger than a chunk gets a mapping of its own (the current chunk stays open
    // for the small ones that follow).
    chunk = std::make_shared<Chunk>(round_up(need, kHuge), opt_.huge_pages);
  } else {
    if (!current_ || current_used_ + need > current_->bytes) {
      current_ = std::make_shared<Chunk>(opt_.chunk_bytes, opt_.huge_pages);
      current_used_ = 0;
      chunks_.push_back(current_);
    }
    chunk = current_;
    offset = current_used_;
    current_used_ += need;
  }
  if (chunk != current_) chunks_.push_back(chunk);
  used_ += bytes;
  std::erase_if(chunks_, [](const std::weak_ptr<Chunk>& w) { return w.expired(); });
  TRELLIS_ARENA_UNPOISON(chunk->base + offset, bytes);
  // Aliasing constructor: the block's pointer, the chunk's ownership.
  return std::shared_ptr<std::byte>(chunk, chunk->base + offset);
}

std::size_t HostArena::reserved_bytes() const {
  std::size_t n = 0;
  for (const auto& w : chunks_)
    if (auto c = w.lock()) n += c->bytes;
  return n;
}

std::size_t HostArena::huge_page_bytes() const {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (const auto& w : chunks_)
    if (auto c = w.lock()) {
      const auto lo = reinterpret_cast<std::uintptr_t>(c->base);
      ranges.emplace_back(lo, lo + c->bytes);
    }
  if (ranges.empty()) return 0;
  return smaps_huge_bytes(read_file("/proc/self/smaps"), ranges);
}

std::size_t smaps_huge_bytes(std::string_view smaps,
                             std::span<const std::pair<std::uintptr_t, std::uintptr_t>> ranges) {
  std::size_t total = 0, overlap = 0;
  std::size_t pos = 0;
  while (pos < smaps.size()) {
    std::size_t eol = smaps.find('\n', pos);
    if (eol == std::string_view::npos) eol = smaps.size();
    const std::string_view line = smaps.substr(pos, eol - pos);
    pos = eol + 1;
    // A mapping's header: "7f12a0000000-7f12a4000000 rw-p 00000000 00:00 0". Field lines
    // start with a capitalised name and a colon.
    const std::size_t dash = line.find('-');
    const std::size_t space = line.find(' ');
    if (dash != std::string_view::npos && space != std::string_view::npos && dash < space &&
        line.find(':') > space) {
      const std::uintptr_t lo = parse_hex(line.substr(0, dash));
      const std::uintptr_t hi = parse_hex(line.substr(dash + 1, space - dash - 1));
      overlap = 0;
      for (const auto& [a, b] : ranges)
        if (a < hi && lo < b) overlap += std::min(b, hi) - std::max(a, lo);
      continue;
    }
    if (overlap == 0 || !line.starts_with("AnonHugePages:")) continue;
    std::string_view v = line.substr(std::strlen("AnonHugePages:"));
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    std::size_t kb = 0;
    std::from_chars(v.data(), v.data() + v.size(), kb);
    total += std::min(kb * 1024, overlap);
  }
  return total;
}

std::string transparent_huge_page_mode() {
  // The file reads e.g. "always [madvise] never": the bracketed word is the mode.
  const std::string s = read_file("/sys/kernel/mm/transparent_hugepage/enabled");
  const auto open = s.find('['), close = s.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return s.substr(open + 1, close - open - 1);
}

std::string describe_huge_pages(const HostArena& arena, std::string_view what) {
  const double mib = static_cast<double>(arena.used_bytes()) / (1 << 20);
  if (!arena.huge_pages()) return fmt::format("{} {:.0f} MiB on 4 KiB pages (kernels.huge_pages=false)", what, mib);
  const std::string mode = transparent_huge_page_mode();
  // A chunk's last huge page also holds what is not handed out yet: count at most the blocks.
  const std::size_t huge = std::min(arena.huge_page_bytes(), arena.used_bytes());
  if (huge == 0 && (mode == "never" || mode == "unavailable"))
    return fmt::format("{} {:.0f} MiB on 4 KiB pages (transparent huge pages are {}: "
                       "/sys/kernel/mm/transparent_hugepage/enabled)",
                       what, mib, mode);
  return fmt::format("{} {:.0f} MiB, {:.0f} MiB of it on 2 MiB pages", what, mib,
                     static_cast<double>(huge) / (1 << 20));
}

}  // namespace trellis::kernels
