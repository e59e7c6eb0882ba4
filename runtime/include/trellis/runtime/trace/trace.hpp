// Per-rank timeline of the engine, for the Chrome/Perfetto trace and the summary's shares.
//
// Each rank has one Tracer. Threads record spans (start, duration, category, name, iteration)
// on named lanes: "forward", "cpu-prep", "sampler", "scheduler", "relay". Every span feeds the
// per-category totals used by the summary (busy / wait / comm shares), whether or not the
// events are kept; events are kept only when tracing is on.
//
// Output: write_chrome_trace() writes the Trace Event Format (JSON, "X" complete events,
// microseconds), one process per rank named "rank r · stage s · tp k", one thread per lane;
// ui.perfetto.dev and chrome://tracing open it.
//
// Threading: record() may be called from any thread (a mutex guards the event list; spans
// are per iteration, so this is not a hot lock).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/clock.hpp"

namespace trellis::runtime {

// kBlock marks spans nested inside a "forward" span (one per layer); they are shown in the
// trace but not added to the shares again.
enum class TraceCat : std::uint8_t { kPrep, kForward, kAllReduce, kSend, kRecv, kSample, kWait, kSchedule, kBlock, kCount };
const char* to_string(TraceCat c);

enum class Lane : std::uint8_t { kForward, kCpuPrep, kSampler, kScheduler, kRelay, kCount };
const char* to_string(Lane l);

struct TraceEvent {
  std::int64_t start_ns = 0, dur_ns = 0;  // steady clock (now_ns)
  std::int64_t iteration = -1;
  std::int32_t arg = -1;                  // block index for forward spans, peer for comm
  Lane lane = Lane::kForward;
  TraceCat cat = TraceCat::kForward;
  const char* name = "";                  // static string
};

class Tracer {
 public:
  explicit Tracer(bool keep_events) : keep_(keep_events) {}
  void record(Lane lane, TraceCat cat, const char* name, std::int64_t start_ns, std::int64_t end_ns,
              std::int64_t iteration = -1, std::int32_t arg = -1);
  // Nanoseconds spent in `cat` on `lane`.
  std::int64_t total_ns(Lane lane, TraceCat cat) const;
  std::vector<TraceEvent> events() const;
  bool keeps_events() const { return keep_; }
  // Forgets every event and total (the engine's warm-up runs before the clock starts).
  void reset();

  // RAII span: records [construction, destruction).
  class Span {
   public:
    Span(Tracer& t, Lane lane, TraceCat cat, const char* name, std::int64_t iteration = -1, std::int32_t arg = -1)
        : t_(t), lane_(lane), cat_(cat), name_(name), it_(iteration), arg_(arg), start_(now_ns()) {}
    ~Span() { t_.record(lane_, cat_, name_, start_, now_ns(), it_, arg_); }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Tracer& t_;
    Lane lane_;
    TraceCat cat_;
    const char* name_;
    std::int64_t it_;
    std::int32_t arg_;
    std::int64_t start_;
  };

 private:
  bool keep_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  std::array<std::array<std::int64_t, static_cast<std::size_t>(TraceCat::kCount)>, static_cast<std::size_t>(Lane::kCount)>
      totals_{};
};

// Compact byte form of a rank's events, for gathering them on rank 0 (names become indices
// into a table both sides share; unknown names read back as "other").
std::vector<std::byte> pack_events(std::span<const TraceEvent> events);
std::vector<TraceEvent> unpack_events(std::span<const std::byte> bytes);

struct RankLabel {
  int rank = 0, stage = 0, tp = 0;
  std::string host;
};
// Writes the trace of every rank (events[r] for ranks[r]) to `path`; times are shifted so the
// earliest event is at 0. kIo naming the path when it cannot be written.
void write_chrome_trace(const std::string& path, std::span<const RankLabel> ranks,
                        std::span<const std::vector<TraceEvent>> events);

}  // namespace trellis::runtime
