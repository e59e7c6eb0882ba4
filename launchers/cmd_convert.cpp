// `trellis convert`: any checkpoint trellis reads (a GGUF file, or a safetensors directory)
// written as a Hugging Face directory: config.json + safetensors in f32 or bf16, with HF's
// tensor names and row order (a GGUF's llama.cpp rotary permutation of q/k undone, Q4_1/Q8_0
// dequantised exactly as trellis does when it loads them). The same weights can then be run
// by other engines, transformers and scripts/reference/torch_reference.py (the GPU side by
// side of docs/benchmarks.md). The tokenizer inside a GGUF is not exported.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"
#include "trellis/runtime/model/config.hpp"

namespace trellis::launchers {
namespace {

struct ConvertOptions {
  std::string model, out, dtype = "bf16", max_shard = "2GiB";
  bool force = false;
};

int run_convert(Session& s, const ConvertOptions& o) {
  if (!s.is_root()) return 0;  // under mpirun, one writer is enough
  namespace fs = std::filesystem;
  if (o.model.empty() || o.out.empty()) throw_error(ErrorCode::kInvalidArgument, "convert needs --model and --out");
  if (fs::exists(o.out) && !fs::is_empty(o.out) && !o.force)
    throw_error(ErrorCode::kInvalidArgument, "--out {}: exists and is not empty (--force to write into it)", o.out);
  const double t0 = now_seconds();
  auto reader = runtime::open_checkpoint(o.model);
  const auto cfg_text = reader->config_json();
  if (!cfg_text) throw_error(ErrorCode::kCorruptInput, "{}: has no model configuration to write", reader->describe());
  // Parsed and written back: the output says exactly what trellis understood of the model.
  runtime::ModelConfig cfg = runtime::parse_model_config(*cfg_text, o.model);
  cfg.torch_dtype = o.dtype == "f32" ? "float32" : "bfloat16";  // what the shards now hold
  const auto type = o.dtype == "f32" ? runtime::ElemType::kF32 : runtime::ElemType::kBF16;
  const std::string stored = o.dtype == "f32" ? "F32" : "BF16";
  std::vector<runtime::TensorSpec> specs;
  const auto& infos = reader->tensors();
  for (const auto& t : infos) specs.push_back({t.name, stored, t.shape});
  fs::create_directories(o.out);
  std::size_t done = 0;
  const auto files = runtime::write_safetensors_sharded(
      o.out, specs,
      [&](std::size_t i, std::span<std::byte> dst) {
        const runtime::TensorInfo& t = infos[i];
        if (dst.size() != static_cast<std::size_t>(t.numel()) * runtime::elem_size(type))
          throw_error(ErrorCode::kInternal, "convert: tensor '{}': {} bytes to fill for {} elements", t.name, dst.size(),
                      t.numel());
        reader->read_slice(t.name, runtime::Slice::all(t), type, dst.data());
        if (++done % 50 == 0) std::cerr << fmt::format("convert: {}/{} tensors\n", done, infos.size());
      },
      parse_size(o.max_shard, "--max-shard-size"));
  const fs::path cfg_path = fs::path(o.out) / "config.json";
  std::ofstream out(cfg_path, std::ios::trunc);
  out << runtime::to_config_json(cfg);
  out.close();
  if (!out) throw_error(ErrorCode::kIo, "cannot write {}", cfg_path.string());
  std::cout << fmt::format("wrote {} ({:.1f}M parameters, {} tensors as {}, {} file{}) from {} in {:.1f} s\n", o.out,
                           cfg.parameter_count() / 1e6, infos.size(), stored, files.size(), files.size() == 1 ? "" : "s",
                           reader->describe(), now_seconds() - t0);
  return 0;
}

}  // namespace

Action define_convert(CLI::App& sub) {
  auto o = std::make_shared<ConvertOptions>();
  sub.add_option("--model", o->model, "Checkpoint to read: a .gguf file or a safetensors directory")->required();
  sub.add_option("--out", o->out, "Directory to write (config.json + model*.safetensors)")->required();
  sub.add_option("--dtype", o->dtype, "Stored dtype: bf16 or f32 (f32 keeps every dequantised value exactly)")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  sub.add_option("--max-shard-size", o->max_shard, "Split into model-0000k-of-0000n.safetensors above this size")
      ->capture_default_str();
  sub.add_flag("--force", o->force, "Write into --out even if it is not empty");
  return [o](Session& s) { return run_convert(s, *o); };
}

}  // namespace trellis::launchers
