// `trellis run` below the launcher: topology -> placement -> links -> this rank's shard ->
// generation -> summary, output file and trace. Collective over the world: every rank calls
// generate() with the same options.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "trellis/core/config.hpp"
#include "trellis/runtime/trace/metrics.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::runtime {

struct GenerateOptions {
  std::string model_dir;         // checkpoint directory (config.json + safetensors)
  std::string preset = "tiny";   // used when model_dir is empty: a synthetic model in memory
  // The preset's stored dtype: f32 (weights kept in f32), bf16 or f16 (kept in bf16 / f32 as a
  // checkpoint of that dtype would be). A GPU decode reads bf16 weights at half the bytes.
  std::string preset_dtype = "f32";
  std::string variant = "standard";  // model variant (variants.hpp): standard, parallel, ladder, ...
  std::string variant_layers;        // "A-B": layers the variant applies to (default: all)
  std::uint64_t seed = 1;        // synthetic weights' seed
  int pp = 1, tp = 1;
  std::string prompts;           // JSONL prompts file, or
  bool chat = false;             // text prompts through the model's chat template (GGUF models)
  std::string prompt;            // or one text prompt (with chat: one user message)
  std::string workload = "n=16,in=32,out=16";  // a synthetic workload spec
  int max_tokens = 0;            // > 0: every request's max_tokens
  std::string out;               // write generated tokens/text here (JSONL, a line per request as it ends)
  std::string trace;             // write a Chrome/Perfetto trace here, if set
  bool cpu_sampler = true, tsem = true, sat = true;
  bool pin_cores = false;        // bind each rank to the cores the placement gave it
  bool progress = true;          // a start-up status line on rank 0's terminal (core/progress.hpp)
  const std::atomic<bool>* stop = nullptr;  // SIGINT
};

struct GenerateReport {
  RunSummary summary;      // filled on rank 0
  std::vector<std::string> texts;  // rank 0: the answer of every text prompt, in order
  bool interrupted = false;
  std::size_t out_written = 0;     // rank 0: lines in --out (one per request)
};

GenerateReport generate(transport::Bootstrap& world, const Config& config, const GenerateOptions& options);

}  // namespace trellis::runtime
