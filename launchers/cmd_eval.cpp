// `trellis eval ppl`: perplexity of a model on a text file under any --pp x --tp layout
// (mpirun -np p*t), with llama.cpp's windowing (runtime/eval/perplexity.hpp): non-overlapping
// windows of --ctx tokens, the second half of each scored. Prints perplexity, tokens scored
// and time on rank 0 (or one JSON object with --json).
#include <iostream>

#include "commands.hpp"
#include "json_output.hpp"
#include "layout_flags.hpp"
#include "trellis/runtime/eval/perplexity.hpp"

namespace trellis::launchers {
namespace {

struct EvalOptions {
  runtime::PerplexityOptions ppl;
  bool json = false;
};

int run_ppl(Session& s, const EvalOptions& o) {
  const auto& p = o.ppl;
  if (!check_layout(s, p.pp, p.tp, "eval ppl")) return 1;
  auto r = runtime::evaluate_perplexity(s.world(), s.config, p);
  if (s.is_root()) std::cout << (o.json ? versioned_json(nlohmann::json::parse(runtime::to_json_text(r)), -1) + "\n" : runtime::to_text(r));
  return 0;
}

}  // namespace

Action define_eval_ppl(CLI::App& sub) {
  auto o = std::make_shared<EvalOptions>();
  auto& p = o->ppl;
  sub.add_option("--model", p.model, "Model: a .gguf file (its tokenizer is used) or a checkpoint directory");
  sub.add_option("--preset", p.preset, "Without --model: a synthetic model, byte tokenizer (tests)")
      ->capture_default_str();
  sub.add_option("--text", p.text_path, "UTF-8 text file to score")->required();
  sub.add_option("--ctx", p.ctx, "Window length in tokens; the second half of each window is scored")
      ->capture_default_str();
  sub.add_option("--max-windows", p.max_windows, "Score only the first N windows (0: all)")->capture_default_str();
  add_variant_flags(sub, p.variant, p.variant_layers);
  add_layout_flags(sub, p.pp, p.tp);
  sub.add_option("--dtype", p.dtype, "Weights in memory: f32 (exact dequantised GGUF) or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  sub.add_option("--seed", p.seed, "Seed of the synthetic model's weights")->capture_default_str();
  sub.add_flag("--json", o->json, "Print the result as one JSON object");
  return [o](Session& s) { return run_ppl(s, *o); };
}

}  // namespace trellis::launchers
