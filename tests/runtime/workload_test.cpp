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
  // SWIFT's per-request switch: a boolean or nothing.
  EXPECT_NE(error_of("{\"tokens\": [1], \"swift\": \"yes\"}\n").find("p.jsonl:1: \"swift\" must be true or false"),
            std::string::npos);
  auto w = parse("{\"tokens\": [1], \"swift\": false}\n{\"tokens\": [2]}\n");
  ASSERT_EQ(w.requests.size(), 2u);
  EXPECT_EQ(w.requests[0].swift, std::optional<bool>(false));
  EXPECT_FALSE(w.requests[1].swift.has_value());
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

// Issue 23.4: deeply nested values in a prompts file (untrusted input) crashed every rank
// (recursion in the JSON library). They are refused naming the file, line and field.
TEST(Workload, DeeplyNestedJsonIsRejectedNamingLineAndField) {
  const std::string open(100000, '['), close(100000, ']');
  const auto tokens = error_of("{\"tokens\": [1]}\n{\"tokens\":" + open + close + "}\n");
  EXPECT_NE(tokens.find("p.jsonl:2:"), std::string::npos) << tokens;
  EXPECT_NE(tokens.find("\"tokens\""), std::string::npos) << tokens;
  EXPECT_NE(tokens.find("nested deeper than"), std::string::npos) << tokens;
  const auto id = error_of("{\"text\": \"x\", \"id\":" + open + close + "}\n");
  EXPECT_NE(id.find("p.jsonl:1:"), std::string::npos) << id;
  EXPECT_NE(id.find("\"id\""), std::string::npos) << id;
  std::string objects_line = "{\"tokens\": [1], \"sampling\": ";
  for (int i = 0; i < 50000; ++i) objects_line += "{\"a\":";
  objects_line += "1" + std::string(50000, '}') + "}\n";
  const auto objects = error_of(objects_line);
  EXPECT_NE(objects.find("\"sampling\""), std::string::npos) << objects;
  // Ordinary nesting (messages: object > list > object) stays fine.
  EXPECT_EQ(parse("{\"id\": {\"a\": [[1, {\"b\": [2]}]]}, \"tokens\": [1]}\n").requests.at(0).name,
            "{\"a\":[[1,{\"b\":[2]}]]}");
}

// A line longer than the cap (16 MiB) is refused before it is parsed, naming the line.
TEST(Workload, OverlongLineIsRejected) {
  std::string line = "{\"tokens\": [1";
  while (line.size() < (17u << 20)) line += ",1";
  const auto e = error_of("{\"tokens\": [1]}\n" + line + "]}\n");
  EXPECT_NE(e.find("p.jsonl:2:"), std::string::npos) << e.substr(0, 200);
  EXPECT_NE(e.find("16 MiB"), std::string::npos) << e.substr(0, 200);
}

// Synthetic specs are bounded too: n=1e14 allocated until the process was killed.
TEST(Workload, SyntheticSpecIsBounded) {
  auto message = [](std::string_view spec) {
    try {
      parse_synthetic_spec(spec, "--workload");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("n=100000000000000,in=1,out=1").find("n must be in 1..1000000"), std::string::npos);
  EXPECT_NE(message("n=4294967297,in=1,out=1").find("--workload"), std::string::npos);  // not truncated to 1
  EXPECT_NE(message("n=1,in=100000000,out=1").find("in must be in"), std::string::npos);
  EXPECT_NE(message("n=1,in=1,out=-5").find("out must be in"), std::string::npos);
  EXPECT_NE(message("n=1000000,in=1000000,out=1").find("tokens"), std::string::npos);  // n x in in total
  EXPECT_EQ(message("n=1000,in=128,out=128"), "accepted");
}
