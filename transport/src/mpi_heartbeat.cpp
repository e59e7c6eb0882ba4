#include "src/mpi_heartbeat.hpp"

#include <algorithm>
#include <deque>

#include "trellis/core/clock.hpp"

namespace trellis::transport::detail {
namespace {

constexpr int kBeatTag = 0x7e1b;
// What every heartbeat carries. Static: a send to a peer behind a cut link may never
// complete, and MPI may read its buffer until it does (or forever).
const std::uint64_t kBeat = 0x7472656c6c697321ull;
// Sends to one peer that have not completed: past this many the peer is not receiving, and
// more would only pile up.
constexpr std::size_t kMaxInFlight = 8;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

MpiHeartbeat::MpiHeartbeat(MPI_Comm comm, int rank, int size, std::chrono::milliseconds silence)
    : comm_(comm), rank_(rank), size_(size), silence_ms_(silence.count()),
      last_ns_(new std::atomic<std::int64_t>[static_cast<std::size_t>(size)]) {
  for (int r = 0; r < size; ++r) last_ns_[static_cast<std::size_t>(r)].store(0);
  thread_ = std::thread([this] { loop(); });
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &MpiHeartbeat::on_finalize, &keyval_, nullptr) == MPI_SUCCESS)
    MPI_Comm_set_attr(MPI_COMM_SELF, keyval_, this);
}

MpiHeartbeat::~MpiHeartbeat() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && keyval_ != MPI_KEYVAL_INVALID) {
    MPI_Comm_delete_attr(MPI_COMM_SELF, keyval_);  // calls on_finalize: halt()
    MPI_Comm_free_keyval(&keyval_);
  }
  halt();
}

void MpiHeartbeat::halt() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

int MpiHeartbeat::on_finalize(MPI_Comm, int, void* attr, void*) {
  static_cast<MpiHeartbeat*>(attr)->halt();
  return MPI_SUCCESS;
}

void MpiHeartbeat::set_silence(std::chrono::milliseconds silence) { silence_ms_.store(silence.count()); }

std::vector<MpiHeartbeat::Silent> MpiHeartbeat::silent(std::chrono::milliseconds extra) const {
  const std::int64_t now = now_ns(), limit = (silence_ms_.load() + extra.count()) * 1000000;
  std::vector<Silent> out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || (rank_ != 0 && r != 0)) continue;
    const std::int64_t last = last_ns_[static_cast<std::size_t>(r)].load();
    if (last != 0 && now - last > limit) out.push_back({r, static_cast<double>(now - last) / 1e9});
  }
  return out;
}

double MpiHeartbeat::quiet_for(int rank) const {
  if (rank < 0 || rank >= size_) return -1;
  const std::int64_t last = last_ns_[static_cast<std::size_t>(rank)].load();
  return last == 0 ? -1.0 : static_cast<double>(now_ns() - last) / 1e9;
}

std::chrono::milliseconds MpiHeartbeat::interval() const {
  // Several beats per silence window, so one late wake-up of this thread on a busy host is
  // not taken for a silence; at most 4 per second.
  return std::chrono::milliseconds(std::clamp<std::int64_t>(silence_ms_.load() / 8, 20, 250));
}

void MpiHeartbeat::loop() {
  // Sends in flight per peer. Their requests are tested, never waited on.
  std::vector<std::deque<MPI_Request>> sent(static_cast<std::size_t>(size_));
  std::uint64_t in = 0;
  while (!stop_.load()) {
    const auto gap = interval();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (rank_ != 0 && r != 0)) continue;
      auto& q = sent[static_cast<std::size_t>(r)];
      while (!q.empty()) {
        int done = 0;
        if (MPI_Test(&q.front(), &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;  // the link failed: drop it
        if (!done) break;
        q.pop_front();
      }
      if (q.size() >= kMaxInFlight) continue;
      MPI_Request req;
      if (MPI_Isend(&kBeat, 1, MPI_UINT64_T, r, kBeatTag, comm_, &req) == MPI_SUCCESS) q.push_back(req);
    }
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kBeatTag, comm_, &flag, &st) != MPI_SUCCESS || !flag) break;
      if (MPI_Recv(&in, 1, MPI_UINT64_T, st.MPI_SOURCE, kBeatTag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < size_) last_ns_[static_cast<std::size_t>(st.MPI_SOURCE)].store(now_ns());
    }
    std::this_thread::sleep_for(gap);
  }
  // Sends still in flight: freed (MPI completes or drops them; kBeat stays valid).
  for (auto& q : sent)
    for (auto& r : q) MPI_Request_free(&r);
}

}  // namespace trellis::transport::detail
