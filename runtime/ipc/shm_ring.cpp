#include "trellis/runtime/ipc/shm_ring.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <sys/stat.h>

#include "trellis/core/error.hpp"
#include "trellis/core/poll.hpp"
#include "trellis/core/process.hpp"

namespace trellis::runtime {

namespace {
constexpr std::uint64_t kMagic = 0x474e495253524c54ull;  // "TLRSRING"
constexpr std::uint32_t kMaxConsumers = 256;
constexpr std::uint32_t kClosed = 1, kFailed = 2;  // values of Header::closed
struct alignas(64) Cursor {
  std::atomic<std::uint64_t> value{0};
};
struct SlotHeader {
  std::atomic<std::uint64_t> seq;  // 1 + message number stored here (0: empty)
  std::uint32_t bytes;
  std::uint32_t pad;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared-memory ring needs lock-free 64-bit atomics");
}  // namespace

struct ShmRing::Header {
  std::atomic<std::uint64_t> magic;
  std::uint32_t slots, slot_bytes, consumers, pad;
  alignas(64) std::atomic<std::uint64_t> written;  // messages published
  std::atomic<std::uint32_t> closed;
  Cursor read[kMaxConsumers];                       // messages each consumer has taken
  // Who is on the other end, for waits that must notice a dead peer (0: not attached yet).
  std::atomic<std::int64_t> producer_pid;
  std::atomic<std::int64_t> consumer_pid[kMaxConsumers];
  char failure[256];  // the producer's error when closed == kFailed (written before)
};

namespace {
std::size_t stride(std::uint32_t slot_bytes) { return (sizeof(SlotHeader) + slot_bytes + 63) / 64 * 64; }
std::size_t total_bytes(std::uint32_t slots, std::uint32_t slot_bytes) {
  return sizeof(ShmRing::Header) + static_cast<std::size_t>(slots) * stride(slot_bytes);
}
// Probes a peer's pid at most every 100 ms of a wait: a dead peer never moves the counters
// we wait on, and this turns a wait to the deadline into an error naming it.
class LivenessProbe {
 public:
  bool due() {
    auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return false;
    last_ = now;
    return true;
  }

 private:
  Clock::time_point last_ = Clock::now();
};
}  // namespace

ShmRing::ShmRing(std::string name, void* base, std::size_t bytes, bool owner, std::uint32_t index)
    : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner), index_(index),
      header_(static_cast<Header*>(base)) {}

ShmRing::~ShmRing() {
  if (owner_) {
    close();
    if (!unlinked_) ::shm_unlink(name_.c_str());
  }
  ::munmap(base_, bytes_);
}

std::uint32_t ShmRing::slot_bytes() const { return header_->slot_bytes; }

std::byte* ShmRing::slot(std::uint64_t seq) const {
  return static_cast<std::byte*>(base_) + sizeof(Header) + (seq % header_->slots) * stride(header_->slot_bytes);
}

std::unique_ptr<ShmRing> ShmRing::create(const std::string& name, std::uint32_t slots, std::uint32_t slot_bytes,
                                         std::uint32_t consumers) {
  if (slots < 2 || slot_bytes < 64 || consumers < 1 || consumers > kMaxConsumers)
    throw_error(ErrorCode::kInvalidArgument, "channel {}: {} slots of {} bytes for {} consumers is not allowed", name,
                slots, slot_bytes, consumers);
  ::shm_unlink(name.c_str());
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw_error(ErrorCode::kIo, "channel {}: shm_open failed: {}", name, std::strerror(errno));
  auto bytes = total_bytes(slots, slot_bytes);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw_error(ErrorCode::kIo, "channel {}: cannot size the segment to {} bytes: {}", name, bytes, std::strerror(e));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw_error(ErrorCode::kIo, "channel {}: mmap failed: {}", name, std::strerror(errno));
  auto* h = new (base) Header{};
  h->slots = slots;
  h->slot_bytes = slot_bytes;
  h->consumers = consumers;
  h->producer_pid.store(::getpid(), std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < slots; ++i) {
    auto* sh = reinterpret_cast<SlotHeader*>(static_cast<std::byte*>(base) + sizeof(Header) + i * stride(slot_bytes));
    new (sh) SlotHeader{};
  }
  h->magic.store(kMagic, std::memory_order_release);  // consumers may attach from here on
  return std::unique_ptr<ShmRing>(new ShmRing(name, base, bytes, true, 0));
}

std::unique_ptr<ShmRing> ShmRing::open(const std::string& name, std::uint32_t index, Deadline deadline,
                                       const std::atomic<bool>* cancel) {
  int fd = -1;
  auto cancelled = [&](const char* waiting_for) {
    if (cancel == nullptr || !cancel->load(std::memory_order_relaxed)) return;
    if (fd >= 0) ::close(fd);
    // A symptom (scope kRank): the thread that failed the rank has the cause.
    throw_scoped(ErrorScope::kRank, ErrorCode::kPeerFailed, "channel {}: consumer {} stopped waiting for the producer "
                 "to {} it: its rank failed", name, index, waiting_for);
  };
  poll_until(
      [&] {
        if ((fd = ::shm_open(name.c_str(), O_RDWR, 0)) >= 0) return true;
        cancelled("create");
        return false;
      },
      deadline, fmt::format("channel {}: waiting for the producer to create it", name));
  struct stat st {};
  Header* h = nullptr;
  void* base = MAP_FAILED;
  poll_until(
      [&] {
        cancelled("initialise");
        if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(Header)) return false;
        base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) return false;
        h = static_cast<Header*>(base);
        if (h->magic.load(std::memory_order_acquire) == kMagic) return true;
        ::munmap(base, static_cast<std::size_t>(st.st_size));
        base = MAP_FAILED;
        return false;
      },
      deadline, fmt::format("channel {}: waiting for the producer to initialise it", name));
  ::close(fd);
  if (const auto consumers = h->consumers; index >= consumers) {
    ::munmap(base, static_cast<std::size_t>(st.st_size));
    throw_error(ErrorCode::kInvalidArgument, "channel {}: consumer {} but the ring was made for {}", name, index,
                consumers);
  }
  h->consumer_pid[index].store(::getpid(), std::memory_order_release);
  return std::unique_ptr<ShmRing>(new ShmRing(name, base, static_cast<std::size_t>(st.st_size), false, index));
}

void ShmRing::write(std::span<const std::byte> message, Deadline deadline, const std::atomic<bool>* cancel) {
  auto& h = *header_;
  if (message.size() > h.slot_bytes)
    throw_error(ErrorCode::kInvalidArgument, "channel {}: message of {} bytes exceeds the slot size {}", name_,
                message.size(), h.slot_bytes);
  const auto n = h.written.load(std::memory_order_relaxed);
  std::uint32_t slowest = 0;
  auto has_room = [&] {
    for (std::uint32_t c = 0; c < h.consumers; ++c) {
      if (n - h.read[c].value.load(std::memory_order_acquire) >= h.slots) {
        slowest = c;
        return false;
      }
    }
    return true;
  };
  if (!has_room()) {
    LivenessProbe probe;
    try {
      poll_until(
          [&] {
            if (has_room()) return true;
            // A symptom (scope kRank): the thread that failed the rank has the cause.
            if (cancel != nullptr && cancel->load(std::memory_order_relaxed))
              throw_scoped(ErrorScope::kRank, ErrorCode::kPeerFailed, "channel {}: the producer stopped waiting for "
                           "room (consumer {} a full ring behind): its rank failed", name_, slowest);
            return probe.due() && check_consumer(slowest);
          },
          deadline, "ring full");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;  // a dead consumer: already named
      throw_error(ErrorCode::kTimeout, "channel {}: consumer {} is a full ring ({} slots) behind: {}", name_, slowest,
                  h.slots, e.what());
    }
  }
  // Once every consumer has attached, the name has served its purpose: removing it now means
  // a job that is killed (and never runs this destructor) leaves nothing in /dev/shm.
  if (!unlinked_) {
    bool all = true;
    for (std::uint32_t c = 0; c < h.consumers && all; ++c) all = h.consumer_pid[c].load(std::memory_order_acquire) != 0;
    if (all) unlinked_ = ::shm_unlink(name_.c_str()) == 0 || errno == ENOENT;
  }
  auto* s = slot(n);
  auto* sh = reinterpret_cast<SlotHeader*>(s);
  sh->bytes = static_cast<std::uint32_t>(message.size());
  if (!message.empty()) std::memcpy(s + sizeof(SlotHeader), message.data(), message.size());
  sh->seq.store(n + 1, std::memory_order_release);
  h.written.store(n + 1, std::memory_order_release);
}

void ShmRing::wait_drained(Deadline deadline) {
  auto& h = *header_;
  const auto n = h.written.load(std::memory_order_acquire);
  std::uint32_t behind = 0;
  LivenessProbe probe;
  try {
    poll_until(
        [&] {
          for (std::uint32_t c = 0; c < h.consumers; ++c)
            if (h.read[c].value.load(std::memory_order_acquire) < n) {
              behind = c;
              return probe.due() && check_consumer(c);
            }
          return true;
        },
        deadline, "drain");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;  // a dead consumer: already named
    throw_error(ErrorCode::kTimeout, "channel {}: consumer {} did not read the last messages: {}", name_, behind,
                e.what());
  }
}

bool ShmRing::check_consumer(std::uint32_t c) const {
  const auto pid = header_->consumer_pid[c].load(std::memory_order_acquire);
  if (!process_alive(pid))
    throw_error(ErrorCode::kPeerFailed, "channel {}: consumer {} (pid {}, same host) died before reading its messages",
                name_, c, pid);
  return false;  // alive: keep waiting
}

void ShmRing::check_producer() const {
  const auto pid = header_->producer_pid.load(std::memory_order_acquire);
  if (!process_alive(pid))
    throw_error(ErrorCode::kPeerFailed, "channel {}: its producer (pid {}, same host) died without closing it", name_,
                pid);
}

void ShmRing::close() {
  std::uint32_t open = 0;
  header_->closed.compare_exchange_strong(open, kClosed, std::memory_order_acq_rel);
}

void ShmRing::fail(std::string_view reason) {
  if (header_->closed.load(std::memory_order_acquire) != 0) return;
  std::snprintf(header_->failure, sizeof(header_->failure), "%.*s", static_cast<int>(reason.size()), reason.data());
  header_->closed.store(kFailed, std::memory_order_release);
}

bool ShmRing::try_read(std::vector<std::byte>& out) {
  auto& h = *header_;
  auto& cur = h.read[index_].value;
  const auto n = cur.load(std::memory_order_relaxed);
  if (h.written.load(std::memory_order_acquire) <= n) return false;
  auto* s = slot(n);
  auto* sh = reinterpret_cast<SlotHeader*>(s);
  if (sh->seq.load(std::memory_order_acquire) != n + 1)
    throw_error(ErrorCode::kCorruptInput, "channel {}: slot of message {} was overwritten before consumer {} read it",
                name_, n, index_);
  out.assign(s + sizeof(SlotHeader), s + sizeof(SlotHeader) + sh->bytes);
  cur.store(n + 1, std::memory_order_release);
  return true;
}

bool ShmRing::read(std::vector<std::byte>& out, Deadline deadline, const std::atomic<bool>* cancel, bool spin) {
  bool got = false, closed = false;
  LivenessProbe probe;
  poll_until(
      [&] {
        if (try_read(out)) return got = true;
        if (cancel != nullptr && cancel->load(std::memory_order_relaxed))
          throw_error(ErrorCode::kPeerFailed, "channel {}: consumer {} stopped waiting: its rank failed", name_, index_);
        if (probe.due()) check_producer();
        // Closed is checked after an empty read, and the ring re-checked, so no message
        // published before close() is lost.
        if (auto c = header_->closed.load(std::memory_order_acquire)) {
          got = try_read(out);
          // The producer's own failure, relayed: a symptom here (scope kRank), so that the
          // producer's report, not this one, is the job's first (launchers/cli.cpp).
          if (!got && c == kFailed)
            throw_scoped(ErrorScope::kRank, ErrorCode::kPeerFailed, "channel {}: its producer failed: {}", name_,
                         std::string(header_->failure, strnlen(header_->failure, sizeof(header_->failure))));
          closed = !got;
          return true;
        }
        return false;
      },
      deadline, fmt::format("channel {}: consumer {} waiting for the next scheduling output", name_, index_),
      // A consumer may wait a whole pipeline round trip; spinning long would take the core
      // from the forward it shares it with, so it goes to short sleeps early (a sleep of 20 us
      // wakes 50-70 us later with Linux's default timer slack), unless told to spin: then it
      // yields for 50000 polls (tens of milliseconds, longer than a decode step) before
      // sleeping, so that an idle server does not keep a core busy.
      PollPolicy{200, spin ? 50000u : 2000u, std::chrono::microseconds(20)});
  (void)closed;
  return got;
}

}  // namespace trellis::runtime
