// Scheduling outputs: what the scheduler tells every rank about one iteration (SiPipe §4.1:
// "iteration, sequence ids, new tokens, positions"), and their compact wire form.
//
// One ScheduleOutput drives one forward of one microbatch through all p stages. Sequences
// appear in a fixed order; their input tokens are concatenated in that order (a prefill
// contributes its whole prompt, a decode step one token). A sequence with `sample` set gets
// one new token at the end of this iteration; the logits rows of the iteration are those
// sequences, in order (an iteration may have none: every sequence in it is in the middle of
// a chunked prefill). `prompt` marks tokens that are prompt tokens: a whole prompt, or one
// chunk of it (run.prefill_chunk), of which only the last is sampled. `column` is the sequence's fixed column in its group's sampler state
// (stable for its lifetime, so penalties update incrementally), `slot` its KV-cache slot on
// every rank. A new sequence (`first`) carries its sampling settings for the sampler.
//
// SWIFT (runtime/swift) adds three things: a sequence with `candidates` gets a logits row for
// every token and the sampler answers with each row's top candidates instead of a sample; a
// sequence with `parents` is a token tree (model/llama.hpp, SeqChunk); and the iteration may
// carry a skip set (the draft's sub-layers left out) and KV moves applied before it.
//
// Wire format (little-endian): header {magic "TRSO", u16 version, u16 flags, u64 iteration,
// u32 group, u32 n_seqs, u32 n_tokens}, then per sequence {i64 id, i32 slot, i32 column,
// i32 pos, i32 n_tokens, u8 bits {1 sample, 2 first, 4 prompt, 8 candidates, 16 tree},
// [settings when first], [i32 kv_pos, i32 prefix, n_tokens x i32 parents when tree]}, then
// n_tokens i32 tokens, then when flags has kSwift {u32 n, n x u8 skip, u32 m, m x {i32 slot,
// i32 src, i32 dst, i32 count}}. A decode step of B sequences costs 28 + 25*B bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "trellis/runtime/workload/request.hpp"

namespace trellis::runtime {

struct ScheduledSeq {
  std::int64_t id = 0;      // request id
  std::int32_t slot = 0;    // KV-cache slot
  std::int32_t column = 0;  // sampler column within the group
  std::int32_t pos = 0;     // position of the first input token of this chunk
  std::int32_t n_tokens = 0;
  bool sample = true;       // a token is drawn for it after this iteration
  bool first = false;       // first iteration of this sequence (prefill from position 0)
  bool prompt = false;      // the tokens are prompt tokens (set whenever first is)
  SamplingParams params;    // meaningful when first
  bool candidates = false;  // every token gets a logits row; the sampler returns top candidates
  std::vector<std::int32_t> parents;  // token tree (SeqChunk::parents); empty: a chain
  std::int32_t kv_pos = 0, prefix = 0;  // with parents: K/V start and visible prefix
  // Logits rows this sequence contributes.
  int logit_rows() const { return candidates ? n_tokens : (sample ? 1 : 0); }
};

// SWIFT's KV compaction: positions [src, src + count) of `slot` copied to [dst, dst + count).
struct KvCopy {
  std::int32_t slot = 0, src = 0, dst = 0, count = 0;
};

struct ScheduleOutput {
  static constexpr std::uint16_t kStop = 1;  // no more iterations: ranks drain and exit
  // No iteration: a heartbeat while a server has no work, so that the ranks' waits for the
  // next scheduling output (bounded by the deadline) see the scheduler alive. Ranks skip it.
  static constexpr std::uint16_t kIdle = 2;
  // A skip set and/or KV moves follow the tokens (SWIFT).
  static constexpr std::uint16_t kSwift = 4;
  static constexpr std::uint16_t kKnownFlags = kStop | kIdle | kSwift;

  std::uint64_t iteration = 0;
  std::int32_t group = 0;  // microbatch group = iteration mod p
  std::uint16_t flags = 0;
  std::vector<ScheduledSeq> seqs;
  std::vector<std::int32_t> tokens;  // sum of seqs[i].n_tokens
  std::vector<std::uint8_t> skip;    // SWIFT draft: sub-layers left out (Batch::skip); empty: none
  std::vector<KvCopy> moves;         // SWIFT: applied on every rank before this iteration

  bool stop() const { return (flags & kStop) != 0; }
  bool idle() const { return (flags & kIdle) != 0; }
  int n_tokens() const { return static_cast<int>(tokens.size()); }
  int n_sampled() const;
  int logit_rows() const;
};

// Appends the wire form to `out` (cleared first).
void serialize(const ScheduleOutput& s, std::vector<std::byte>& out);
// Parses the wire form; kCorruptInput naming `what` (the channel) on any inconsistency.
ScheduleOutput deserialize_schedule(std::span<const std::byte> in, const char* what);

}  // namespace trellis::runtime
