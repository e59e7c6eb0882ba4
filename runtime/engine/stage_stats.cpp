// Serving: the time shares of the middle stages reach rank 0 for /metrics (see
// engine_internal.hpp). Stage 0 is rank 0 itself and the last stage's shares ride on the
// sampler's tokens message; a middle stage has no message to rank 0 of its own, so its TP
// rank 0 sends one of 32 bytes at most once a second, and a last one when it stops.
#include <cstring>

#include "engine_internal.hpp"
#include "trellis/runtime/trace/metrics.hpp"

namespace trellis::runtime::detail {
namespace {

struct StatsWire {
  double busy = 0, comm = 0, wait = 0;  // fractions of wall time since the engine started
  std::int32_t last = 0;                // 1: the stage stopped; nothing follows
  std::int32_t pad = 0;
};

}  // namespace

StageStatsSender::StageStatsSender(transport::Link& to_rank0, const Tracer& trace, double start_s)
    : link_(to_rank0), trace_(trace), start_s_(start_s), buf_(sizeof(StatsWire)) {}

void StageStatsSender::send(bool last, Deadline deadline, const FailureFlag& failed) {
  if (req_) wait_request(*req_, deadline, failed, "stage shares to rank 0");
  const double wall = std::max(1e-9, now_seconds() - start_s_);
  const auto sh = rank_shares(trace_, wall);
  StatsWire w{sh.busy_s / wall, sh.comm_s / wall, sh.wait_s / wall, last ? 1 : 0, 0};
  std::memcpy(buf_.data(), &w, sizeof w);
  req_ = link_.isend(buf_, kTagStats);
  last_sent_s_ = now_seconds();
}

void StageStatsSender::maybe_send(Deadline deadline, const FailureFlag& failed) {
  if (now_seconds() - last_sent_s_ < 1.0) return;
  if (req_ && !req_->test()) return;  // the previous one is still on its way: skip this beat
  send(false, deadline, failed);
}

void StageStatsSender::send_last(Deadline deadline, const FailureFlag& failed) {
  send(true, deadline, failed);
  wait_request(*req_, deadline, failed, "last stage shares to rank 0");
}

StageStatsReceiver::StageStatsReceiver(std::vector<std::pair<int, transport::Link*>> stages) {
  for (auto& [stage, link] : stages) {
    From f;
    f.stage = stage;
    f.link = link;
    f.buf.resize(sizeof(StatsWire));
    from_.push_back(std::move(f));
  }
}

bool StageStatsReceiver::take(From& f) {
  if (f.done) return false;
  if (!f.req) f.req = f.link->irecv(f.buf, kTagStats);
  if (!f.req->test()) return false;
  if (f.req->bytes() != sizeof(StatsWire))
    throw_error(ErrorCode::kCorruptInput, "stage shares from stage {}: {} bytes, expected {}", f.stage,
                f.req->bytes(), sizeof(StatsWire));
  StatsWire w;
  std::memcpy(&w, f.buf.data(), sizeof w);
  f.req.reset();
  f.share = {f.stage, w.busy, w.comm, w.wait};
  f.heard = true;
  f.done = w.last == 1;
  return true;
}

void StageStatsReceiver::poll(std::vector<StageShare>& shares) {
  for (auto& f : from_) {
    while (take(f)) {
    }
    if (f.heard) shares.push_back(f.share);
  }
}

void StageStatsReceiver::drain(Deadline deadline, const FailureFlag& failed) {
  for (auto& f : from_) {
    while (!f.done) {
      if (!f.req) f.req = f.link->irecv(f.buf, kTagStats);
      wait_request(*f.req, deadline, failed,
                   fmt::format("rank 0: the last time shares of stage {} (its TP rank 0)", f.stage));
      take(f);
    }
  }
}

}  // namespace trellis::runtime::detail
