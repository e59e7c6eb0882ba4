// Prompts file and synthetic workload parsing: good lines become requests, a malformed line
// rejects the file naming its line, a bad sampling setting fails only its request.
#include <gtest/gtest.h>

#include <sstream>

#include "trellis/core/error.hpp"
#include "trellis/runtime/workload/workload.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {
Workload parse(const std::string& text, int vocab = 1000) {
  std::istringstream in(text);
  return parse_prompts(in, "p.jsonl", vocab);
}
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Workload, TokensTextAndSampling) {
  auto w = parse(
      "# comment\n"
      "{\"id\": \"a\", \"tokens\": [1, 2, 3], \"sampling\": {\"temperature\": 0.5, \"top_k\": 4, "
      "\"top_p\": 0.9, \"min_p\": 0.1, \"seed\": 9, \"frequency_penalty\": 0.5, \"presence_penalty\": 0.25, "
      "\"repetition_penalty\": 1.2, \"max_tokens\": 7, \"stop\": [5, 6]}}\n"
      "\n"
      "{\"text\": \"hi!\", \"sampling\": {\"greedy\": true}}\n");
  ASSERT_EQ(w.requests.size(), 2u);
  const auto& a = w.requests[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.prompt, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_FLOAT_EQ(a.sampling.temperature, 0.5f);
  EXPECT_EQ(a.sampling.top_k, 4);
  EXPECT_FLOAT_EQ(a.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(a.sampling.min_p, 0.1f);
  EXPECT_EQ(a.sampling.seed, 9u);
  EXPECT_FLOAT_EQ(a.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(a.sampling.max_tokens, 7);
  EXPECT_EQ(a.sampling.stop_ids, (std::vector<std::int32_t>{5, 6}));
  EXPECT_TRUE(a.error.empty());
  const auto& b = w.requests[1];
  EXPECT_EQ(b.name, "1");
  EXPECT_TRUE(b.from_text);
  EXPECT_EQ(b.prompt, (std::vector<std::int32_t>{'h', 'i', '!'}));
  EXPECT_TRUE(b.sampling.is_greedy());
  EXPECT_EQ(ByteTokenizer::decode(b.prompt), "hi!");
}

TEST(Workload, MalformedLineNamesItsNumber) {
  EXPECT_NE(error_of("{\"tokens\": [1]}\n{\"tokens\": [1,}\n").find("p.jsonl:2: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"tokens\": [1]}\n\n[1,2]\n").find("p.jsonl:3:"), std::string::npos);
  EXPECT_NE(error_of("{\"sampling\": {}}\n").find("p.jsonl:1: needs exactly one"), std::string::npos);
  EXPECT_NE(error_of("{\"tokens\": [1, \"x\"]}\n").find("p.jsonl:1: token \"x\""), std::string::npos);
  EXPECT_NE(error_of("{\"tokens\": [1, 5000]}\n").find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(error_of("{\"tokens\": []}\n").find("empty"), std::string::npos);
  EXPECT_NE(error_of("{\"tokens\": [1], \"temp\": 1}\n").find("unknown field \"temp\""), std::string::npos);
  EXPECT_NE(error_of("\n").find("no prompts"), std::string::npos);
}

TEST(Workload, BadSamplingFailsOnlyThatRequest) {
  auto w = parse(
      "{\"tokens\": [1], \"sampling\": {\"top_p\": 1.5}}\n"
      "{\"tokens\": [1], \"sampling\": {\"temperature\": \"hot\"}}\n"
      "{\"tokens\": [1], \"sampling\": {\"topk\": 3}}\n"
      "{\"tokens\": [1], \"sampling\": {\"stop\": [99999]}}\n"
      "{\"tokens\": [1], \"sampling\": {\"max_tokens\": 0}}\n"
      "{\"tokens\": [1], \"sampling\": {\"temperature\": 0.8}}\n");
  ASSERT_EQ(w.requests.size(), 6u);
  EXPECT_NE(w.requests[0].error.find("p.jsonl:1: top_p must be in (0, 1], got 1.5"), std::string::npos);
  EXPECT_NE(w.requests[1].error.find("temperature has the wrong type"), std::string::npos);
  EXPECT_NE(w.requests[2].error.find("unknown sampling setting \"topk\""), std::string::npos);
  EXPECT_NE(w.requests[3].error.find("stop id 99999"), std::string::npos);
  EXPECT_NE(w.requests[4].error.find("max_tokens must be >= 1"), std::string::npos);
  EXPECT_TRUE(w.requests[5].error.empty());
}

TEST(Workload, ValidateRanges) {
  SamplingParams p;
  EXPECT_FALSE(validate(p, 10));
  p.min_p = 1.0f;
  EXPECT_TRUE(validate(p, 10));
  p = {};
  p.repetition_penalty = 0;
  EXPECT_TRUE(validate(p, 10));
  p = {};
  p.top_k = -1;
  EXPECT_TRUE(validate(p, 10));
  p = {};
  p.frequency_penalty = 3;
  EXPECT_TRUE(validate(p, 10));
}

TEST(Workload, SyntheticSpec) {
  auto s = parse_synthetic_spec("n=5,in=7,out=3,seed=11", "--workload");
  EXPECT_EQ(s.n, 5);
  EXPECT_EQ(s.in, 7);
  EXPECT_EQ(s.out, 3);
  EXPECT_EQ(s.seed, 11u);
  auto w = make_synthetic(s, 50);
  ASSERT_EQ(w.requests.size(), 5u);
  for (const auto& r : w.requests) {
    EXPECT_EQ(r.prompt.size(), 7u);
    EXPECT_EQ(r.sampling.max_tokens, 3);
    EXPECT_TRUE(r.sampling.is_greedy());
    for (auto t : r.prompt) EXPECT_TRUE(t >= 0 && t < 50);
  }
  auto again = make_synthetic(s, 50);
  EXPECT_EQ(w.requests[3].prompt, again.requests[3].prompt);
  EXPECT_NE(w.requests[0].prompt, w.requests[1].prompt);
  EXPECT_THROW(parse_synthetic_spec("n=5,in=7", "--workload"), Error);
  EXPECT_THROW(parse_synthetic_spec("n=5,in=7,out=3,x=1", "--workload"), Error);
  EXPECT_THROW(parse_synthetic_spec("n=5,in=seven,out=3", "--workload"), Error);
}
