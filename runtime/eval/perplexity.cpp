#include "trellis/runtime/engine/device.hpp"
#include "trellis/runtime/eval/perplexity.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "trellis/core/error.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/runtime/model/variants.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"
#include "trellis/runtime/workload/workload.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/selection.hpp"

namespace trellis::runtime {
namespace {

constexpr int kHiddenTag = 0x5050;  // stage -> stage hidden states on the bootstrap link

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 0 runs `fn`; its error (or its bytes) reach every rank, so all ranks fail together
// instead of waiting on a rank that already gave up.
std::vector<std::byte> root_computes(transport::Bootstrap& world, Deadline dl,
                                     const std::function<std::vector<std::byte>()>& fn) {
  std::vector<std::byte> msg;
  if (world.rank() == 0) {
    try {
      msg = fn();
      msg.insert(msg.begin(), std::byte{0});
    } catch (const Error& e) {
      std::string w = e.what();
      msg.assign(reinterpret_cast<const std::byte*>(w.data()), reinterpret_cast<const std::byte*>(w.data()) + w.size());
      msg.insert(msg.begin(), std::byte{1});
    }
  }
  world.broadcast(msg, 0, dl);
  if (msg.empty()) throw_error(ErrorCode::kInternal, "eval ppl: empty broadcast from rank 0");
  if (msg.front() == std::byte{1})
    throw Error(ErrorCode::kInvalidArgument, std::string(reinterpret_cast<const char*>(msg.data() + 1), msg.size() - 1));
  msg.erase(msg.begin());
  return msg;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kNotFound, "--text {}: cannot be opened", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text's token ids, computed on rank 0 and shared with every rank.
// `bos` is the id that replaces each window's first token when the model adds BOS, else -1.
std::vector<std::int32_t> tokenize_text(transport::Bootstrap& world, Deadline dl, const PerplexityOptions& o,
                                        std::int64_t vocab, std::string& tokenizer_name, std::int32_t& bos) {
  auto bytes = root_computes(world, dl, [&] {
    const std::string text = read_text(o.text_path);
    std::optional<Tokenizer> tok = o.model.empty() ? std::nullopt : Tokenizer::for_model(o.model);
    std::vector<std::int32_t> ids{-1};  // ids[0]: BOS to put at each window's start, or -1
    std::string name = "byte";
    if (tok) {
      if (tok->add_bos_default()) ids[0] = tok->bos_id();
      auto t = tok->encode(text, /*parse_special=*/false, tok->add_bos_default());
      ids.insert(ids.end(), t.begin(), t.end());
      name = "gguf " + tok->pre_tokenizer();
    } else {
      if (vocab < ByteTokenizer::kVocab)
        throw_error(ErrorCode::kInvalidArgument, "eval ppl: the model has no tokenizer and a vocabulary below 256");
      auto t = ByteTokenizer::encode(text);
      ids.insert(ids.end(), t.begin(), t.end());
    }
    std::vector<std::byte> out(sizeof(std::int32_t) * ids.size() + name.size() + 1);
    out[0] = static_cast<std::byte>(name.size());
    std::memcpy(out.data() + 1, name.data(), name.size());
    std::memcpy(out.data() + 1 + name.size(), ids.data(), sizeof(std::int32_t) * ids.size());
    return out;
  });
  const std::size_t n = static_cast<std::size_t>(bytes[0]);
  tokenizer_name.assign(reinterpret_cast<const char*>(bytes.data() + 1), n);
  std::vector<std::int32_t> ids((bytes.size() - 1 - n) / sizeof(std::int32_t));
  std::memcpy(ids.data(), bytes.data() + 1 + n, ids.size() * sizeof(std::int32_t));
  bos = ids.empty() ? -1 : ids.front();
  if (!ids.empty()) ids.erase(ids.begin());
  return ids;
}

// This rank's piece of the layout: its stage's layers and TP slice, its neighbours.
struct Shard {
  int stage = 0, k = 0;
  std::unique_ptr<transport::Group> group;
  std::unique_ptr<kernels::Context> ctx;
  std::unique_ptr<CheckpointReader> reader;
  std::unique_ptr<LlamaModel> model;
  std::optional<VariantRunner> runner;
};

void load_shard(transport::Bootstrap& world, const Config& config, const PerplexityOptions& o, const ModelConfig& cfg,
                const VariantSpec& variant, Shard& sh, Deadline dl) {
  const int me = world.rank();
  sh.stage = me / o.tp;
  sh.k = me % o.tp;
  const auto hosts = transport::host_map(world, dl);
  for (int s = 0; s < o.pp; ++s) {  // collective: every rank builds every stage's group in order
    std::vector<int> members;
    for (int j = 0; j < o.tp; ++j) members.push_back(s * o.tp + j);
    // --transport also steers the TP all-reduce, as in trellis run (the group's link class:
    // shared memory when its members share a host, else the network).
    bool one_host = true;
    for (int m : members) one_host = one_host && hosts[static_cast<std::size_t>(m)] == hosts[static_cast<std::size_t>(members[0])];
    auto choice = transport::choose_backend(one_host ? topology::LinkClass::kSharedMemory : topology::LinkClass::kTcp,
                                            false, transport::SelectionPolicy::from_config(config));
    auto go = transport::follow_transport(transport::GroupOptions::from_config(config), choice);
    auto g = o.tp == 1 ? (s == sh.stage ? transport::make_single_group(me) : nullptr)
                       : transport::make_group(world, members, go, config, hosts);
    if (s == sh.stage) sh.group = std::move(g);
  }
  sh.reader = o.model.empty() ? make_synthetic_reader(cfg, "F32", o.seed) : open_checkpoint(o.model);
  LoadOptions lo;
  lo.first_layer = static_cast<int>(static_cast<std::int64_t>(sh.stage) * cfg.num_layers / o.pp);
  lo.last_layer = static_cast<int>(static_cast<std::int64_t>(sh.stage + 1) * cfg.num_layers / o.pp);
  lo.max_slots = 1;
  lo.max_seq_len = o.ctx;
  lo.window_bytes = config.get_size("comm.coll_shm_window");
  lo.weight_dtype = o.dtype == "bf16" ? ElemType::kBF16 : ElemType::kF32;
  // native: GGUF blocks kept quantised, multiplied as llama.cpp does (8-bit activations).
  lo.weights_format = parse_weights_format(config.get_string("model.weights_format"), "model.weights_format");
  sh.ctx = std::make_unique<kernels::Context>(cpu_context(config));
  sh.model = std::make_unique<LlamaModel>(*sh.reader, cfg, *sh.group, *sh.ctx, lo);
  if (variant.kind != Variant::kStandard) {
    VariantOptions vo;  // as trellis run: lp loads the paper's per-layer shards from the reader
    vo.progress = transport::ProgressOptions::from_config(config);
    vo.reader = sh.reader.get();
    vo.load = lo;
    sh.runner.emplace(*sh.model, variant, config.get_duration("comm.deadline_ms"), std::move(vo));
  }
}

// One window through the pipeline. Returns the summed NLL of its scored tokens on the last
// stage's TP rank 0 (0 elsewhere).
double run_window(transport::Bootstrap& world, const PerplexityOptions& o, Shard& sh, std::span<const std::int32_t> toks,
                  const PplWindow& w, Millis wait, std::vector<float>& x, std::vector<float>& local,
                  std::vector<float>& full) {
  LlamaModel& m = *sh.model;
  const std::int64_t H = m.config().hidden_size, T = o.ctx;
  Batch b;
  b.tokens.assign(toks.begin(), toks.end());
  b.seqs = {SeqChunk{0, 0, T}};
  b.all_logits = true;
  auto xv = kernels::TensorView::matrix(x.data(), kernels::DType::kF32, T, H);
  auto bytes = std::as_writable_bytes(std::span(x));
  if (sh.stage > 0) world.recv((sh.stage - 1) * o.tp + sh.k, kHiddenTag, bytes, Deadline::after(wait));
  if (sh.runner) sh.runner->run_stage(b, xv);
  else m.run_stage(b, xv);
  if (sh.stage + 1 < o.pp) {
    world.send((sh.stage + 1) * o.tp + sh.k, kHiddenTag, bytes, Deadline::after(wait));
    return 0;
  }
  const std::int64_t V = m.config().vocab_size;
  auto lv = kernels::TensorView::matrix(local.data(), kernels::DType::kF32, T, m.layout().vocab_local());
  m.local_logits(b, xv, lv);
  m.gather_logits(lv, full);
  if (sh.k != 0) return 0;
  double sum = 0;
  for (int j = w.first_scored; j < w.first_scored + w.n_scored; ++j) {
    sum += negative_log_likelihood(std::span(full.data() + j * V, static_cast<std::size_t>(V)), toks[j + 1]);
  }
  return sum;
}

// The model's config, with the layout checked against it before any rank loads weights.
ModelConfig checked_config(const PerplexityOptions& o, int world_size) {
  check_layout_ranks(o.pp, o.tp, world_size);
  if (o.dtype != "f32" && o.dtype != "bf16")
    throw_error(ErrorCode::kInvalidArgument, "--dtype {}: expected f32 or bf16", o.dtype);
  ModelConfig cfg;
  if (!o.model.empty()) {
    auto reader = open_checkpoint(o.model);
    auto text = reader->config_json();
    if (!text) throw_error(ErrorCode::kNotFound, "{}: no config.json", reader->describe());
    cfg = parse_model_config(*text, reader->describe() + "/config.json");
  } else {
    cfg = model_preset(o.preset);
  }
  if (cfg.num_heads % o.tp != 0 || cfg.num_kv_heads % o.tp != 0) {  // before any rank loads
    std::string valid;
    for (int v = 1; v <= cfg.num_kv_heads; ++v)
      if (cfg.num_heads % v == 0 && cfg.num_kv_heads % v == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(v);
    throw_error(ErrorCode::kInvalidArgument,
                "--tp {}: {} heads / {} KV heads cannot be split over {} ranks (each rank holds whole heads); "
                "valid t: {}",
                o.tp, cfg.num_heads, cfg.num_kv_heads, o.tp, valid);
  }
  if (o.pp > cfg.num_layers)
    throw_error(ErrorCode::kInvalidArgument, "--pp {}: the model has only {} layers (one stage needs one)", o.pp,
                cfg.num_layers);
  return cfg;
}

// Every window through the pipeline; returns each window's summed NLL on every rank (the
// scorer's numbers, shared by a bootstrap allgather of a few doubles).
std::vector<double> score_windows(transport::Bootstrap& world, const PerplexityOptions& o, Shard& sh,
                                  const std::vector<std::int32_t>& tokens, const std::vector<PplWindow>& windows,
                                  std::int32_t bos, Millis wait, std::int64_t hidden) {
  std::vector<float> x(static_cast<std::size_t>(o.ctx * hidden));
  std::vector<float> local, full;
  if (sh.stage == o.pp - 1) local.resize(static_cast<std::size_t>(o.ctx * sh.model->layout().vocab_local()));
  std::vector<double> sums;
  std::vector<std::int32_t> win(static_cast<std::size_t>(o.ctx));
  for (const PplWindow& w : windows) {
    std::copy_n(tokens.begin() + w.begin, o.ctx, win.begin());
    if (bos >= 0) win[0] = bos;  // as llama.cpp: every window starts with BOS when the model wants one
    sums.push_back(run_window(world, o, sh, win, w, wait, x, local, full));
  }
  auto all = world.allgather(std::as_bytes(std::span(sums)), Deadline::after(wait));
  std::memcpy(sums.data(), all[static_cast<std::size_t>((o.pp - 1) * o.tp)].data(), sums.size() * sizeof(double));
  return sums;
}

}  // namespace

std::vector<PplWindow> perplexity_windows(std::int64_t n_tokens, int ctx, int max_windows) {
  if (ctx < 4) throw_error(ErrorCode::kInvalidArgument, "--ctx {} is too small (at least 4 tokens)", ctx);
  if (n_tokens < 2LL * ctx)
    throw_error(ErrorCode::kInvalidArgument,
                "the text has {} tokens; perplexity with --ctx {} needs at least 2 x ctx = {} (use a smaller --ctx)",
                n_tokens, ctx, 2LL * ctx);
  std::int64_t n = n_tokens / ctx;
  if (max_windows > 0) n = std::min<std::int64_t>(n, max_windows);
  std::vector<PplWindow> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back({i * ctx, ctx / 2, ctx - 1 - ctx / 2});
  return out;
}

double negative_log_likelihood(std::span<const float> row, std::int32_t target) {
  if (target < 0 || static_cast<std::size_t>(target) >= row.size())
    throw_error(ErrorCode::kInvalidArgument, "token {} is outside the {}-entry logits row", target, row.size());
  double mx = row[0];
  for (float v : row) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
  return std::log(sum) + mx - static_cast<double>(row[static_cast<std::size_t>(target)]);
}

PerplexityResult evaluate_perplexity(transport::Bootstrap& world, const Config& config, const PerplexityOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const Deadline setup = Deadline::after(config.get_duration("comm.connect_timeout_ms") * 3);
  const ModelConfig cfg = checked_config(o, world.size());
  const VariantSpec variant = parse_variant_spec(o.variant, o.variant_layers, cfg.num_layers);
  validate_variant(variant, cfg, o.tp);
  PerplexityResult r;
  std::int32_t bos = -1;
  const auto tokens = tokenize_text(world, setup, o, cfg.vocab_size, r.tokenizer, bos);
  const auto windows = perplexity_windows(static_cast<std::int64_t>(tokens.size()), o.ctx, o.max_windows);
  Shard sh;
  load_shard(world, config, o, cfg, variant, sh, setup);
  const Millis wait = config.get_duration("comm.deadline_ms") + Millis(600000);  // a window's forwards upstream
  world.barrier(Deadline::after(wait));
  r.load_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  const auto sums = score_windows(world, o, sh, tokens, windows, bos, wait, cfg.hidden_size);
  r.eval_s = seconds_since(t1);
  for (const PplWindow& w : windows) r.tokens_scored += w.n_scored;
  double total = 0;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    total += sums[i];
    r.window_ppl.push_back(std::exp(sums[i] / windows[i].n_scored));
  }
  r.mean_nll = total / static_cast<double>(r.tokens_scored);
  r.perplexity = std::exp(r.mean_nll);
  r.text_tokens = static_cast<std::int64_t>(tokens.size());
  r.windows = static_cast<int>(windows.size());
  r.ctx = o.ctx;
  r.layout = fmt::format("pp={} tp={} ({} ranks)", o.pp, o.tp, world.size());
  r.variant = o.variant_layers.empty() ? o.variant : o.variant + " (layers " + o.variant_layers + ")";
  r.text = o.text_path;
  r.model = o.model.empty() ? "preset " + o.preset : o.model;
  r.dtype = config.get_string("model.weights_format") == "native" ? o.dtype + ", GGUF blocks native (8-bit activations)"
                                                                  : o.dtype;
  return r;
}

std::string to_text(const PerplexityResult& r) {
  return fmt::format(
      "perplexity: {:.4f}  (mean NLL {:.5f} nats)\n"
      "model {} · weights {} · variant {} · {}\n"
      "text {}: {} tokens ({} tokenizer); {} windows of {} tokens, second half of each scored: {} tokens\n"
      "time: {:.2f} s eval ({:.1f} scored tokens/s, {:.1f} window tokens/s), {:.2f} s load\n",
      r.perplexity, r.mean_nll, r.model, r.dtype, r.variant, r.layout, r.text, r.text_tokens, r.tokenizer, r.windows,
      r.ctx, r.tokens_scored, r.eval_s, r.tokens_scored / std::max(1e-9, r.eval_s),
      static_cast<double>(r.windows) * r.ctx / std::max(1e-9, r.eval_s), r.load_s);
}

std::string to_json_text(const PerplexityResult& r) {
  nlohmann::json j = {{"perplexity", r.perplexity}, {"mean_nll", r.mean_nll},   {"tokens_scored", r.tokens_scored},
                      {"text_tokens", r.text_tokens}, {"windows", r.windows},   {"ctx", r.ctx},
                      {"window_ppl", r.window_ppl}, {"eval_s", r.eval_s},       {"load_s", r.load_s},
                      {"tokenizer", r.tokenizer},   {"layout", r.layout},       {"variant", r.variant},
                      {"text", r.text},             {"model", r.model},         {"dtype", r.dtype},
                      {"scoring", "llama.cpp perplexity: non-overlapping ctx windows, second half scored"}};
  return j.dump();
}

}  // namespace trellis::runtime
