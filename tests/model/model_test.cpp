// The Llama model at t = 1: config parsing, synthetic checkpoints, and forward-pass
// consistency (batched == one at a time, prefill == incremental decode, bf16 ~ f32,
// pipeline stages chained == whole model, finite activations through many layers).
// Absolute correctness against PyTorch is scripts/reference/torch_reference.py.
#include "model_test_util.hpp"

#include <fstream>

#include "trellis/kernels/ops.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"

using namespace trellis;
using namespace trellis::runtime;
using namespace trellis::runtime::testing;

namespace {

struct Fixture {
  ModelConfig cfg;
  std::unique_ptr<CheckpointReader> reader;
  kernels::Context ctx{2};
  std::unique_ptr<transport::Group> group = transport::make_single_group(0);
  Fixture(const std::string& preset, const std::string& dtype = "F32") : cfg(model_preset(preset)) {
    reader = make_synthetic_reader(cfg, dtype, 7);
  }
  std::unique_ptr<LlamaModel> model(LoadOptions o = {}) {
    if (o.max_seq_len == 0) o.max_seq_len = 64;
    return std::make_unique<LlamaModel>(*reader, cfg, *group, ctx, o);
  }
};

std::vector<float> row(const std::vector<float>& all, std::int64_t r, std::int64_t v) {
  return {all.begin() + r * v, all.begin() + (r + 1) * v};
}

}  // namespace

TEST(ModelConfig, ParsesLlama3AndQwen2Fields) {
  auto c = parse_model_config(R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rms_norm_eps":1e-5,"rope_theta":500000.0,
    "rope_scaling":{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
    "original_max_position_embeddings":8192},"tie_word_embeddings":true})", "cfg.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.scaling, kernels::RopeScaling::kLlama3);
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  auto q = parse_model_config(R"({"model_type":"qwen2","vocab_size":100,"hidden_size":64,"intermediate_size":128,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2})", "q.json");
  EXPECT_TRUE(q.attention_bias);
  // Round trip through to_config_json.
  auto t = model_preset("tiny");
  auto back = parse_model_config(to_config_json(t), "x");
  EXPECT_EQ(back.rope.scaling, kernels::RopeScaling::kLlama3);
  EXPECT_EQ(back.rope.original_max_position_embeddings, t.rope.original_max_position_embeddings);
  EXPECT_EQ(back.parameter_count(), t.parameter_count());
  EXPECT_EQ(q.sliding_window, 0);  // Qwen2's window applies only with use_sliding_window
  auto m = parse_model_config(R"({"model_type":"mistral","vocab_size":100,"hidden_size":64,"intermediate_size":128,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"sliding_window":32})", "m.json");
  EXPECT_EQ(m.sliding_window, 32);
  expect_error([] { parse_model_config(R"({"vocab_size":100})", "bad.json"); }, {"bad.json", "hidden_size"});
  expect_error([] {
    parse_model_config(R"({"vocab_size":100,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"num_key_value_heads":3})", "kv.json");
  }, {"kv.json", "num_key_value_heads"});
}

TEST(ModelConfig, TpLayoutSplitsAndRejectsIndivisibleKvHeads) {
  auto c = model_preset("llama-1b");
  auto l = TpLayout::make(c, 3, 4);
  EXPECT_EQ(l.heads, 8);
  EXPECT_EQ(l.kv_heads, 2);
  EXPECT_EQ(l.kv_head_begin, 6);
  EXPECT_EQ(l.inter, 2048);
  EXPECT_EQ(l.vocab_begin, 24000);
  EXPECT_EQ(l.vocab_end, 32000);
  expect_error([&] { TpLayout::make(c, 0, 16); }, {"num_key_value_heads (8)", "t=16"});
  c.vocab_size = 10;
  auto last = TpLayout::make(c, 3, 4);  // chunks of 3: 0-3, 3-6, 6-9, 9-10
  EXPECT_EQ(last.vocab_begin, 9);
  EXPECT_EQ(last.vocab_local(), 1);
}

TEST(Synthetic, ReaderMatchesWrittenCheckpointAndIsSliceConsistent) {
  auto cfg = model_preset("tiny-qwen2");
  auto dir = temp_dir("synth");
  auto files = write_synthetic_checkpoint(dir, cfg, "BF16", 11, 64 << 10);  // small shards: sharded path
  EXPECT_GT(files.size(), 1u);
  auto disk = open_checkpoint(dir);
  auto mem = make_synthetic_reader(cfg, "BF16", 11);
  ASSERT_EQ(disk->tensors().size(), mem->tensors().size());
  EXPECT_EQ(parse_model_config(disk->config_json().value(), "config").torch_dtype, "bfloat16");
  for (const auto& t : mem->tensors()) {
    std::vector<std::uint16_t> a(static_cast<std::size_t>(t.numel())), b(a.size());
    mem->read_slice(t.name, Slice::all(t), ElemType::kBF16, a.data());
    disk->read_slice(t.name, Slice::all(t), ElemType::kBF16, b.data());
    ASSERT_EQ(a, b) << t.name;
    // A slice generated alone equals the same part of the whole.
    Slice s{t.rows() / 2, t.rows(), t.cols() / 3, t.cols()};
    std::vector<std::uint16_t> part(static_cast<std::size_t>(s.rows() * s.cols()));
    mem->read_slice(t.name, s, ElemType::kBF16, part.data());
    EXPECT_EQ(part[0], a[static_cast<std::size_t>(s.row_begin * t.cols() + s.col_begin)]) << t.name;
  }
  std::filesystem::remove_all(dir);
}

TEST(Model, BatchedPrefillMatchesOneSequenceAtATime) {
  Fixture f("tiny");
  const auto V = f.cfg.vocab_size;
  LoadOptions o;
  o.max_slots = 3;
  auto m = f.model(o);
  auto p0 = prompt(9, V, 0), p1 = prompt(3, V, 1), p2 = prompt(14, V, 2);
  Batch b;
  for (auto* p : {&p0, &p1, &p2}) b.tokens.insert(b.tokens.end(), p->begin(), p->end());
  b.seqs = {{0, 0, 9}, {1, 0, 3}, {2, 0, 14}};
  auto batched = m->forward(b);
  ASSERT_EQ(batched.size(), static_cast<std::size_t>(3 * V));
  auto solo_model = f.model();
  int i = 0;
  for (auto* p : {&p0, &p1, &p2}) {
    Batch one;
    one.tokens = *p;
    one.seqs = {{0, 0, static_cast<std::int64_t>(p->size())}};
    auto solo = solo_model->forward(one);
    EXPECT_LT(max_rel_diff(row(batched, i, V), solo), 1e-5) << "sequence " << i;
    ++i;
  }
}

TEST(Model, PrefillLogitsEqualIncrementalDecode) {
  Fixture f("tiny");
  const auto V = f.cfg.vocab_size;
  auto m = f.model();
  auto toks = prompt(12, V, 3);
  Batch all;
  all.tokens = toks;
  all.seqs = {{0, 0, 12}};
  all.all_logits = true;
  auto full = m->forward(all);
  // Prefill 5, then decode the remaining 7 one at a time (teacher forcing).
  Batch pre;
  pre.tokens.assign(toks.begin(), toks.begin() + 5);
  pre.seqs = {{0, 0, 5}};
  auto l = m->forward(pre);
  EXPECT_LT(max_rel_diff(l, row(full, 4, V)), 1e-5);
  for (std::int64_t pos = 5; pos < 12; ++pos) {
    std::int32_t t = toks[static_cast<std::size_t>(pos)];
    std::int64_t start = pos;
    auto step = m->forward(Batch::decode({&t, 1}, {&start, 1}));
    EXPECT_LT(max_rel_diff(step, row(full, pos, V)), 1e-5) << "position " << pos;
  }
}

TEST(Model, BatchedDecodeWithDifferentLengths) {
  Fixture f("tiny-qwen2");
  const auto V = f.cfg.vocab_size;
  LoadOptions o;
  o.max_slots = 2;
  auto m = f.model(o);
  auto a = prompt(7, V, 4), b = prompt(2, V, 5);
  Batch pre;
  pre.tokens = a;
  pre.tokens.insert(pre.tokens.end(), b.begin(), b.end());
  pre.seqs = {{0, 0, 7}, {1, 0, 2}};
  m->forward(pre);
  std::vector<std::int32_t> next = {11, 22};
  std::vector<std::int64_t> start = {7, 2};
  auto both = m->forward(Batch::decode(next, start));
  // The same two sequences alone, each prefilled with its extra token.
  auto solo = f.model();
  for (int s = 0; s < 2; ++s) {
    Batch one;
    one.tokens = s == 0 ? a : b;
    one.tokens.push_back(next[static_cast<std::size_t>(s)]);
    one.seqs = {{0, 0, static_cast<std::int64_t>(one.tokens.size())}};
    EXPECT_LT(max_rel_diff(row(both, s, V), solo->forward(one)), 1e-5) << "sequence " << s;
  }
}

TEST(Model, Bf16WeightsCloseToF32) {
  Fixture f("tiny", "BF16");
  auto toks = prompt(10, f.cfg.vocab_size, 6);
  Batch b;
  b.tokens = toks;
  b.seqs = {{0, 0, 10}};
  LoadOptions o32, o16;
  o32.weight_dtype = ElemType::kF32;
  o16.weight_dtype = ElemType::kBF16;
  auto l32 = f.model(o32)->forward(b);
  auto l16 = f.model(o16)->forward(b);
  // Same stored (bf16) values either way; only accumulation order may differ.
  EXPECT_LT(max_rel_diff(l16, l32), 1e-4);
}

TEST(Model, PipelineStagesChainedEqualWholeModel) {
  Fixture f("tiny");
  auto toks = prompt(6, f.cfg.vocab_size, 7);
  Batch b;
  b.tokens = toks;
  b.seqs = {{0, 0, 6}};
  auto whole = f.model()->forward(b);
  LoadOptions s0, s1;
  s0.last_layer = 1;
  s1.first_layer = 1;
  auto m0 = f.model(s0), m1 = f.model(s1);
  EXPECT_TRUE(m0->has_embedding());
  EXPECT_FALSE(m0->has_lm_head());
  EXPECT_FALSE(m1->has_embedding());
  auto x = kernels::Tensor::empty(kernels::DType::kF32, {6, f.cfg.hidden_size});
  m0->run_stage(b, x);
  m1->run_stage(b, x);
  auto local = kernels::Tensor::empty(kernels::DType::kF32, {1, f.cfg.vocab_size});
  m1->local_logits(b, x, local);
  std::vector<float> out;
  m1->gather_logits(local, out);
  EXPECT_LT(max_rel_diff(out, whole), 1e-6);
}

TEST(Model, ActivationsStayFiniteThroughManyLayers) {
  auto cfg = model_preset("small");
  cfg.num_layers = 48;
  cfg.vocab_size = 1024;
  cfg.hidden_size = 256;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.rope.head_dim = 64;
  cfg.intermediate_size = 512;
  auto reader = make_synthetic_reader(cfg, "BF16", 3);
  kernels::Context ctx(2);
  auto g = transport::make_single_group(0);
  LoadOptions o;
  o.max_seq_len = 64;
  LlamaModel m(*reader, cfg, *g, ctx, o);
  Batch b;
  b.tokens = prompt(16, cfg.vocab_size, 8);
  b.seqs = {{0, 0, 16}};
  b.all_logits = true;
  auto logits = m.forward(b);
  double maxabs = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    maxabs = std::max(maxabs, static_cast<double>(std::fabs(v)));
  }
  EXPECT_LT(maxabs, 100.0);
  EXPECT_GT(maxabs, 0.1);
}

TEST(Model, SlidingWindowLimitsTheContext) {
  Fixture f("tiny");
  f.cfg.sliding_window = 32;
  LoadOptions o;
  o.max_seq_len = 32;
  EXPECT_NO_THROW(f.model(o));
  o.max_seq_len = 64;
  expect_error([&] { f.model(o); }, {"sliding_window 32", "max_seq_len"});
}

TEST(Model, RejectsBadRequests) {
  Fixture f("tiny");
  auto m = f.model();
  Batch b;
  b.tokens = {1, 2, static_cast<std::int32_t>(f.cfg.vocab_size)};
  b.seqs = {{0, 0, 3}};
  expect_error([&] { m->forward(b); }, {"token 512", "vocabulary"});
  b.tokens = {1, 2, 3};
  b.seqs = {{0, 62, 3}};  // capacity 64
  expect_error([&] { m->forward(b); }, {"KV cache"});
  b.seqs = {{5, 0, 3}};
  expect_error([&] { m->forward(b); }, {"slot 5"});
}
