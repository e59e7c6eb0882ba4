// Stage-to-stage streaming of hidden states (SiPipe §5.3, structure-aware transmission).
//
// Between two pipeline stages a StageSender (on the last rank of stage i) and a
// StageReceiver (on the first rank of stage i+1) move a small dictionary of named tensors
// every iteration, each `rows x row_bytes` bytes, where rows is the iteration's batch size.
//
// Structure-aware (StreamMode::kStructureAware): the first send carries the schema (names,
// dtypes, bytes per row) in one control message. From then on the receiver, which knows
// the batch size of every iteration from the scheduling output, derives every byte count
// itself and posts its receives into preallocated buffers *before* the sender's forward
// ends (post()); the sender moves raw bytes only: one message per tensor per iteration and
// zero metadata bytes in steady state. A changed schema (a new tensor, another dtype or row
// size) sends one control message that names the first iteration it applies to; the data of
// the new schema travels on a second bank of tags, so receives posted for the old schema
// can never match it and are re-posted. A batch larger than the buffers makes the receiver
// grow its buffers locally (two-sided tagged messages need no remote addresses, so no
// message is needed for that); stats().reallocations counts it.
//
// Baseline (StreamMode::kBaseline), what engines do today (vLLM's send_tensor_dict over
// torch.distributed send/recv): every iteration sends an 8-byte size, then a metadata blob
// (rows, names, dtypes, row sizes), then each tensor; the receiver cannot post anything
// ahead, allocates fresh buffers and receives each step in turn. Like gloo's send (which
// moves its bytes only after the receiver announced the matching receive), each message
// waits for a zero-byte "ready" from the receiver, sent when it posted that receive: every
// message is one round trip. StreamMode::kBaselineEager is the same sequence without the
// ready messages (every send leaves at once, as an eager MPI/UCX send would), the cheapest
// structure-unaware protocol, kept for comparison.
//
// Both sides count messages and bytes (StreamStats) so tests can assert that the steady
// state carries no metadata. Tags: [tag_base, tag_base + 3 + 2*kMaxTensors); give different
// streams on one link disjoint ranges.
//
// Threading: one thread at a time per sender/receiver. The link must outlive them. Every
// wait takes a Deadline and names the peer and what was awaited on kTimeout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/transport/link.hpp"
#include "trellis/transport/request.hpp"

namespace trellis::transport {

enum class StreamMode { kStructureAware, kBaseline, kBaselineEager };
std::string_view to_string(StreamMode m);
// "aware", "baseline" or "baseline-eager"; throws kInvalidArgument naming them.
StreamMode parse_stream_mode(std::string_view name);

inline constexpr std::uint32_t kStreamTagBase = 0x10000;
inline constexpr std::size_t kMaxStreamTensors = 64;

struct TensorSpec {
  std::string name;
  std::string dtype;       // opaque to the transport: "f32", "bf16", "i32", ...
  std::size_t row_bytes = 0;
  bool operator==(const TensorSpec&) const = default;
};

struct StreamSchema {
  std::vector<TensorSpec> tensors;
  bool operator==(const StreamSchema&) const = default;
};

// One tensor to send: `data` holds rows * spec.row_bytes bytes and must stay valid until the
// send's request completed.
struct TensorRef {
  TensorSpec spec;
  const void* data = nullptr;
};

// A received tensor; `data` stays valid until the receiver's next receive() or post().
struct TensorView {
  const TensorSpec* spec = nullptr;
  std::size_t rows = 0;
  std::span<const std::byte> data;
};

struct StreamStats {
  std::uint64_t iterations = 0;
  std::uint64_t messages = 0;        // every message sent or received, control (and ready) included
  std::uint64_t payload_bytes = 0;   // tensor bytes
  std::uint64_t metadata_bytes = 0;  // size words, metadata blobs, schema messages
  std::uint64_t schema_exchanges = 0;
  std::uint64_t reallocations = 0;   // receiver: buffer sets grown or first allocated
};

class StageSender {
 public:
  StageSender(Link& link, StreamMode mode, std::uint32_t tag_base = kStreamTagBase);
  // Starts sending one iteration; returns at once. At most kMaxStreamTensors tensors; rows may
  // be 0. The returned request completes when every message of the iteration left.
  RequestPtr send(std::span<const TensorRef> tensors, std::size_t rows);
  const StreamStats& stats() const { return stats_; }
  StreamMode mode() const { return mode_; }

 private:
  RequestPtr send_rendezvous(std::span<const TensorRef> tensors, std::size_t rows, std::uint64_t iteration,
                             std::vector<std::vector<std::byte>> keep);

  Link& link_;
  StreamMode mode_;
  std::uint32_t tag_base_;
  StreamSchema sent_;
  bool have_schema_ = false;
  int bank_ = 0;
  std::uint64_t iteration_ = 0;
  StreamStats stats_;
};

class StageReceiver {
 public:
  // `depth`: how many iterations may be posted ahead of the one being received.
  StageReceiver(Link& link, StreamMode mode, std::uint32_t tag_base = kStreamTagBase, int depth = 2);
  ~StageReceiver();
  StageReceiver(const StageReceiver&) = delete;
  StageReceiver& operator=(const StageReceiver&) = delete;

  // Announces the batch size of the next iteration (from the scheduling output). Structure-
  // aware: posts its receives now, into preallocated buffers. At most `depth` iterations may
  // be outstanding; throws kInvalidArgument beyond that.
  void post(std::size_t rows);
  // Waits for the oldest posted iteration and returns its tensors, in the sender's order.
  // Throws kTimeout naming the peer and what was missing; kCorruptInput when the sender's
  // bytes disagree with the announced batch size. A set `*cancel` (the caller's "this rank
  // has already failed") ends a structure-aware wait at once: waiting out the
  // deadline on a sender that will never send only delays the exit (kPeerFailed, scope kRank:
  // a symptom of the failure already recorded).
  const std::vector<TensorView>& receive(Deadline deadline, const std::atomic<bool>* cancel = nullptr);

  const StreamStats& stats() const { return stats_; }
  const StreamSchema& schema() const { return schema_; }
  StreamMode mode() const { return mode_; }

 private:
  struct Slot;
  void post_data(Slot& slot);
  void apply_control();
  bool poll_aware(Slot& slot);
  const std::vector<TensorView>& receive_baseline(Slot& slot, Deadline deadline);
  RequestPtr receive_step(std::span<std::byte> buffer, std::uint32_t tag, Deadline deadline);
  void finish(Slot& slot);

  Link& link_;
  StreamMode mode_;
  std::uint32_t tag_base_;
  int depth_;
  StreamSchema schema_;
  bool have_schema_ = false;
  int bank_ = 0;
  // A schema announced for a later iteration than the ones already posted under the old one.
  StreamSchema next_schema_;
  StreamSchema retired_schema_;  // keeps the last views' specs alive across a switch
  std::uint64_t next_from_ = 0;
  int next_bank_ = 0;
  bool next_pending_ = false;
  std::vector<std::byte> control_buf_;
  RequestPtr control_;
  std::vector<std::unique_ptr<Slot>> slots_;  // depth + 1 buffer sets, used round-robin
  std::uint64_t posted_ = 0, received_ = 0;   // iteration counters
  std::vector<TensorView> views_;
  StreamStats stats_;
};

}  // namespace trellis::transport
