// MPI bootstrap. Blocking MPI calls cannot time out, so every operation here is issued
// non-blocking and polled against its deadline; a peer that died or stalled becomes a
// kTimeout naming the operation and the peer instead of a hang.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "src/mpi_error.hpp"
#include "src/mpi_heartbeat.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/poll.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport {

std::string detail::mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

void detail::throw_mpi_failed(int rc, const char* what) {
  throw_error(ErrorCode::kPeerFailed, "MPI {} failed: {}", what, mpi_error_text(rc));
}

namespace {

using detail::check_mpi;

void wait_all(std::span<MPI_Request> reqs, Deadline deadline, const std::string& what) {
  poll_until([&] {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), what.c_str());
    return done != 0;
  }, deadline, what);
}

// The buffers of one collective. MPI cannot cancel a collective: one that timed out here may
// still read or write its buffers when the late ranks arrive, so a timed-out collective's
// buffers are kept until the process ends instead of being freed under MPI's feet (freeing
// them corrupted the heap: a group test whose bootstrap all-gather timed out aborted in
// malloc_consolidate). Nothing the caller owns is handed to a collective; results are copied
// out once it completed.
struct CollBuffers {
  int i_in = 0, i_out = 0;
  double d_in = 0, d_out = 0;
  std::uint64_t n = 0;
  std::vector<int> lens, displs;
  std::vector<std::byte> send, recv;
};

void keep_forever(std::shared_ptr<CollBuffers> b) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<CollBuffers>>();  // never freed, on purpose
  std::lock_guard lock(mu);
  kept->push_back(std::move(b));
}

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap() {
    // A process that initialised MPI itself (the test harness) keeps ownership of it.
    int initialized = 0;
    MPI_Initialized(&initialized);
    owns_mpi_ = !initialized;
    if (owns_mpi_) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    // Errors come back as return codes (check_mpi turns them into trellis::Error).
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    host_.assign(name, len);
  }
  ~MpiBootstrap() override {
    // A harness that owns MPI may already have finalised it (static bootstraps in tests).
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    beat_.reset();
    // A notice nobody received (rank 0 gone) must not hold up the exit, and MPI may still read
    // its buffer after the request is freed: the buffers stay allocated (eight bytes each).
    for (auto& n : notices_) {
      if (n.second != MPI_REQUEST_NULL) MPI_Request_free(&n.second);
      (void)n.first.release();
    }
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& hostname() const override { return host_; }
  bool is_mpi() const override { return true; }

  void barrier(Deadline deadline) override {
    arrive();
    auto b = std::make_shared<CollBuffers>();
    MPI_Request r;
    check_mpi(MPI_Ibarrier(comm_, &r), "barrier");
    wait_world(b, r, deadline, "barrier over all ranks");
  }

  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine, Deadline deadline) override {
    arrive();
    auto b = std::make_shared<CollBuffers>();
    b->i_in = static_cast<int>(mine.size());
    b->lens.resize(static_cast<std::size_t>(size_));
    MPI_Request r;
    check_mpi(MPI_Iallgather(&b->i_in, 1, MPI_INT, b->lens.data(), 1, MPI_INT, comm_, &r), "allgather");
    wait_world(b, r, deadline, "allgather (sizes) over all ranks");
    b->displs.assign(static_cast<std::size_t>(size_), 0);
    std::exclusive_scan(b->lens.begin(), b->lens.end(), b->displs.begin(), 0);
    b->recv.resize(static_cast<std::size_t>(b->displs.back() + b->lens.back()));
    b->send.assign(mine.begin(), mine.end());
    check_mpi(MPI_Iallgatherv(b->send.data(), b->i_in, MPI_BYTE, b->recv.data(), b->lens.data(), b->displs.data(),
                              MPI_BYTE, comm_, &r), "allgatherv");
    wait_world(b, r, deadline, "allgather (data) over all ranks");
    std::vector<std::vector<std::byte>> out(size_);
    for (int i = 0; i < size_; ++i)
      out[i].assign(b->recv.begin() + b->displs[i], b->recv.begin() + b->displs[i] + b->lens[i]);
    return out;
  }

  void broadcast(std::vector<std::byte>& data, int root, Deadline deadline) override {
    check_rank(root, "broadcast");
    arrive();
    auto b = std::make_shared<CollBuffers>();
    b->n = data.size();
    MPI_Request r;
    check_mpi(MPI_Ibcast(&b->n, 1, MPI_UINT64_T, root, comm_, &r), "broadcast");
    wait_world(b, r, deadline, fmt::format("broadcast (size) from rank {}", root));
    if (rank_ == root) b->recv = data;
    else b->recv.resize(b->n);
    check_mpi(MPI_Ibcast(b->recv.data(), static_cast<int>(b->n), MPI_BYTE, root, comm_, &r), "broadcast");
    wait_world(b, r, deadline, fmt::format("broadcast from rank {}", root));
    data = b->recv;
  }

  bool any(bool mine, Deadline deadline) override {
    arrive();
    auto b = std::make_shared<CollBuffers>();
    b->i_in = mine ? 1 : 0;
    MPI_Request r;
    check_mpi(MPI_Iallreduce(&b->i_in, &b->i_out, 1, MPI_INT, MPI_LOR, comm_, &r), "allreduce");
    wait_world(b, r, deadline, "agreement (allreduce) over all ranks");
    return b->i_out != 0;
  }

  double max(double mine, Deadline deadline) override {
    arrive();
    auto b = std::make_shared<CollBuffers>();
    b->d_in = mine;
    MPI_Request r;
    check_mpi(MPI_Iallreduce(&b->d_in, &b->d_out, 1, MPI_DOUBLE, MPI_MAX, comm_, &r), "allreduce");
    wait_world(b, r, deadline, "max (allreduce) over all ranks");
    return b->d_out;
  }

  void send(int peer, int tag, std::span<const std::byte> data, Deadline deadline) override {
    check_rank(peer, "send");
    MPI_Request r;
    check_mpi(MPI_Isend(data.data(), static_cast<int>(data.size()), MPI_BYTE, peer, tag, comm_, &r), "send");
    try {
      wait_all({&r, 1}, deadline, fmt::format("send of {} bytes to rank {}", data.size(), peer));
    } catch (...) {
      cancel(r);
      throw;
    }
  }

  void recv(int peer, int tag, std::span<std::byte> data, Deadline deadline) override {
    check_rank(peer, "recv");
    MPI_Request r;
    MPI_Status status;
    check_mpi(MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_BYTE, peer, tag, comm_, &r), "recv");
    try {
      wait_status(r, status, deadline, fmt::format("receive of {} bytes from rank {}", data.size(), peer));
    } catch (...) {
      cancel(r);  // a late message must not land in a buffer the caller gave up on
      throw;
    }
    check_count(status, data.size(), peer);
  }

  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in, int tag,
                Deadline deadline) override {
    check_rank(to, "sendrecv");
    check_rank(from, "sendrecv");
    MPI_Request r[2];
    check_mpi(MPI_Irecv(in.data(), static_cast<int>(in.size()), MPI_BYTE, from, tag, comm_, &r[0]), "recv");
    check_mpi(MPI_Isend(out.data(), static_cast<int>(out.size()), MPI_BYTE, to, tag, comm_, &r[1]), "send");
    try {
      wait_all(r, deadline, fmt::format("exchange with ranks {} (send) and {} (receive)", to, from));
    } catch (...) {
      cancel(r[0]);
      cancel(r[1]);
      throw;
    }
  }

  void watch_liveness(std::chrono::milliseconds silence) override {
    if (size_ < 2) return;
    if (beat_) return beat_->set_silence(silence);
    int level = 0;
    MPI_Query_thread(&level);
    if (level != MPI_THREAD_MULTIPLE) return;  // a harness that initialised MPI single-threaded
    beat_ = std::make_unique<detail::MpiHeartbeat>(comm_, rank_, size_, silence);
  }

  std::vector<SilentRank> silent_ranks() const override {
    std::vector<SilentRank> out;
    if (!beat_) return out;
    for (const auto& s : beat_->silent(rank_ == 0 ? std::chrono::milliseconds(0) : kNamingGrace))
      out.push_back({s.rank, s.seconds});
    return out;
  }

  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 private:
  // Who waits on whom in a world collective. A collective that times out cannot say which
  // rank never came, so every rank announces each collective it enters to rank 0 (a small
  // message, start-up only), and rank 0, when one times out, names the ranks whose last
  // announcement is older (the fault suite saw a link cut and a stopped rank during start-up
  // reported as "allgather over all ranks: no answer", naming nobody). The other ranks wait
  // kNamingGrace longer, so rank 0's naming comes first; one that still times out names rank
  // 0, which collects the announcements and did not report either.
  static constexpr int kArriveTag = 0x7e1a;
  static constexpr auto kNamingGrace = std::chrono::milliseconds(1500);

  void arrive() {
    ++collectives_;
    if (rank_ == 0) {
      if (reached_.empty()) reached_.assign(static_cast<std::size_t>(size_), 0);
      reached_[0] = collectives_;
      drain_arrivals();
      return;
    }
    while (!notices_.empty()) {  // completed sends free their buffer
      int done = 0;
      MPI_Test(&notices_.front().second, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      notices_.pop_front();
    }
    notices_.emplace_back(std::make_unique<std::uint64_t>(collectives_), MPI_REQUEST_NULL);
    auto& n = notices_.back();
    check_mpi(MPI_Isend(n.first.get(), 1, MPI_UINT64_T, 0, kArriveTag, comm_, &n.second), "collective notice");
  }
  void drain_arrivals() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kArriveTag, comm_, &flag, &st) != MPI_SUCCESS || !flag) return;
      std::uint64_t seq = 0;
      if (MPI_Recv(&seq, 1, MPI_UINT64_T, st.MPI_SOURCE, kArriveTag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      auto& r = reached_[static_cast<std::size_t>(st.MPI_SOURCE)];
      r = std::max(r, seq);
    }
  }
  // Rank 0: the ranks that have not announced the current collective, as "2 3".
  std::string missing_ranks() {
    drain_arrivals();
    std::string out;
    for (int r = 1; r < size_; ++r)
      if (reached_[static_cast<std::size_t>(r)] < collectives_) out += (out.empty() ? "" : " ") + std::to_string(r);
    return out;
  }
  void wait_world(const std::shared_ptr<CollBuffers>& b, MPI_Request& r, Deadline deadline, const std::string& what) {
    const bool root = rank_ == 0;
    const Deadline d = root || deadline.is_never() ? deadline : Deadline::after(deadline.remaining() + kNamingGrace);
    auto last_check = Clock::now();
    try {
      poll_until([&] {
        int done = 0;
        check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what.c_str());
        if (done) return true;
        if (beat_ && Clock::now() - last_check >= std::chrono::milliseconds(100)) {
          last_check = Clock::now();
          check_liveness(what);
        }
        return false;
      }, d, what);
    } catch (const Error& e) {
      keep_forever(b);
      if (e.code() != ErrorCode::kTimeout) throw;
      if (!root)
        throw_error(ErrorCode::kPeerFailed, "{}; rank 0, which would name the ranks that never came, did not either: "
                    "suspect rank 0 (or the link to it)", e.what());
      const std::string gone = missing_ranks();
      if (gone.empty()) throw;
      // A collective with a short deadline can run out before a stopped rank's silence has
      // lasted the whole silence window; among the ranks that never came, those whose
      // heartbeats stopped (4 beats missed) are the cause, the others are only late (the
      // fault suite saw "waiting for world rank(s) 1 3" when rank 3 was stopped and rank 1
      // still busy, and read it as blaming rank 1).
      if (beat_) {
        std::string silent, late;
        double longest = 0;
        for (const auto& r : split(gone, ' ')) {
          const double q = beat_->quiet_for(std::stoi(r));
          if (q * 1000 >= 4.0 * static_cast<double>(beat_->interval().count())) {
            silent += (silent.empty() ? "" : " ") + r;
            longest = std::max(longest, q);
          } else {
            late += (late.empty() ? "" : " ") + r;
          }
        }
        if (!silent.empty())
          throw_error(ErrorCode::kPeerFailed, "{}: waiting for world rank(s) {}, silent for {:.1f} s (no heartbeat: "
                      "stopped or hung, or behind a cut link){} (world collective #{} of this job)", e.what(), silent,
                      longest, late.empty() ? "" : fmt::format("; rank(s) {} had not reached it either but still beat",
                                                               late), collectives_);
      }
      throw_error(ErrorCode::kPeerFailed, "{}: waiting for world rank(s) {}, which never reached it (world collective "
                  "#{} of this job)", e.what(), gone, collectives_);
    } catch (...) {
      keep_forever(b);
      throw;
    }
  }
  // Throws when a rank this collective waits on stopped sending heartbeats: rank 0 names
  // the silent ranks; the others name rank 0 only after kNamingGrace more, so that rank 0,
  // which hears from everyone, is the one that speaks when it can.
  void check_liveness(const std::string& what) {
    const bool root = rank_ == 0;
    const auto silent = silent_ranks();
    if (silent.empty()) return;
    std::string ranks;
    double longest = 0;
    for (const auto& s : silent) {
      ranks += (ranks.empty() ? "" : " ") + std::to_string(s.rank);
      longest = std::max(longest, s.seconds);
    }
    if (root)
      throw_error(ErrorCode::kPeerFailed, "{}: waiting for world rank(s) {}, silent for {:.1f} s (no heartbeat: the "
                  "rank stopped or hung, or the link to its host is cut; world collective #{} of this job)",
                  what, ranks, longest, collectives_);
    throw_error(ErrorCode::kPeerFailed, "{}: rank 0 has sent no heartbeat for {:.1f} s: suspect rank 0 (stopped or "
                "hung) or the link to its host", what, longest);
  }

  void check_rank(int peer, const char* op) const {
    if (peer < 0 || peer >= size_)
      throw_error(ErrorCode::kInvalidArgument, "{} to rank {} in a world of {} ranks", op, peer, size_);
  }
  void wait_status(MPI_Request& r, MPI_Status& status, Deadline deadline, const std::string& what) {
    poll_until([&] {
      int done = 0;
      check_mpi(MPI_Test(&r, &done, &status), what.c_str());
      return done != 0;
    }, deadline, what);
  }
  static void cancel(MPI_Request& r) {
    if (r == MPI_REQUEST_NULL) return;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
  static void check_count(const MPI_Status& status, std::size_t expected, int peer) {
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (static_cast<std::size_t>(got) != expected)
      throw_error(ErrorCode::kCorruptInput, "rank {} sent {} bytes where {} were expected", peer, got, expected);
  }

  std::unique_ptr<detail::MpiHeartbeat> beat_;  // after watch_liveness()
  std::uint64_t collectives_ = 0;               // world collectives entered, in order (same on every rank)
  std::vector<std::uint64_t> reached_;          // rank 0: the last one each rank announced
  std::deque<std::pair<std::unique_ptr<std::uint64_t>, MPI_Request>> notices_;  // sends in flight
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool owns_mpi_ = false;
  std::string host_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_mpi_bootstrap() { return std::make_unique<MpiBootstrap>(); }

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, len);
  // Open MPI appends a long build description after the first line.
  if (auto nl = s.find_first_of("\n,"); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace trellis::transport
