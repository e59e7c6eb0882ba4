// Requests and their sampling settings: what a user asks the engine to generate.
//
// A Request is a value: its prompt as token ids, the settings that decide how each new token
// is drawn, and (when it was rejected before it ever ran) the reason. The engine never
// throws for one bad request; it marks that request failed and goes on with the others.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trellis::runtime {

// How the next token of one request is chosen (SiPipe §2.1 ③ and §5.1). Applied in this
// order: repetition penalty, frequency and presence penalties, temperature, top-k, top-p,
// min-p, then a draw from the remaining distribution (or the arg-max when greedy).
struct SamplingParams {
  float temperature = 1.0f;        // > 0; 0 means greedy
  int top_k = 0;                   // keep the k most likely tokens; 0: all
  float top_p = 1.0f;              // (0, 1]: keep the smallest set with this much mass
  float min_p = 0.0f;              // [0, 1): drop tokens below min_p * p(most likely)
  bool greedy = false;             // arg-max (lowest id on ties); ignores temperature etc.
  std::uint64_t seed = 0;          // draws of this request depend on (seed, step) only
  float frequency_penalty = 0.0f;  // [-2, 2]: z -= f * count(token in output)
  float presence_penalty = 0.0f;   // [-2, 2]: z -= p * [token in output]
  float repetition_penalty = 1.0f; // > 0: seen (prompt or output) z>0: z/r, else z*r
  int max_tokens = 16;             // >= 1 new tokens at most
  std::vector<std::int32_t> stop_ids;  // generation ends after one of these is produced

  bool is_greedy() const { return greedy || temperature == 0.0f; }
  bool has_penalties() const {
    return frequency_penalty != 0.0f || presence_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

// Checks every field; returns the reason for the first bad one ("top_p must be in (0, 1],
// got 1.5"), or nothing when all are valid. `vocab_size` <= 0 skips the id range checks.
std::optional<std::string> validate(const SamplingParams& p, int vocab_size);

struct Request {
  std::int64_t id = 0;              // index in the workload, unique
  std::string name;                 // user's "id" field, or the index as text
  std::vector<std::int32_t> prompt; // token ids
  bool from_text = false;           // prompt came from "text" (decode output as text)
  SamplingParams sampling;
  std::string error;                // non-empty: rejected before running, with the reason
  // SWIFT self-speculative decoding for this request ("swift" in the prompts file); unset:
  // the run's setting (--swift). Only greedy requests without penalties draft.
  std::optional<bool> swift;
};

}  // namespace trellis::runtime
