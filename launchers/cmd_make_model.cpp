// `trellis make-model`: writes a deterministic synthetic checkpoint (config.json +
// safetensors, sharded above --max-shard-size) from a preset with optional overrides, so
// every run and study works with no download. Same seed and flags -> same bytes.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/runtime/checkpoint/gguf_writer.hpp"
#include "trellis/runtime/model/synthetic.hpp"

namespace trellis::launchers {
namespace {

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string dtype = "bf16";
  std::string out;
  std::string max_shard = "2GiB";
  std::string format = "safetensors";
  std::uint64_t seed = 1;
  int layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t hidden = 0, intermediate = 0, vocab = 0;
  double rope_theta = 0;
  int tie = -1;  // -1: preset's choice
  bool list = false;
};

std::string stored_dtype(const std::string& d) {
  if (d == "f32" || d == "float32") return "F32";
  if (d == "bf16" || d == "bfloat16") return "BF16";
  if (d == "f16" || d == "float16") return "F16";
  throw_error(ErrorCode::kInvalidArgument, "--dtype {}: expected f32, bf16 or f16", d);
}

runtime::ModelConfig build_config(const MakeModelOptions& o) {
  runtime::ModelConfig c = runtime::model_preset(o.preset);
  if (o.layers) c.num_layers = o.layers;
  if (o.hidden) c.hidden_size = o.hidden;
  if (o.heads) c.num_heads = o.heads;
  if (o.kv_heads) c.num_kv_heads = o.kv_heads;
  if (o.intermediate) c.intermediate_size = o.intermediate;
  if (o.vocab) c.vocab_size = o.vocab;
  if (o.rope_theta > 0) c.rope.theta = o.rope_theta;
  if (o.tie >= 0) c.tie_word_embeddings = o.tie == 1;
  if (o.head_dim) c.head_dim = o.head_dim;
  else if (o.hidden || o.heads) c.head_dim = static_cast<int>(c.hidden_size / c.num_heads);
  c.rope.head_dim = c.head_dim;
  c.validate("make-model flags");
  return c;
}

// --format gguf: the same synthetic values (generated in f32), written as one GGUF file with
// 2-D weights stored as --dtype (f32, f16, bf16, q8_0, q4_0, q4_1).
int write_gguf(const MakeModelOptions& o, const runtime::ModelConfig& cfg) {
  auto type = runtime::gguf::parse_type(o.dtype == "f32" ? "F32" : o.dtype == "f16" ? "F16"
                                        : o.dtype == "bf16" ? "BF16" : o.dtype);
  if (!type) throw_error(ErrorCode::kInvalidArgument, "--dtype {}: expected f32, f16, bf16, q8_0, q4_0 or q4_1", o.dtype);
  double t0 = now_seconds();
  auto src = runtime::make_synthetic_reader(cfg, "F32", o.seed);
  std::filesystem::create_directories(o.out);
  auto path = std::filesystem::path(o.out) / "model.gguf";
  runtime::gguf::write_llama_gguf(path, runtime::to_config_json(cfg), src->tensors(),
                                  [&](const runtime::TensorInfo& t, float* dst) {
                                    src->read_slice(t.name, runtime::Slice::all(t), runtime::ElemType::kF32, dst);
                                  },
                                  *type);
  std::cout << fmt::format("wrote {} ({:.1f}M parameters, GGUF {}, seed {}) in {:.1f} s\n", path.string(),
                           cfg.parameter_count() / 1e6, o.dtype, o.seed, now_seconds() - t0);
  return 0;
}

int run_make_model(Session& s, const MakeModelOptions& o) {
  if (o.list) {
    for (const auto& name : runtime::model_preset_names()) {
      auto c = runtime::model_preset(name);
      std::cout << fmt::format("{:<12} {:>6.1f}M params  layers {:>2}  hidden {:>5}  heads {:>2}/{:<2}  inter {:>5}  vocab {}\n",
                               name, c.parameter_count() / 1e6, c.num_layers, c.hidden_size, c.num_heads,
                               c.num_kv_heads, c.intermediate_size, c.vocab_size);
    }
    return 0;
  }
  if (o.out.empty()) throw_error(ErrorCode::kInvalidArgument, "--out DIR is required");
  if (!s.is_root()) return 0;  // under mpirun, one writer is enough
  auto cfg = build_config(o);
  if (o.format == "gguf") return write_gguf(o, cfg);
  std::string dt = stored_dtype(o.dtype);
  double t0 = now_seconds();
  auto files = runtime::write_synthetic_checkpoint(o.out, cfg, dt, o.seed, parse_size(o.max_shard, "--max-shard-size"));
  std::cout << fmt::format("wrote {} ({:.1f}M parameters, {}, {} file{}, seed {}) in {:.1f} s\n", o.out,
                           cfg.parameter_count() / 1e6, dt, files.size(), files.size() == 1 ? "" : "s", o.seed,
                           now_seconds() - t0);
  return 0;
}

}  // namespace

Action define_make_model(CLI::App& sub) {
  auto o = std::make_shared<MakeModelOptions>();
  sub.add_option("--preset", o->preset, "Model shape: tiny, tiny-qwen2, small, llama-1b (see --list)")->capture_default_str();
  sub.add_option("--dtype", o->dtype, "Stored dtype: f32, bf16 or f16 (GGUF also q8_0, q4_0, q4_1)")
      ->capture_default_str();
  sub.add_option("--format", o->format, "safetensors (config.json + shards) or gguf (one model.gguf)")
      ->check(CLI::IsMember({"safetensors", "gguf"}))
      ->capture_default_str();
  sub.add_option("--out", o->out, "Output directory");
  sub.add_option("--seed", o->seed, "Seed of the weights")->capture_default_str();
  sub.add_option("--max-shard-size", o->max_shard, "Split into model-0000k-of-0000n.safetensors above this size")
      ->capture_default_str();
  sub.add_option("--layers", o->layers, "Override num_hidden_layers")->check(CLI::PositiveNumber);
  sub.add_option("--hidden", o->hidden, "Override hidden_size")->check(CLI::PositiveNumber);
  sub.add_option("--heads", o->heads, "Override num_attention_heads")->check(CLI::PositiveNumber);
  sub.add_option("--kv-heads", o->kv_heads, "Override num_key_value_heads")->check(CLI::PositiveNumber);
  sub.add_option("--head-dim", o->head_dim, "Override head_dim (default hidden / heads)")->check(CLI::PositiveNumber);
  sub.add_option("--intermediate", o->intermediate, "Override intermediate_size")->check(CLI::PositiveNumber);
  sub.add_option("--vocab", o->vocab, "Override vocab_size")->check(CLI::PositiveNumber);
  sub.add_option("--rope-theta", o->rope_theta, "Override rope_theta")->check(CLI::PositiveNumber);
  sub.add_option("--tie", o->tie, "1: tie LM head to the embedding, 0: untied")->check(CLI::Range(0, 1));
  sub.add_flag("--list", o->list, "List the presets and exit");
  return [o](Session& s) { return run_make_model(s, *o); };
}

}  // namespace trellis::launchers
