// Perplexity pieces without MPI: llama.cpp's windowing, the log-softmax, and a whole
// evaluation of a synthetic model on one rank (byte tokenizer) against a direct
// computation with the same model's all-position logits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/runtime/eval/perplexity.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/runtime/workload/workload.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::runtime {
namespace {

TEST(PerplexityWindows, SecondHalfOfEachFullWindow) {
  auto w = perplexity_windows(1000, 256, 0);  // floor(1000/256) = 3 windows, the rest dropped
  ASSERT_EQ(w.size(), 3u);
  for (std::size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(w[i].begin, static_cast<std::int64_t>(i) * 256);
    EXPECT_EQ(w[i].first_scored, 128);
    EXPECT_EQ(w[i].n_scored, 127);  // rows 128..254 predict tokens 129..255
  }
  EXPECT_EQ(perplexity_windows(1000, 256, 2).size(), 2u);
  EXPECT_EQ(perplexity_windows(10, 5, 0)[0].n_scored, 2);  // odd ctx: rows 2..3
  EXPECT_THROW(perplexity_windows(511, 256, 0), Error);     // fewer than 2 windows
  EXPECT_THROW(perplexity_windows(100, 3, 0), Error);
}

TEST(PerplexityNll, LogSoftmaxOfTarget) {
  std::vector<float> row = {1.0f, 2.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(negative_log_likelihood(row, 2), lse - 3.0, 1e-12);
  EXPECT_NEAR(negative_log_likelihood(row, 0), lse - 1.0, 1e-12);
  std::vector<float> big = {1000.0f, 0.0f};  // no overflow
  EXPECT_NEAR(negative_log_likelihood(big, 0), 0.0, 1e-12);
  EXPECT_THROW(negative_log_likelihood(row, 3), Error);
}

TEST(PerplexityEval, SyntheticModelMatchesDirectComputation) {
  const auto dir = std::filesystem::temp_directory_path() / ("trellis_eval_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto text_path = dir / "text.txt";
  std::string text;
  for (int i = 0; text.size() < 300; ++i) text += "line " + std::to_string(i * 7 % 13) + " of the text\n";
  std::ofstream(text_path) << text;
  Config config;
  config.set("kernels.threads", "1", SettingSource::kFlag, "test");
  auto world = transport::make_local_bootstrap();
  PerplexityOptions o;
  o.preset = "tiny";
  o.text_path = text_path.string();
  o.ctx = 64;
  auto r = evaluate_perplexity(*world, config, o);
  const auto windows = perplexity_windows(static_cast<std::int64_t>(text.size()), 64, 0);
  EXPECT_EQ(r.text_tokens, static_cast<std::int64_t>(text.size()));
  EXPECT_EQ(r.windows, static_cast<int>(windows.size()));
  EXPECT_EQ(r.tokens_scored, static_cast<std::int64_t>(windows.size()) * 31);
  EXPECT_EQ(r.tokenizer, "byte");
  // The same numbers from the model's own all-position forward.
  const ModelConfig cfg = model_preset("tiny");
  auto reader = make_synthetic_reader(cfg, "F32", 1);
  auto group = transport::make_single_group(0);
  kernels::Context ctx(1);
  LoadOptions lo;
  lo.max_seq_len = 64;
  lo.weight_dtype = ElemType::kF32;
  LlamaModel m(*reader, cfg, *group, ctx, lo);
  const auto ids = ByteTokenizer::encode(text);
  double sum = 0;
  for (const auto& w : windows) {
    Batch b;
    b.tokens.assign(ids.begin() + w.begin, ids.begin() + w.begin + 64);
    b.seqs = {SeqChunk{0, 0, 64}};
    b.all_logits = true;
    auto logits = m.forward(b);
    for (int j = w.first_scored; j < w.first_scored + w.n_scored; ++j)
      sum += negative_log_likelihood(std::span(logits.data() + j * cfg.vocab_size, static_cast<std::size_t>(cfg.vocab_size)),
                                     b.tokens[static_cast<std::size_t>(j + 1)]);
  }
  EXPECT_NEAR(r.mean_nll, sum / static_cast<double>(r.tokens_scored), 1e-9);
  EXPECT_NEAR(r.perplexity, std::exp(r.mean_nll), 1e-9 * r.perplexity);
  EXPECT_TRUE(std::isfinite(r.perplexity));
  EXPECT_GT(r.perplexity, 1.0);
  // A text too short for two windows names --ctx.
  o.ctx = 256;
  try {
    evaluate_perplexity(*world, config, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ctx 256"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trellis::runtime
