// The shared-memory layout of one shm link: a segment per rank pair holding two
// single-producer single-consumer byte rings (one per direction). Records are 64-byte
// aligned and never wrap: the producer cuts a chunk short where the ring's end comes first
// (a record is at most the bytes left before the end, and at least 64). Large messages travel as several records (chunks) so that
// sender and receiver copy in a pipeline through a ring smaller than the message.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace trellis::transport::links::shm {

constexpr std::uint64_t kMagic = 0x7472656c6c697331ull;  // "trellis1"
constexpr std::size_t kAlign = 64;

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
