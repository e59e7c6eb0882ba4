// HostArena: packing, alignment, lifetime, and the huge-page accounting read from smaps.
#include "trellis/kernels/host_arena.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::uintptr_t addr(const std::shared_ptr<std::byte>& p) { return reinterpret_cast<std::uintptr_t>(p.get()); }

TEST(HostArena, BlocksArePackedAlignedAndDisjoint) {
  HostArena arena({.huge_pages = false, .chunk_bytes = 4 * kMiB});
  auto a = arena.allocate(100);
  auto b = arena.allocate(1000);
  auto c = arena.allocate(64);
  // A fresh chunk starts on a 2 MiB boundary (a huge page's slot), blocks on 64 bytes.
  EXPECT_EQ(addr(a) % (2 * kMiB), 0u);
  for (const auto* p : {&a, &b, &c}) EXPECT_EQ(addr(*p) % 64, 0u);
  EXPECT_GE(addr(b), addr(a) + 128);  // 100 bytes rounded to whole lines
  EXPECT_GE(addr(c), addr(b) + 1024);
  EXPECT_LT(addr(c), addr(a) + 4 * kMiB);  // same chunk: packed, not one mapping each
  std::memset(a.get(), 1, 100);
  std::memset(b.get(), 2, 1000);
  std::memset(c.get(), 3, 64);
  EXPECT_EQ(static_cast<int>(a.get()[99]), 1);
  EXPECT_EQ(static_cast<int>(b.get()[0]), 2);
  EXPECT_EQ(arena.used_bytes(), 1164u);
  EXPECT_EQ(arena.reserved_bytes(), 4 * kMiB);
  EXPECT_THROW(arena.allocate(0), Error);
}

TEST(HostArena, LargeBlocksGetTheirOwnMappingAndChunksFreeWithTheirLastBlock) {
  HostArena arena({.huge_pages = false, .chunk_bytes = 2 * kMiB});
  auto small = arena.allocate(4096);
  {
    auto big = arena.allocate(5 * kMiB);  // larger than a chunk: 6 MiB of its own
    EXPECT_EQ(addr(big) % (2 * kMiB), 0u);
    EXPECT_EQ(arena.reserved_bytes(), 8 * kMiB);
    big.get()[5 * kMiB - 1] = std::byte{7};
  }
  EXPECT_EQ(arena.reserved_bytes(), 2 * kMiB) << "the big block's mapping outlived its only block";
  auto next = arena.allocate(4096);  // the open chunk still takes small blocks
  EXPECT_LT(addr(next), addr(small) + 2 * kMiB);
  // A block that does not fit the open chunk's rest opens a new one.
  auto fill = arena.allocate(2 * kMiB - 4096);
  EXPECT_EQ(arena.reserved_bytes(), 4 * kMiB);
}

TEST(HostArena, TensorsKeepTheirMemoryAfterTheArenaIsGone) {
  std::vector<Tensor> ts;
  {
    HostArena arena({.huge_pages = true});
    for (int i = 0; i < 3; ++i) ts.push_back(Tensor::empty(DType::kF32, {16, 33}, arena));
    Tensor q = Tensor::empty(DType::kQ4_1, {4, 64}, arena);
    EXPECT_EQ(q.bytes(), dtype_bytes(DType::kQ4_1, 256));
    EXPECT_THROW(Tensor::empty(DType::kQ4_1, {4, 40}, arena), Error);  // not whole blocks
  }
  for (int i = 0; i < 3; ++i)
    for (std::int64_t k = 0; k < ts[static_cast<std::size_t>(i)].numel(); ++k)
      ts[static_cast<std::size_t>(i)].ptr<float>()[k] = static_cast<float>(i * 1000 + k);
  EXPECT_EQ(ts[2].ptr<float>()[527], 2527.0f);
  EXPECT_NE(ts[0].serial(), ts[1].serial());
  Tensor moved = std::move(ts[1]);
  EXPECT_EQ(moved.ptr<float>()[5], 1005.0f);
  ts.clear();  // releases the chunk after `moved` does
  EXPECT_EQ(moved.ptr<float>()[6], 1006.0f);
}

TEST(HostArena, SmapsCountsEachMappingOnceAndOnlyItsOverlap) {
  const std::string smaps =
      "7f0000000000-7f0000800000 rw-p 00000000 00:00 0 \n"
      "Size:               8192 kB\n"
      "AnonHugePages:      6144 kB\n"
      "VmFlags: rd wr mr mw me ac sd hg\n"
      "7f0000800000-7f0000a00000 r--p 00001000 08:01 1234                       /usr/lib/libx.so\n"
      "AnonHugePages:      2048 kB\n"
      "7f1000000000-7f1000400000 rw-p 00000000 00:00 0 \n"
      "AnonHugePages:      4096 kB\n";
  using R = std::pair<std::uintptr_t, std::uintptr_t>;
  // Two ranges inside the first mapping (6 MiB huge): each overlap caps what it counts.
  const std::vector<R> two = {{0x7f0000000000, 0x7f0000200000}, {0x7f0000400000, 0x7f0000800000}};
  EXPECT_EQ(smaps_huge_bytes(smaps, two), 6 * kMiB);
  const std::vector<R> one = {{0x7f0000000000, 0x7f0000200000}};
  EXPECT_EQ(smaps_huge_bytes(smaps, one), 2 * kMiB);
  const std::vector<R> third = {{0x7f1000000000, 0x7f1000400000}};
  EXPECT_EQ(smaps_huge_bytes(smaps, third), 4 * kMiB);
  const std::vector<R> none = {{0x7e0000000000, 0x7e0000400000}};
  EXPECT_EQ(smaps_huge_bytes(smaps, none), 0u);
  EXPECT_EQ(smaps_huge_bytes("", third), 0u);
}

// The VmFlags line of the mapping that holds `p` in /proc/self/smaps ("" if none): "hg" in it
// means madvise(MADV_HUGEPAGE) was applied, whatever the kernel then granted.
std::string vm_flags_of(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const auto dash = line.find('-'), space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space && line.find(':') > space) {
      const auto lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const auto hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

TEST(HostArena, AsksForHugePagesOnlyWhenTold) {
  HostArena on({.huge_pages = true}), off({.huge_pages = false});
  auto a = on.allocate(4 * kMiB), b = off.allocate(4 * kMiB);
  EXPECT_NE(vm_flags_of(a.get()).find(" hg "), std::string::npos) << vm_flags_of(a.get());
  EXPECT_EQ(vm_flags_of(b.get()).find(" hg "), std::string::npos) << vm_flags_of(b.get());
}

TEST(HostArena, DescribesWhatTheKernelGranted) {
  HostArena off({.huge_pages = false});
  auto a = off.allocate(8 * kMiB);
  std::memset(a.get(), 1, 8 * kMiB);
  EXPECT_NE(describe_huge_pages(off, "weights").find("4 KiB pages (kernels.huge_pages=false)"), std::string::npos);
  const std::string mode = transparent_huge_page_mode();
  if (mode != "always") {
    EXPECT_EQ(off.huge_page_bytes(), 0u) << "no madvise, THP mode " << mode;
  }

  HostArena on({.huge_pages = true});
  auto b = on.allocate(8 * kMiB);
  std::memset(b.get(), 1, 8 * kMiB);
  const std::string text = describe_huge_pages(on, "weights");
  if (mode == "never" || mode == "unavailable") {
    EXPECT_NE(text.find("transparent huge pages are " + mode), std::string::npos) << text;
  } else {
    // madvise or always: how much of it the kernel backs with 2 MiB pages depends on how
    // fragmented memory is (it falls back per page), so the figure is bounded, not fixed;
    // that the request was made is AsksForHugePagesOnlyWhenTold's check.
    EXPECT_LE(on.huge_page_bytes(), on.reserved_bytes());
    EXPECT_NE(text.find("of it on 2 MiB pages"), std::string::npos) << text;
    std::printf("THP %s: %zu of 8 touched MiB on 2 MiB pages\n", mode.c_str(), on.huge_page_bytes() >> 20);
  }
}

#if defined(__SANITIZE_ADDRESS__)
// Packing must not hide a kernel that reads past its matrix: under AddressSanitizer the
// line after each block and the chunk's free space are poisoned.
TEST(HostArenaDeathTest, ReadingPastABlockIsCaughtUnderAsan) {
  HostArena arena;
  auto a = arena.allocate(128);
  auto b = arena.allocate(128);
  EXPECT_DEATH(
      {
        volatile std::byte x = a.get()[128];
        (void)x;
      },
      "AddressSanitizer");
  EXPECT_DEATH(
      {
        volatile std::byte x = b.get()[4096];
        (void)x;
      },
      "AddressSanitizer");
}
#endif

}  // namespace
}  // namespace trellis::kernels
