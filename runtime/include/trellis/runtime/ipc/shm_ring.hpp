// The buffered IPC channel (SiPipe §6, "BIC"): a single-producer, multi-consumer ring of
// fixed-size slots in a POSIX shared-memory segment, used in a host to hand every rank the
// scheduler's outputs (BIC-I) without a network round trip.
//
// Each message is delivered to every consumer, in order. The producer blocks (with a
// deadline) only when the slowest consumer is a full ring behind; a consumer blocks (with a
// deadline) until the next message is there. SiPipe guards slots with fcntl lock-ahead; here
// each slot carries a sequence number and each consumer publishes its read position with
// atomics in the segment (x86 atomics are address-free and lock-free across processes), which
// gives the same ordering without a system call per message.
//
// Lifetime: the producer creates the segment and unlinks its name at its first write after
// every consumer has attached, or on destruction at the latest (the memory lives until the
// last party unmaps), so a job killed after that leaves nothing behind in /dev/shm; one
// killed before leaves a name that the next start sweeps (core/shm_names.hpp). close() tells consumers that no more messages
// will come: read() returns false once they have drained the ring.
//
// A wait that faces a dead peer (the producer, or the consumer a full ring waits for) ends
// early with kPeerFailed naming it: every party records its pid in the segment.
//
// Threading: one producer thread, one thread per consumer index.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/clock.hpp"

namespace trellis::runtime {

class ShmRing {
 public:
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Producer side: creates segment `name` (the engine's: core/shm_names.hpp's
  // "/trellis-<pid>-<ns>-<job>-sched-h<host>"); replaces a stale one of the same name.
  static std::unique_ptr<ShmRing> create(const std::string& name, std::uint32_t slots, std::uint32_t slot_bytes,
                                         std::uint32_t consumers);
  // Consumer `index` (0..consumers-1) opens the segment, waiting for it to appear.
  // `cancel`, as for read(): set by another thread of this process (its rank failed), it ends
  // the wait with kPeerFailed at the next poll. A producer that failed before creating the
  // segment never will, and without it the wait lasted the whole deadline.
  static std::unique_ptr<ShmRing> open(const std::string& name, std::uint32_t index, Deadline deadline,
                                       const std::atomic<bool>* cancel = nullptr);

  // Producer: copies one message into the next slot. kInvalidArgument when it is larger than
  // a slot, kTimeout naming the slowest consumer when the ring stays full past the deadline,
  // kPeerFailed when that consumer's process died, or (with `cancel`, as for read()) when
  // this rank failed while the ring was full.
  void write(std::span<const std::byte> message, Deadline deadline, const std::atomic<bool>* cancel = nullptr);
  void close();
  // Producer: closes the ring as failed; consumers that have drained it get kPeerFailed with
  // `reason` (truncated to 255 bytes), so they report the producer's cause, not a bare close.
  void fail(std::string_view reason);
  // Producer: waits until every consumer has read every message (so the segment may go).
  void wait_drained(Deadline deadline);
  // Consumer: the next message into `out`; false once the producer closed and all is read.
  // kTimeout naming the channel when nothing arrives before the deadline; kPeerFailed when
  // the producer's process died without close().
  // `cancel`, when given and set by another thread of this process (its rank failed),
  // ends the wait with kPeerFailed at the next poll instead of at the deadline.
  // `spin`: poll and yield for tens of milliseconds (run.host_waits) instead of going to
  // short sleeps after about a millisecond.
  bool read(std::vector<std::byte>& out, Deadline deadline, const std::atomic<bool>* cancel = nullptr,
            bool spin = false);
  // Consumer: like read() but returns false at once when no message is there yet.
  bool try_read(std::vector<std::byte>& out);

  const std::string& name() const { return name_; }
  std::uint32_t slot_bytes() const;

  struct Header;  // layout of the segment (defined in the .cpp)

 private:
  ShmRing(std::string name, void* base, std::size_t bytes, bool owner, std::uint32_t index);
  std::byte* slot(std::uint64_t seq) const;
  // Throw kPeerFailed naming the channel and pid when that peer process has died (checked
  // during waits, every ~100 ms): the dead never move the counters a wait watches.
  bool check_consumer(std::uint32_t c) const;
  void check_producer() const;

  std::string name_;
  void* base_;
  std::size_t bytes_;
  bool owner_;
  bool unlinked_ = false;  // producer: the name is gone (every consumer attached)
  std::uint32_t index_;
  Header* header_;
};

}  // namespace trellis::runtime
