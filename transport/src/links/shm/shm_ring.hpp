// The shared-memory layout of one shm link: a segment per rank pair holding two
// single-producer single-consumer byte rings (one per direction). Records are 64-byte
// aligned and never wrap: the producer cuts a chunk short where the ring's end comes first
// (a record is at most the bytes left before the end, and at least 64). Large messages
// travel as several records (chunks) so that sender and receiver copy in a pipeline through
// a ring smaller than the message. A pad record (total == kPadRecord) sends the reader to
// the ring's start: the writer uses it to keep a quiet link in the ring's first bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace trellis::transport::links::shm {

constexpr std::uint64_t kMagic = 0x7472656c6c697331ull;  // "trellis1"
constexpr std::size_t kAlign = 64;

// Largest payload of one record (at most a quarter of the ring): a large message moves in
// pieces of this size, so the receiver copies one piece out while the sender copies the
// next in, and a piece is still in the caches when it is read. With ring/4 (1 MiB) pieces
// the receiver started only after 1 MiB had been copied in: a 4 MiB ping-pong took
// 380-490 us one way against 150-200 us with 64 KiB pieces (docs/benchmarks.md).
constexpr std::size_t kMaxChunk = 64u << 10;
inline std::size_t max_chunk(std::size_t ring_bytes) { return ring_bytes / 4 < kMaxChunk ? ring_bytes / 4 : kMaxChunk; }
// A quiet link's records stay in the ring's first kHotBytes (at most half the ring; see
// ShmLink::rewind), so the memory it touches stays in the caches.
constexpr std::size_t kHotBytes = 256u << 10;
inline std::size_t hot_bytes(std::size_t ring_bytes) { return ring_bytes / 2 < kHotBytes ? ring_bytes / 2 : kHotBytes; }
// RecordHeader::total of a pad record: the rest of the ring up to its end is unused, the
// next record starts at offset 0.
constexpr std::uint64_t kPadRecord = ~std::uint64_t{0};

inline std::size_t align_up(std::size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// One record: a chunk of a message. `total` is the whole message's size (the receiver
// learns it from the first chunk); `len` is this chunk's payload.
struct RecordHeader {
  std::uint64_t total;
  std::uint32_t tag;
  std::uint32_t len;
};
constexpr std::size_t kHeaderBytes = sizeof(RecordHeader);
static_assert(kHeaderBytes == 16);

// Monotonic byte counters; position = counter % capacity. The producer owns head, the
// consumer owns tail; each lives on its own cache line.
struct RingControl {
  alignas(kAlign) std::atomic<std::uint64_t> head;
  alignas(kAlign) std::atomic<std::uint64_t> tail;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shm rings need lock-free 64-bit atomics");

struct SegmentHeader {
  std::uint64_t magic;
  std::uint64_t ring_bytes;        // capacity of each ring's data area
  std::atomic<std::int64_t> pid[2];  // [0]: lower rank (creator), [1]: higher rank
  RingControl ring[2];             // [0]: lower -> higher, [1]: higher -> lower
};

inline std::size_t segment_bytes(std::size_t ring_bytes) {
  return align_up(sizeof(SegmentHeader)) + 2 * ring_bytes;
}

}  // namespace trellis::transport::links::shm
