// `trellis run`: pipelined generation over p stages x t tensor-parallel ranks under mpirun
// (or one rank alone), with SiPipe's decoupled CPU sampling, token-safe execution and
// structure-aware stage transfers, each switchable for ablation. Prints a summary (text or
// --json), writes generated tokens (--out) and a Chrome/Perfetto trace (--trace).
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "layout_flags.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/generate.hpp"
#include "trellis/runtime/workload/workload.hpp"

namespace trellis::launchers {
namespace {

struct RunOptions {
  runtime::GenerateOptions gen;
  bool json = false;
  bool no_cpu_sampler = false, no_tsem = false, no_sat = false;
  // Flags that stand for settings, as given (empty: not given); Config::set checks them, so
  // --max-seqs 0 is refused like --set run.max_seqs=0 rather than silently ignored.
  std::string max_seqs, max_context, sampler_threads, kv_budget, prefill_chunk, device;
  bool swift = false, no_cuda_graphs = false;
  std::string stage_handoff;  // --stage-handoff (setting comm.stage_handoff)
  std::string layer_split;    // --layer-split (setting run.layer_split)
};

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }

int run_generate(Session& s, RunOptions& o) {
  if (!check_layout(s, o.gen.pp, o.gen.tp, "run")) return 1;
  if (int rc = apply_flag_settings(s, {{"run.max_seqs", "--max-seqs", o.max_seqs},
                                       {"run.max_context", "--max-context", o.max_context},
                                       {"run.sampler_threads", "--sampler-threads", o.sampler_threads},
                                       {"run.kv_budget", "--kv-budget", o.kv_budget},
                                       {"run.prefill_chunk", "--prefill-chunk", o.prefill_chunk},
                                       {"run.device", "--device", o.device},
                                       {"run.swift", "--swift", o.swift ? std::string("true") : std::string()},
                                 {"run.cuda_graphs", "--no-cuda-graphs", o.no_cuda_graphs ? std::string("false") : std::string()},
                                 {"comm.stage_handoff", "--stage-handoff", o.stage_handoff},
                                 {"run.layer_split", "--layer-split", o.layer_split}});
      rc != 0)
    return rc;
  // A synthetic spec is checked here, on every rank, so that a bad one (n=1e14) is a usage
  // error before anything loads; rank 0 parses it again to build the workload.
  if (o.gen.prompts.empty() && o.gen.prompt.empty()) {
    try {
      (void)runtime::parse_synthetic_spec(o.gen.workload, "--workload");
    } catch (const Error& e) {
      if (s.is_root()) spdlog::error("{}", e.what());
      return 2;
    }
  }
  if (o.gen.chat && o.gen.prompts.empty() && o.gen.prompt.empty()) {
    if (s.is_root()) spdlog::error("--chat needs text prompts: --prompt TEXT or --prompts FILE");
    return 2;
  }
  o.gen.progress = !o.json;
  o.gen.cpu_sampler = !o.no_cpu_sampler;
  o.gen.tsem = !o.no_tsem;
  o.gen.sat = !o.no_sat;
  // Ctrl-C (mpirun forwards SIGINT/SIGTERM to the ranks): the scheduler stops admitting,
  // finishes the iterations in flight and tells every rank to stop.
  g_stop = false;
  o.gen.stop = &g_stop;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  auto rep = runtime::generate(s.world(), s.config, o.gen);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (s.is_root()) {
    if (o.json && !rep.texts.empty()) {
      auto j = nlohmann::json::parse(runtime::to_json_text(rep.summary));
      j["answers"] = rep.texts;
      std::cout << versioned_json(j) << "\n";
    } else if (o.json) {
      std::cout << versioned_json(nlohmann::json::parse(runtime::to_json_text(rep.summary))) << "\n";
    }
    else
      std::cout << runtime::to_text(rep.summary);
    if (!o.gen.out.empty()) std::cout << (o.json ? "" : fmt::format("output: {} ({} requests)\n", o.gen.out, rep.out_written));
    if (!o.gen.prompt.empty() && !o.json)
      for (const auto& t : rep.texts) std::cout << "answer: " << t << "\n";
  }
  if (rep.interrupted) {
    if (s.is_root()) spdlog::warn("interrupted: every rank stopped cleanly");
    return 130;
  }
  return 0;
}

}  // namespace

Action define_run(CLI::App& sub) {
  auto o = std::make_shared<RunOptions>();
  auto& g = o->gen;
  sub.add_option("--model", g.model_dir, "Checkpoint: a directory (config.json + safetensors) or a .gguf file");
  sub.add_option("--preset", g.preset, "Without --model: a synthetic model generated in memory (see make-model)")
      ->capture_default_str();
  sub.add_option("--preset-dtype", g.preset_dtype,
                 "The preset's weight dtype: f32 (kept in f32), bf16 or f16, as a checkpoint stored so would load")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  add_variant_flags(sub, g.variant, g.variant_layers);
  add_layout_flags(sub, g.pp, g.tp);
  add_device_flag(sub, o->device);
  auto* prompts = sub.add_option("--prompts", g.prompts,
                                 "Prompts file (JSONL: tokens, text or, with --chat, messages; per-request sampling)");
  auto* prompt = sub.add_option("--prompt", g.prompt,
                                "One text prompt (with --chat, one user message); its answer is printed")
                     ->excludes(prompts);
  sub.add_flag("--chat", g.chat,
               "Text prompts are user messages: apply the model's ChatML chat template (GGUF metadata), stop at "
               "end of turn, write the answer's text to --out");
  sub.add_option("--workload", g.workload, "Synthetic workload: n=256,in=128,out=128[,seed=S]")
      ->capture_default_str()
      ->excludes(prompts)
      ->excludes(prompt);
  sub.add_option("--max-tokens", g.max_tokens, "New tokens at most for every request (overrides the prompts' own)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--out", g.out, "Write the generated tokens (and text) here, one JSON line per request");
  sub.add_option("--trace", g.trace, "Write a Chrome/Perfetto trace (open at https://ui.perfetto.dev)");
  sub.add_flag("--json", o->json, "Print the summary as JSON");
  sub.add_flag("--no-cpu-sampler", o->no_cpu_sampler, "Ablation: sample inline on the last stage");
  sub.add_flag("--no-tsem", o->no_tsem, "Ablation: prepare inputs synchronously before each forward");
  sub.add_flag("--no-sat", o->no_sat, "Ablation: structure-unaware stage transfers (size, metadata, tensors)");
  sub.add_option("--max-seqs", o->max_seqs, "Sequences in flight over all microbatches (setting run.max_seqs)");
  sub.add_option("--max-context", o->max_context, "Longest sequence (setting run.max_context)");
  sub.add_option("--prefill-chunk", o->prefill_chunk,
                 "Prompt tokens prefilled per iteration, beside the others' decode steps (0: whole prompts; "
                 "setting run.prefill_chunk)");
  sub.add_option("--kv-budget", o->kv_budget, "KV-cache memory per rank, e.g. 256MiB (setting run.kv_budget)");
  sub.add_option("--sampler-threads", o->sampler_threads, "CPU sampler threads (setting run.sampler_threads)");
  sub.add_flag("--no-cuda-graphs", o->no_cuda_graphs,
               "Ablation: launch every op of a GPU decode step instead of replaying it as a CUDA graph "
               "(setting run.cuda_graphs)");
  sub.add_option("--stage-handoff", o->stage_handoff,
                 "Stage hand-off of the hidden state: auto (CUDA IPC between GPU stages of one host), host, cuda-ipc "
                 "(setting comm.stage_handoff)");
  sub.add_option("--layer-split", o->layer_split,
                 "Decoder layers per pipeline stage: even (default), auto (the last stage takes fewer, to make up "
                 "for the LM head it also runs), or one count per stage such as 22,8 (setting run.layer_split)");
  sub.add_flag("--swift", o->swift,
               "SWIFT self-speculative decoding for greedy requests: drafts with a learned set of layers skipped, "
               "verifies a token tree in one forward (settings swift.*; docs/swift.md)");
  sub.add_option("--seed", g.seed, "Seed of the synthetic model's weights")->capture_default_str();
  sub.add_flag("--pin-cores", g.pin_cores, "Bind each rank to the cores its placement gave it");
  return [o](Session& s) { return run_generate(s, *o); };
}

}  // namespace trellis::launchers
