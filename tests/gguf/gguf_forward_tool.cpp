// gguf_forward_tool: runs a GGUF model (SmolLM2) through trellis on one rank, for the
// llama.cpp comparisons in scripts/reference/llama_cpp_agreement.py.
//   gguf_forward_tool logits   GGUF THREADS TOKENS.json OUT.f32 [OPTIONS]  all-position logits [T, vocab]
//   gguf_forward_tool generate GGUF THREADS PROMPTS.json N [OPTIONS]       greedy N tokens per prompt (JSON)
//   gguf_forward_tool bench    GGUF THREADS BATCH STEPS [f32|bf16] [OPTIONS] decode tokens/s at BATCH sequences
// OPTIONS: --weights-format dequant|native (default dequant), --kv f32|bf16 (KV-cache type,
// default f32), --perturb EPS (logits only: multiply the embedded hidden state by 1 + EPS,
// a change of rounding size that RMSNorm almost cancels, to measure how far each weight
// format amplifies float-order differences). TOKENS/PROMPTS are token ids (JSON list / list of lists), so both engines see
// the same ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "trellis/kernels/context.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/transport/group.hpp"

namespace {

using namespace trellis;
using namespace trellis::runtime;

struct Loaded {
  std::unique_ptr<CheckpointReader> reader;
  ModelConfig cfg;
  std::unique_ptr<transport::Group> group;
  std::unique_ptr<kernels::Context> ctx;
  std::unique_ptr<LlamaModel> model;
};

// The OPTIONS of the header, shared by every command.
struct Numerics {
  WeightsFormat format = WeightsFormat::kDequant;
  kernels::DType kv = kernels::DType::kF32;
  double perturb = 0.0;
};
Numerics g_numerics;

Loaded load(const std::string& path, int threads, int slots, std::int64_t max_seq,
            ElemType wtype = ElemType::kF32) {
  Loaded l;
  l.reader = open_gguf(path);
  l.cfg = parse_model_config(l.reader->config_json().value(), path);
  l.group = transport::make_single_group(0);
  l.ctx = std::make_unique<kernels::Context>(threads);
  LoadOptions opt;
  opt.weight_dtype = wtype;
  opt.max_slots = slots;
  opt.max_seq_len = max_seq;
  opt.weights_format = g_numerics.format;
  opt.kv_dtype = g_numerics.kv;
  l.model = std::make_unique<LlamaModel>(*l.reader, l.cfg, *l.group, *l.ctx, opt);
  return l;
}

std::int32_t argmax(const float* row, std::int64_t n) {
  return static_cast<std::int32_t>(std::max_element(row, row + n) - row);
}

int cmd_logits(const std::string& gguf, int threads, const std::string& tokens_json, const std::string& out) {
  std::vector<std::int32_t> tokens = nlohmann::json::parse(std::ifstream(tokens_json)).get<std::vector<std::int32_t>>();
  Loaded l = load(gguf, threads, 1, static_cast<std::int64_t>(tokens.size()) + 8);
  Batch b;
  b.tokens = tokens;
  b.seqs = {SeqChunk{0, 0, static_cast<std::int64_t>(tokens.size())}};
  b.all_logits = true;
  std::vector<float> logits;
  if (g_numerics.perturb == 0.0) {
    logits = l.model->forward(b);
  } else {  // forward() by its steps, with the embedding output scaled by 1 + eps
    const std::int64_t T = b.total_tokens(), H = l.cfg.hidden_size;
    std::vector<float> x(static_cast<std::size_t>(T * H));
    const auto xv = kernels::TensorView::matrix(x.data(), kernels::DType::kF32, T, H);
    l.model->embed(b, xv);
    for (float& v : x) v = static_cast<float>(v * (1.0 + g_numerics.perturb));
    for (int layer = 0; layer < l.cfg.num_layers; ++layer) l.model->standard_layer(layer, b, xv);
    std::vector<float> local(static_cast<std::size_t>(T * l.model->layout().vocab_local()));
    const auto lv = kernels::TensorView::matrix(local.data(), kernels::DType::kF32, T, l.model->layout().vocab_local());
    l.model->local_logits(b, xv, lv);
    l.model->gather_logits(lv, logits);
  }
  std::ofstream(out, std::ios::binary)
      .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  return 0;
}

int cmd_generate(const std::string& gguf, int threads, const std::string& prompts_json, int n) {
  auto prompts = nlohmann::json::parse(std::ifstream(prompts_json)).get<std::vector<std::vector<std::int32_t>>>();
  std::size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  Loaded l = load(gguf, threads, 1, static_cast<std::int64_t>(longest) + n + 8);
  const std::int64_t vocab = l.cfg.vocab_size;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : prompts) {
    Batch b;
    b.tokens = p;
    b.seqs = {SeqChunk{0, 0, static_cast<std::int64_t>(p.size())}};
    std::vector<float> logits = l.model->forward(b);
    std::vector<std::int32_t> gen{argmax(logits.data(), vocab)};
    std::int64_t pos = static_cast<std::int64_t>(p.size());
    while (static_cast<int>(gen.size()) < n) {
      std::int32_t tok = gen.back();
      logits = l.model->forward(Batch::decode(std::span(&tok, 1), std::span(&pos, 1)));
      ++pos;
      gen.push_back(argmax(logits.data(), vocab));
    }
    out.push_back(gen);
  }
  std::cout << out.dump() << "\n";
  return 0;
}

int cmd_bench(const std::string& gguf, int threads, int batch, int steps, const std::string& dtype) {
  const std::int64_t prompt = 16;
  Loaded l = load(gguf, threads, batch, prompt + steps + 8, dtype == "bf16" ? ElemType::kBF16 : ElemType::kF32);
  for (int s = 0; s < batch; ++s) {
    Batch b;
    for (std::int64_t k = 0; k < prompt; ++k) b.tokens.push_back(static_cast<std::int32_t>(100 + 7 * s + k));
    b.seqs = {SeqChunk{s, 0, prompt}};
    l.model->forward(b);
  }
  std::vector<std::int32_t> toks(static_cast<std::size_t>(batch), 200);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(batch), prompt);
  const std::int64_t vocab = l.cfg.vocab_size;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits = l.model->forward(Batch::decode(toks, pos));
    for (int s = 0; s < batch; ++s) {
      toks[static_cast<std::size_t>(s)] = argmax(logits.data() + s * vocab, vocab);
      ++pos[static_cast<std::size_t>(s)];
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string weights = l.model->has_quantized_weights() ? "native" : dtype;
  std::printf("{\"engine\": \"trellis\", \"weights\": \"%s\", \"kv\": \"%s\", \"threads\": %d, \"batch\": %d, "
              "\"steps\": %d, \"seconds\": %.4f, \"tokens_per_s\": %.2f}\n",
              weights.c_str(), std::string(kernels::to_string(g_numerics.kv)).c_str(), threads, batch, steps, secs,
              batch * steps / secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // Trailing --weights-format / --kv options, then the positional arguments.
    while (argc >= 3 && std::string(argv[argc - 2]).rfind("--", 0) == 0) {
      const std::string flag = argv[argc - 2], value = argv[argc - 1];
      if (flag == "--weights-format")
        g_numerics.format = parse_weights_format(value, "--weights-format");
      else if (flag == "--kv")
        g_numerics.kv = kernels::parse_dtype(value, "--kv");
      else if (flag == "--perturb")
        g_numerics.perturb = std::stod(value);
      else
        break;
      argc -= 2;
    }
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "logits" && argc == 6) return cmd_logits(argv[2], std::atoi(argv[3]), argv[4], argv[5]);
    if (cmd == "generate" && argc == 6) return cmd_generate(argv[2], std::atoi(argv[3]), argv[4], std::atoi(argv[5]));
    if (cmd == "bench" && (argc == 6 || argc == 7))
      return cmd_bench(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), argc == 7 ? argv[6] : "f32");
    std::cerr << "usage: gguf_forward_tool logits|generate|bench GGUF THREADS ... (see the source header)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "gguf_forward_tool: " << e.what() << "\n";
    return 1;
  }
}
