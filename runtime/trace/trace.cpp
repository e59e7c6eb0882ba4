#include "trellis/runtime/trace/trace.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"

namespace trellis::runtime {

const char* to_string(TraceCat c) {
  switch (c) {
    case TraceCat::kPrep: return "prep";
    case TraceCat::kForward: return "forward";
    case TraceCat::kAllReduce: return "all-reduce";
    case TraceCat::kSend: return "send";
    case TraceCat::kRecv: return "recv";
    case TraceCat::kSample: return "sample";
    case TraceCat::kWait: return "wait";
    case TraceCat::kSchedule: return "schedule";
    case TraceCat::kBlock: return "block";
    default: return "other";
  }
}

const char* to_string(Lane l) {
  switch (l) {
    case Lane::kForward: return "forward";
    case Lane::kCpuPrep: return "cpu-prep";
    case Lane::kSampler: return "sampler";
    case Lane::kScheduler: return "scheduler";
    case Lane::kRelay: return "relay";
    default: return "other";
  }
}

void Tracer::record(Lane lane, TraceCat cat, const char* name, std::int64_t start_ns, std::int64_t end_ns,
                    std::int64_t iteration, std::int32_t arg) {
  std::lock_guard lock(mu_);
  totals_[static_cast<std::size_t>(lane)][static_cast<std::size_t>(cat)] += end_ns - start_ns;
  if (keep_) events_.push_back({start_ns, end_ns - start_ns, iteration, arg, lane, cat, name});
}

std::int64_t Tracer::total_ns(Lane lane, TraceCat cat) const {
  std::lock_guard lock(mu_);
  return totals_[static_cast<std::size_t>(lane)][static_cast<std::size_t>(cat)];
}

void Tracer::reset() {
  std::lock_guard lock(mu_);
  events_.clear();
  totals_ = {};
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard lock(mu_);
  return events_;
}

namespace {
// Span names used by the engine; events travel with an index into this table.
constexpr const char* kNames[] = {"prepare input", "forward", "block", "embed", "lm head", "all-reduce",
                                  "send hidden", "recv hidden", "send logits", "recv logits", "sample",
                                  "wait schedule", "wait input", "wait hidden", "wait logits", "schedule",
                                  "send tokens", "recv tokens", "relay", "kv moves", "swift candidates",
                                  "swift optimise", "swift draft", "swift verify", "other"};
constexpr std::uint8_t kOther = static_cast<std::uint8_t>(std::size(kNames) - 1);

std::uint8_t name_index(const char* n) {
  for (std::uint8_t i = 0; i < kOther; ++i)
    if (n == kNames[i] || std::strcmp(n, kNames[i]) == 0) return i;
  return kOther;
}

struct Packed {
  std::int64_t start_ns, dur_ns, iteration;
  std::int32_t arg;
  std::uint8_t lane, cat, name, pad;
};
}  // namespace

std::vector<std::byte> pack_events(std::span<const TraceEvent> events) {
  std::vector<std::byte> out(events.size() * sizeof(Packed));
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    Packed p{e.start_ns, e.dur_ns, e.iteration, e.arg, static_cast<std::uint8_t>(e.lane),
             static_cast<std::uint8_t>(e.cat), name_index(e.name), 0};
    std::memcpy(out.data() + i * sizeof(Packed), &p, sizeof p);
  }
  return out;
}

std::vector<TraceEvent> unpack_events(std::span<const std::byte> bytes) {
  if (bytes.size() % sizeof(Packed) != 0)
    throw_error(ErrorCode::kCorruptInput, "trace events: {} bytes is not a whole number of events", bytes.size());
  std::vector<TraceEvent> out(bytes.size() / sizeof(Packed));
  for (std::size_t i = 0; i < out.size(); ++i) {
    Packed p;
    std::memcpy(&p, bytes.data() + i * sizeof(Packed), sizeof p);
    auto& e = out[i];
    e.start_ns = p.start_ns;
    e.dur_ns = p.dur_ns;
    e.iteration = p.iteration;
    e.arg = p.arg;
    e.lane = static_cast<Lane>(std::min<std::uint8_t>(p.lane, static_cast<std::uint8_t>(Lane::kCount) - 1));
    e.cat = static_cast<TraceCat>(std::min<std::uint8_t>(p.cat, static_cast<std::uint8_t>(TraceCat::kCount) - 1));
    e.name = kNames[std::min(p.name, kOther)];
  }
  return out;
}

void write_chrome_trace(const std::string& path, std::span<const RankLabel> ranks,
                        std::span<const std::vector<TraceEvent>> events) {
  std::int64_t t0 = INT64_MAX;
  for (const auto& evs : events)
    for (const auto& e : evs) t0 = std::min(t0, e.start_ns);
  if (t0 == INT64_MAX) t0 = 0;
  nlohmann::json trace = nlohmann::json::array();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& l = ranks[r];
    trace.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", l.rank}, {"tid", 0},
                     {"args", {{"name", fmt::format("rank {} · stage {} · tp {} · {}", l.rank, l.stage, l.tp, l.host)}}}});
    trace.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", l.rank}, {"tid", 0},
                     {"args", {{"sort_index", l.rank}}}});
    for (int lane = 0; lane < static_cast<int>(Lane::kCount); ++lane)
      trace.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", l.rank}, {"tid", lane},
                       {"args", {{"name", to_string(static_cast<Lane>(lane))}}}});
    if (r >= events.size()) continue;
    for (const auto& e : events[r]) {
      nlohmann::json ev = {{"ph", "X"},
                           {"name", e.name},
                           {"cat", to_string(e.cat)},
                           {"pid", l.rank},
                           {"tid", static_cast<int>(e.lane)},
                           {"ts", static_cast<double>(e.start_ns - t0) / 1e3},
                           {"dur", static_cast<double>(e.dur_ns) / 1e3}};
      nlohmann::json args;
      if (e.iteration >= 0) args["iteration"] = e.iteration;
      if (e.arg >= 0) args[e.cat == TraceCat::kBlock ? "layer" : "peer"] = e.arg;
      if (!args.empty()) ev["args"] = args;
      trace.push_back(std::move(ev));
    }
  }
  std::ofstream f(path);
  if (!f) throw_error(ErrorCode::kIo, "trace file {} cannot be written", path);
  f << nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!f) throw_error(ErrorCode::kIo, "trace file {}: write failed", path);
}

}  // namespace trellis::runtime
