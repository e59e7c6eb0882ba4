// Perplexity of a model on a text, computed over a p x t layout of ranks (`trellis eval ppl`).
//
// Windowing (the convention of llama.cpp's `llama-perplexity`, so both engines score the same
// tokens): the whole text is tokenized once (the model's BOS only when its GGUF says
// add_bos_token; special-token text is not parsed) and cut into floor(N / ctx)
// non-overlapping windows of ctx tokens; the last partial window is dropped. Each window is
// evaluated from an empty KV cache (positions 0..ctx-1; its first token becomes BOS when the
// model adds BOS), and only its second half is scored: the logits at positions
// j = ctx/2 .. ctx-2 predict tokens j+1, so every scored token sees at least ctx/2 tokens of
// context and each window scores ctx - 1 - ctx/2 tokens.
//   perplexity = exp( sum of -log p(token | context) / tokens scored ),
// with log-softmax in double precision over the whole vocabulary.
//
// Layout: rank = stage * tp + k. Stage s holds layers [s*L/p, (s+1)*L/p) of its TP slice
// (heads/columns as trellis run shards them); the hidden state of a window goes from each TP
// rank of stage s to the same TP rank of stage s+1 over the bootstrap link; the last stage
// gathers the vocabulary-parallel logits and its TP rank 0 sums the log-likelihoods. A
// communication-reducing variant (variants.hpp) replaces the standard block wiring.
//
// Errors: kInvalidArgument for a layout or variant that does not fit the model, a text too
// short for two windows... (messages name the flag and the file); every rank sees the same
// error. Collective over the world: every rank calls evaluate_perplexity with the same options.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/config.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::runtime {

struct PerplexityOptions {
  std::string model;           // a .gguf file or a checkpoint directory; empty: `preset`
  std::string preset = "tiny";  // synthetic model (byte tokenizer) when model is empty: tests
  std::uint64_t seed = 1;       // synthetic weights' seed
  std::string text_path;        // UTF-8 text to score
  int ctx = 512;                // window length in tokens (>= 4)
  int max_windows = 0;          // score at most this many windows; 0: all
  std::string variant = "standard", variant_layers;
  int pp = 1, tp = 1;
  std::string dtype = "f32";    // weights in memory: f32 (exact dequantised GGUF) or bf16
};

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;                  // natural log
  std::int64_t text_tokens = 0;         // tokens in the whole text
  std::int64_t tokens_scored = 0;
  int windows = 0, ctx = 0;
  std::vector<double> window_ppl;       // per window, in order
  double eval_s = 0;                    // forwards and scoring (rank 0's wall clock)
  double load_s = 0;                    // loading weights and tokenizing
  std::string tokenizer;                // "gguf <pre>" or "byte"
  std::string layout, variant, text, model, dtype;
};

// One window [begin, begin + ctx) of the token stream and the rows it scores.
struct PplWindow {
  std::int64_t begin = 0;
  int first_scored = 0;  // logits row ctx/2 ...
  int n_scored = 0;      // ... up to row ctx-2 (predicting tokens first+1 .. ctx-1)
};
// The windows of a text of n_tokens tokens (see above). kInvalidArgument naming --ctx when
// ctx < 4 or the text has fewer than 2 * ctx tokens (llama.cpp's minimum).
std::vector<PplWindow> perplexity_windows(std::int64_t n_tokens, int ctx, int max_windows);
// -log softmax(row)[target] in double precision.
double negative_log_likelihood(std::span<const float> logits_row, std::int32_t target);

PerplexityResult evaluate_perplexity(transport::Bootstrap& world, const Config& config, const PerplexityOptions& o);

// Human-readable lines / one JSON object.
std::string to_text(const PerplexityResult& r);
std::string to_json_text(const PerplexityResult& r);

}  // namespace trellis::runtime
