// The shm backend: same-host links through one POSIX shared-memory segment per rank pair
// (two SPSC rings, see shm_ring.hpp). The lowest-latency path in a host: a small message is
// one 64-byte record written by the sender and read by the receiver, no system call.
//
// Segment names carry the job token, so two jobs on one host never open each other's
// segments, and the creator's pid; the segment is unlinked as soon as both sides mapped it,
// and a job killed before that leaves a name the next start sweeps (core/shm_names.hpp). A peer that dies is noticed by its pid (the rings cannot
// report it) and turns waits on that link into kPeerFailed naming the rank.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <new>

#include "src/links/common.hpp"
#include "src/links/shm/shm_ring.hpp"
#include "src/wait.hpp"
#include "trellis/core/shm_names.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::transport::links {
namespace {

using shm::align_up;
using shm::kHeaderBytes;
using shm::RecordHeader;
using shm::RingControl;
using shm::SegmentHeader;

class Mapping {
 public:
  Mapping(void* addr, std::size_t len) : addr_(addr), len_(len) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { munmap(addr_, len_); }
  std::byte* data() const { return static_cast<std::byte*>(addr_); }

 private:
  void* addr_;
  std::size_t len_;
};

class ShmTransport;

class ShmLink final : public StreamLink<ShmLink> {
 public:
  ShmLink(ShmTransport& t, int peer, std::unique_ptr<Mapping> map, bool lower, std::size_t ring_bytes)
      : StreamLink(Backend::kShm, peer), transport_(t), map_(std::move(map)), lower_(lower), ring_bytes_(ring_bytes) {
    hdr_ = reinterpret_cast<SegmentHeader*>(map_->data());
    std::byte* rings = map_->data() + align_up(sizeof(SegmentHeader));
    out_ = &hdr_->ring[lower ? 0 : 1];
    in_ = &hdr_->ring[lower ? 1 : 0];
    out_data_ = rings + (lower ? 0 : ring_bytes);
    in_data_ = rings + (lower ? ring_bytes : 0);
    head_ = out_->head.load(std::memory_order_relaxed);
    tail_ = in_->tail.load(std::memory_order_relaxed);
    max_chunk_ = shm::max_chunk(ring_bytes);
    hot_bytes_ = shm::hot_bytes(ring_bytes);
  }

  // For StreamLink: write what the ring takes now / read what has arrived.
  void queue_send(std::shared_ptr<SendOp> op) {
    sends_.push_back(std::move(op));
    push();
  }
  void receive_now() { pull(); }

  void drive();
  void progress_once() {
    push();
    pull();
  }

  void check_failed(const Request& r) {
    if (failed_.empty()) {
      // Reading the clock costs ~55 ns here, as much as the rest of a poll: when two ranks
      // share a core a wait spins at least 32 polls before it yields, and a clock read per
      // poll made the shm link's one-way hand-over ~0.8 us slower than ucx's.
      if ((++polls_ & 255) != 0) return;
      auto now = Clock::now();
      if (now - last_liveness_check_ < std::chrono::milliseconds(100)) return;
      last_liveness_check_ = now;
      auto pid = hdr_->pid[lower_ ? 1 : 0].load(std::memory_order_acquire);
      if (process_alive(pid)) return;
      progress_once();  // what it sent before dying is still in the ring
      failed_ = fmt::format("rank {} (pid {}, same host) died", peer_, pid);
    }
    throw_scoped(ErrorScope::kLink, ErrorCode::kPeerFailed, "{}: {}", r.describe(), failed_);
  }

  void finish_or_abandon(SendOp& op) {
    if (op.sent == 0 && !(front_started_ && sends_.front().get() == &op)) {
      std::erase_if(sends_, [&](const auto& s) { return s.get() == &op; });
      return;
    }
    // Half a message is in the ring: the rest must follow or the stream is garbage.
    auto until = Clock::now() + std::chrono::seconds(1);
    while (!op.complete && failed_.empty() && Clock::now() < until) drive();
    if (!op.complete) {
      std::erase_if(sends_, [&](const auto& s) { return s.get() == &op; });
      if (failed_.empty()) failed_ = fmt::format("a send to rank {} was abandoned mid-message", peer_);
    }
  }

 private:
  // Writes as much of the queued sends as the ring takes.
  void push() {
    while (!sends_.empty()) {
      SendOp& op = *sends_.front();
      std::size_t used = head_ - tail_cache_;
      if (ring_bytes_ - used < 2 * shm::kAlign) {
        tail_cache_ = out_->tail.load(std::memory_order_acquire);
        used = head_ - tail_cache_;
      }
      std::size_t pos = head_ % ring_bytes_;
      if (pos >= hot_bytes_ && head_ >= next_rewind_check_) {
        rewind(pos);
        used = head_ - tail_cache_;
        pos = head_ % ring_bytes_;
      }
      std::size_t free = ring_bytes_ - used, to_end = ring_bytes_ - pos;
      if (free < shm::kAlign) return;  // full: the receiver has not caught up
      std::size_t remaining = op.data.size() - op.sent;
      std::size_t chunk = std::min<std::size_t>({remaining, max_chunk_, to_end - kHeaderBytes, free - kHeaderBytes});
      auto* h = reinterpret_cast<RecordHeader*>(out_data_ + pos);
      h->total = op.data.size();
      h->tag = op.tag;
      h->len = static_cast<std::uint32_t>(chunk);
      if (chunk) std::memcpy(out_data_ + pos + kHeaderBytes, op.data.data() + op.sent, chunk);
      head_ += align_up(kHeaderBytes + chunk);
      out_->head.store(head_, std::memory_order_release);
      detail::note_progress();
      op.sent += chunk;
      front_started_ = true;
      if (op.sent == op.data.size()) {
        op.complete = true;
        front_started_ = false;
        sends_.pop_front();
      }
    }
  }

  // Keeps a quiet link's records in the first hot_bytes_ of the ring, so that the memory it
  // touches stays in the caches: once the write position has passed hot_bytes_ and the
  // receiver has read everything, a pad record sends both sides back to the ring's start.
  // Without it every message lands on new lines of the whole ring (4 MiB by default), none
  // of them cached. Checked at most once per hot_bytes_/4 of traffic (it reads the
  // receiver's cache line).
  void rewind(std::size_t pos) {
    next_rewind_check_ = head_ + hot_bytes_ / 4;
    tail_cache_ = out_->tail.load(std::memory_order_acquire);
    if (tail_cache_ != head_) return;  // the receiver is still reading
    auto* h = reinterpret_cast<RecordHeader*>(out_data_ + pos);
    h->total = shm::kPadRecord;
    h->tag = 0;
    h->len = 0;
    head_ += ring_bytes_ - pos;  // published with the next record
  }

  // Reads every record the peer has published.
  void pull() {
    std::uint64_t head = in_->head.load(std::memory_order_acquire);
    while (tail_ != head) {
      std::size_t pos = tail_ % ring_bytes_;
      const auto* h = reinterpret_cast<const RecordHeader*>(in_data_ + pos);
      if (h->total == shm::kPadRecord) {
        tail_ += ring_bytes_ - pos;
        continue;
      }
      if (!cur_.active) cur_.start(matcher_, h->tag, h->total, peer_);
      deliver(in_data_ + pos + kHeaderBytes, h->len);
      tail_ += align_up(kHeaderBytes + h->len);
      in_->tail.store(tail_, std::memory_order_release);
      detail::note_progress();
    }
  }

  void deliver(const std::byte* p, std::size_t len) {
    // A zero-byte message has nothing to copy (and an empty buffer's data() may be null).
    if (len != 0)
      if (std::byte* dst = cur_.target()) std::memcpy(dst, p, len);
    cur_.got += len;
    if (cur_.got < cur_.total) return;
    cur_.finish(matcher_, peer_);
  }

  ShmTransport& transport_;
  std::unique_ptr<Mapping> map_;
  bool lower_;
  std::size_t ring_bytes_, max_chunk_ = 0, hot_bytes_ = 0;
  SegmentHeader* hdr_ = nullptr;
  RingControl* out_ = nullptr;
  RingControl* in_ = nullptr;
  std::byte* out_data_ = nullptr;
  std::byte* in_data_ = nullptr;
  std::uint64_t head_ = 0, tail_cache_ = 0, tail_ = 0, next_rewind_check_ = 0;
  std::deque<std::shared_ptr<SendOp>> sends_;
  bool front_started_ = false;
  Clock::time_point last_liveness_check_ = Clock::now();
  unsigned polls_ = 0;  // failed polls, to read the clock only every 256th
};

class ShmTransport final : public TransportOf<ShmLink> {
 public:
  ShmTransport() : TransportOf(Backend::kShm) {}
  Capabilities capabilities() const override { return {false, true, false, 0}; }
  void progress() override {
    for (auto& [peer, l] : links_) l->progress_once();
  }
  std::string describe() const override {
    return fmt::format("shm ({} peers, {} ring per direction)", links_.size(), format_bytes(static_cast<double>(ring_bytes_)));
  }

  void add(int peer, std::unique_ptr<Mapping> map, bool lower) {
    links_.emplace(peer, std::make_unique<ShmLink>(*this, peer, std::move(map), lower, ring_bytes_));
  }
  std::size_t ring_bytes_ = 0;
};

void ShmLink::drive() { transport_.progress(); }

// Named by its creator, rank `lo` (pid `creator`), so that a later start can remove it if
// the job dies between create and attach (core/shm_names.hpp), and by the job's token.
std::string segment_name(std::int64_t creator, const std::string& token, int lo, int hi) {
  return shm_name(creator, fmt::format("{}-{}-{}", token.substr(0, 24), lo, hi));
}

// Faults in the pages a quiet link uses (each ring's first hot_bytes + one record) before
// the first message: otherwise the first pass over them costs a page fault per 4 KiB page
// on both sides (allocation and zeroing where written first, mapping where read), and a
// 4 KiB message took ~5 us instead of ~0.4 us until the ring had been used once (issue #4,
// docs/benchmarks.md). The creator writes the pages (allocates them, before the peer
// attaches or any record is written), the attacher reads them (maps them). Pages further
// into the ring are touched by large messages only, and only on the first pass; the whole
// ring is not committed up front, so many links per host cost little memory until used.
void prefault_hot(std::byte* segment, std::size_t ring_bytes, bool creator) {
  std::byte* rings = segment + align_up(sizeof(SegmentHeader));
  const std::size_t span = std::min(ring_bytes, shm::hot_bytes(ring_bytes) + shm::max_chunk(ring_bytes) + shm::kAlign);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  for (int r = 0; r < 2; ++r) {
    std::byte* base = rings + static_cast<std::size_t>(r) * ring_bytes;
    if (creator) {
      std::memset(base, 0, span);
    } else {
      for (std::size_t off = 0; off < span; off += page) static_cast<void>(*reinterpret_cast<volatile const char*>(base + off));
    }
  }
}

std::unique_ptr<Mapping> map_segment(const std::string& name, bool create, std::size_t ring_bytes) {
  int fd = shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) throw_error(ErrorCode::kIo, "shm_open({}) failed: {}", name, std::strerror(errno));
  std::size_t bytes = shm::segment_bytes(ring_bytes);
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw_error(ErrorCode::kIo, "sizing shared-memory segment {} to {} failed: {}", name, bytes, std::strerror(err));
  }
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (addr == MAP_FAILED) throw_error(ErrorCode::kIo, "mmap of {} failed: {}", name, std::strerror(err));
  auto map = std::make_unique<Mapping>(addr, bytes);
  auto* hdr = reinterpret_cast<SegmentHeader*>(addr);
  if (create) {
    new (hdr) SegmentHeader{};
    hdr->magic = shm::kMagic;
    hdr->ring_bytes = ring_bytes;
    hdr->pid[0].store(getpid(), std::memory_order_release);
  } else {
    if (hdr->magic != shm::kMagic || hdr->ring_bytes != ring_bytes)
      throw_error(ErrorCode::kCorruptInput, "shared-memory segment {} has the wrong layout", name);
    hdr->pid[1].store(getpid(), std::memory_order_release);
  }
  prefault_hot(map->data(), ring_bytes, create);
  return map;
}

// Runs one setup phase on every rank, then agrees: if any rank failed, all throw.
template <typename Fn>
void agreed_phase(Bootstrap& world, Deadline d, const char* what, Fn&& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (world.any(!error.empty(), d)) {
    if (error.empty()) throw_error(ErrorCode::kPeerFailed, "shm {}: another rank failed (see its log)", what);
    throw_error(ErrorCode::kIo, "shm {} on rank {}: {}", what, world.rank(), error);
  }
}

}  // namespace

std::unique_ptr<Transport> connect_shm(Bootstrap& world, const std::vector<int>& peers, const Config& config) {
  auto d = Deadline::after(LinkSettings::from(config).connect_timeout);
  std::size_t ring = config.get_size("comm.shm.ring_bytes");
  if (ring < (64u << 10) || ring > (1ull << 30) || ring % shm::kAlign != 0)
    throw_error(ErrorCode::kInvalidArgument, "comm.shm.ring_bytes = {}: need 64 KiB .. 1 GiB, a multiple of 64", ring);
  auto hosts = allgather_strings(world, host_identity(world), d);
  std::string wrong;
  for (int p : peers)
    if (hosts[p] != hosts[world.rank()])
      wrong = fmt::format("rank {} runs on {}, rank {} on {}", p, hosts[p], world.rank(), hosts[world.rank()]);
  if (world.any(!wrong.empty(), d))
    throw_error(ErrorCode::kInvalidArgument, "shm links join ranks of one host only{}{}", wrong.empty() ? "" : ": ", wrong);
  auto token = job_token(world, d);
  const auto pids = allgather_strings(world, std::to_string(getpid()), d);
  auto pid_of = [&](int rank) { return std::stoll(pids[static_cast<std::size_t>(rank)]); };
  auto t = std::make_unique<ShmTransport>();
  t->ring_bytes_ = ring;
  const int me = world.rank();
  agreed_phase(world, d, "create", [&] {
    for (int p : peers)
      if (p > me) t->add(p, map_segment(segment_name(getpid(), token, me, p), true, ring), true);
  });
  agreed_phase(world, d, "attach", [&] {
    for (int p : peers)
      if (p < me) {
        auto name = segment_name(pid_of(p), token, p, me);
        t->add(p, map_segment(name, false, ring), false);
        shm_unlink(name.c_str());  // both sides mapped it; nothing to clean up after a crash
      }
  });
  return t;
}

}  // namespace trellis::transport::links
