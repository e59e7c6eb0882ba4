// Measurements of `trellis bench comm`: point-to-point over a link backend, all-reduce over a
// Group, stage streaming (structure-aware vs baseline). Medians everywhere; every byte that
// arrives is checked at least once per point.
#include <algorithm>
#include <cstring>

#include "cmd_bench_comm.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::launchers::comm {
namespace {

using transport::Backend;
using transport::DType;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::byte pattern(std::size_t i, int salt) { return static_cast<std::byte>((i * 251 + static_cast<std::size_t>(salt)) >> 3); }

// Fewer iterations as messages grow: every point costs about the same time.
int iters_for(std::size_t bytes, int iters) {
  if (bytes <= (64u << 10)) return iters;
  return std::max(5, static_cast<int>(static_cast<double>(iters) * (64u << 10) / static_cast<double>(bytes) * 4));
}

bool check(const std::vector<std::byte>& v, std::size_t n, int salt) {
  for (std::size_t i = 0; i < n; ++i)
    if (v[i] != pattern(i, salt)) return false;
  return true;
}

Point p2p_point(Session& s, transport::Link& link, std::size_t n, const Budget& b) {
  const bool first = s.rank() == 0;
  const PollPolicy pol = transport::wait_policy(s.config);  // settings comm.wait_*
  std::vector<std::byte> out(n), in(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = pattern(i, s.rank());
  const int k = iters_for(n, b.iters), warm = std::min(b.warmup, k);
  std::vector<double> rtt;
  bool ok = true;
  for (int it = -warm; it < k; ++it) {
    double t0 = now_seconds();
    if (first) {
      auto r = link.irecv(in, 1);
      link.isend(out, 1)->wait(s.deadline(), pol);
      r->wait(s.deadline(), pol);
    } else {
      link.irecv(in, 1)->wait(s.deadline(), pol);
      link.isend(out, 1)->wait(s.deadline(), pol);
    }
    if (it >= 0) rtt.push_back(now_seconds() - t0);
    if (it == -warm || it == k - 1) ok = ok && check(in, n, 1 - s.rank());
  }
  // Bandwidth: a window of messages in flight, then a one-byte acknowledgement.
  const int window = static_cast<int>(std::clamp<std::size_t>((64u << 20) / std::max<std::size_t>(n, 1), 1, 16));
  std::vector<std::vector<std::byte>> ins(first ? 0 : static_cast<std::size_t>(window), std::vector<std::byte>(n));
  std::byte ack{};
  std::vector<double> bw;
  const int reps = std::max(3, k / 8);
  for (int rep = -1; rep < reps; ++rep) {
    double t0 = now_seconds();
    std::vector<transport::RequestPtr> reqs;
    if (first) {
      auto a = link.irecv({&ack, 1}, 3);
      for (int w = 0; w < window; ++w) reqs.push_back(link.isend(out, 2));
      for (auto& r : reqs) r->wait(s.deadline(), pol);
      a->wait(s.deadline(), pol);
    } else {
      for (int w = 0; w < window; ++w) reqs.push_back(link.irecv(ins[static_cast<std::size_t>(w)], 2));
      for (auto& r : reqs) r->wait(s.deadline(), pol);
      link.isend({&ack, 1}, 3)->wait(s.deadline(), pol);
    }
    if (rep >= 0) bw.push_back(static_cast<double>(n) * window / (now_seconds() - t0));
  }
  if (!first && window > 0) ok = ok && check(ins.back(), n, 0);
  return {n, median(rtt) / 2, median(bw), ok};
}

}  // namespace

std::string link_class_between(Session& s, int a, int b) {
  auto hosts = transport::allgather_strings(s.world(), s.world().hostname(), s.deadline());
  return hosts[static_cast<std::size_t>(a)] == hosts[static_cast<std::size_t>(b)] ? "shm" : "tcp";
}

std::optional<Series> measure_p2p(Session& s, Backend backend, const std::vector<std::size_t>& sizes, const Budget& b,
                                  std::string& why) {
  std::vector<int> peers;
  if (s.rank() < 2) peers.push_back(1 - s.rank());
  std::unique_ptr<transport::Transport> t;
  why.clear();
  try {
    t = transport::connect(backend, s.world(), peers, s.config);
  } catch (const Error& e) {
    why = e.what();
  }
  // Every rank learns whether anyone failed, so all skip alike.
  auto whys = transport::allgather_strings(s.world(), why, s.deadline());
  for (const auto& w : whys)
    if (!w.empty()) why = w;
  if (!why.empty()) return std::nullopt;
  Series series{std::string(to_string(backend)), link_class_between(s, 0, 1), 2, {}, t->describe()};
  for (std::size_t n : sizes) {
    Point p;
    if (s.rank() < 2) p = p2p_point(s, t->link(1 - s.rank()), n, b);
    p.verified = !s.world().any(!p.verified, s.deadline());
    series.points.push_back(p);
  }
  s.world().barrier(s.deadline());
  return series;
}

// Groups are measured interleaved (every repetition runs each group once), so a change of
// load on this shared machine hits all of them alike.
std::vector<Series> measure_allreduce(Session& s, const std::vector<transport::Group*>& groups,
                                      const std::vector<std::size_t>& sizes, const Budget& b,
                                      const std::vector<std::span<std::byte>>& windows) {
  std::vector<Series> series(groups.size());
  for (std::size_t gi = 0; gi < groups.size(); ++gi)
    if (groups[gi] != nullptr) series[gi].name = groups[gi]->describe(), series[gi].ranks = groups[gi]->size();
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(1, bytes / 4);
    std::vector<float> own(n, 1.0f);
    // Each group's data: the vector, or the start of its window (same contents).
    std::vector<std::span<float>> data(groups.size(), std::span<float>(own));
    for (std::size_t gi = 0; gi < std::min(groups.size(), windows.size()); ++gi) {
      if (windows[gi].empty()) continue;
      if (windows[gi].size() < n * sizeof(float))
        throw_error(ErrorCode::kInternal, "the window of group {} holds {} bytes, less than {}", gi,
                    windows[gi].size(), n * sizeof(float));
      data[gi] = std::span<float>(reinterpret_cast<float*>(windows[gi].data()), n);
      std::fill(data[gi].begin(), data[gi].end(), 1.0f);
    }
    // At least 10 operations per block: with 2 (as before) a block at 4 MiB lasts ~0.5 ms, so
    // one rank preempted for a scheduler slice (3-8 ms here) decides the block, and the
    // median of 7 blocks becomes a lottery between runs (docs/benchmarks.md, all-reduce).
    const int k = std::max(10, iters_for(bytes, b.iters) / 10), reps = bytes >= (4u << 20) ? 7 : 15;
    std::vector<std::vector<double>> per_op(groups.size());
    for (int rep = -1; rep < reps; ++rep) {
      for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        auto* g = groups[gi];
        s.world().barrier(s.deadline());
        double t0 = now_seconds();
        if (g)
          for (int i = 0; i < k; ++i) g->all_reduce(data[gi].data(), n, DType::kF32);
        double dt = s.world().max(now_seconds() - t0, s.deadline()) / k;
        if (rep >= 0) per_op[gi].push_back(dt);
      }
    }
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      auto* g = groups[gi];
      bool ok = true;
      if (g) {
        auto v = data[gi];
        std::fill(v.begin(), v.end(), static_cast<float>(g->rank() + 1));
        g->all_reduce(v.data(), n, DType::kF32);
        const float want = static_cast<float>(g->size() * (g->size() + 1) / 2);
        ok = std::all_of(v.begin(), v.end(), [&](float x) { return x == want; });
      }
      ok = !s.world().any(!ok, s.deadline());
      double t = median(per_op[gi]);
      double p = static_cast<double>(series[gi].ranks);
      series[gi].points.push_back({n * 4, t, 2 * (p - 1) / p * static_cast<double>(n * 4) / t, ok});
    }
  }
  return series;
}

namespace {

constexpr int kStreamModes = 3;
constexpr transport::StreamMode kModes[kStreamModes] = {
    transport::StreamMode::kStructureAware, transport::StreamMode::kBaseline, transport::StreamMode::kBaselineEager};

// One stream each way: rank 0 -> 1 on one tag range, the echo 1 -> 0 on another.
struct StreamPair {
  transport::StageSender tx;
  transport::StageReceiver rx;
  int posted = 0;
  transport::StreamStats before;
  std::vector<double> one_way;
};

// All modes are measured interleaved, iteration by iteration, so that load changes on this
// shared machine hit them alike. Returns {aware, baseline, baseline-eager}.
// Ranks other than 0 and 1 (link == nullptr) only join the per-iteration barriers.
std::vector<StreamPoint> stream_points(Session& s, transport::Link* link, std::size_t batch, std::size_t hidden,
                                       DType dtype, const Budget& b) {
  using transport::StreamMode;
  const std::size_t es = dtype == DType::kF32 ? 4 : 2;
  const char* dname = dtype == DType::kF32 ? "f32" : "bf16";
  const bool first = s.rank() == 0;
  const PollPolicy pol = transport::wait_policy(s.config);
  const std::uint32_t base = transport::kStreamTagBase;
  auto tag = [&](int mode, bool forward) { return base + static_cast<std::uint32_t>(mode * 2 + (forward ? 0 : 1)) * 0x200; };
  const int k = iters_for(batch * hidden * es * 2, b.iters), warm = std::max(2, std::min(b.warmup, k));
  if (link == nullptr) {
    for (int i = 0; i < kStreamModes * (warm + k); ++i) s.world().barrier(s.deadline());
    return std::vector<StreamPoint>(kStreamModes);
  }
  std::vector<std::unique_ptr<StreamPair>> pairs;
  for (int m = 0; m < kStreamModes; ++m) {
    auto mode = kModes[m];
    pairs.push_back(std::unique_ptr<StreamPair>(new StreamPair{transport::StageSender(*link, mode, tag(m, first)),
                                                               transport::StageReceiver(*link, mode, tag(m, !first)), 0, {}, {}}));
  }
  std::vector<std::vector<std::byte>> data(2, std::vector<std::byte>(batch * hidden * es));
  for (std::size_t i = 0; i < data[0].size(); ++i) data[0][i] = data[1][i] = pattern(i, 7);
  std::vector<transport::TensorRef> refs = {{{"hidden", dname, hidden * es}, data[0].data()},
                                            {{"residual", dname, hidden * es}, data[1].data()}};
  bool ok = true;
  for (int it = 0; it < warm + k; ++it) {
    for (auto& p : pairs) {
      if (it == warm) p->before = p->tx.stats();
      // The next receives are posted before this iteration's data can arrive (aware mode
      // uses them; the baseline cannot, post() only records the batch size).
      while (p->posted < std::min(it + 2, warm + k)) {
        p->rx.post(batch);
        ++p->posted;
      }
      s.world().barrier(s.deadline());
      double t0 = now_seconds();
      if (first) {
        p->tx.send(refs, batch)->wait(s.deadline(), pol);
        const auto& got = p->rx.receive(s.deadline());
        if (it >= warm) p->one_way.push_back((now_seconds() - t0) / 2);
        if (it == warm + k - 1)
          ok = ok && got.size() == 2 && std::memcmp(got[0].data.data(), data[0].data(), data[0].size()) == 0;
      } else {
        const auto& got = p->rx.receive(s.deadline());
        std::vector<transport::TensorRef> echo;
        for (const auto& v : got) echo.push_back({*v.spec, v.data.data()});
        p->tx.send(echo, batch)->wait(s.deadline(), pol);
      }
    }
  }
  std::vector<StreamPoint> out;
  for (auto& p : pairs) {
    const auto& after = p->tx.stats();
    StreamPoint sp;
    sp.mode = std::string(to_string(p->tx.mode()));
    sp.dtype = dname;
    sp.batch = batch;
    sp.seconds = median(p->one_way);
    sp.messages_per_iter = static_cast<double>(after.messages - p->before.messages) / k;
    sp.metadata_bytes_per_iter = static_cast<double>(after.metadata_bytes - p->before.metadata_bytes) / k;
    sp.payload_bytes_per_iter = static_cast<double>(after.payload_bytes - p->before.payload_bytes) / k;
    sp.verified = ok;
    out.push_back(sp);
  }
  return out;
}

}  // namespace

std::vector<StreamPoint> measure_stream(Session& s, Backend backend, const std::vector<std::size_t>& batches,
                                        std::size_t hidden, const Budget& b) {
  std::vector<int> peers;
  if (s.rank() < 2) peers.push_back(1 - s.rank());
  auto t = transport::connect(backend, s.world(), peers, s.config);
  std::vector<StreamPoint> out;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (std::size_t batch : batches) {
      auto modes = stream_points(s, s.rank() < 2 ? &t->link(1 - s.rank()) : nullptr, batch, hidden, dt, b);
      bool mine_ok = std::all_of(modes.begin(), modes.end(), [](const StreamPoint& p) { return p.verified; });
      bool all_ok = !s.world().any(!mine_ok, s.deadline());
      for (auto& p : modes) {
        p.verified = all_ok;
        out.push_back(p);
      }
    }
  return out;
}

}  // namespace trellis::launchers::comm
