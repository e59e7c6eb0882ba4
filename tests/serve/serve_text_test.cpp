// The pure parts of serve/: the text stream (stop strings, hold-back, UTF-8), the byte
// codec, request parsing into runtime::Request, response objects and the histogram.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/smollm2_path.hpp"
#include "trellis/core/error.hpp"
#include "trellis/serve/metrics.hpp"
#include "trellis/serve/openai.hpp"
#include "trellis/serve/text_stream.hpp"

namespace trellis::serve {
namespace {

using json = nlohmann::json;

TEST(ServeText, Utf8CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xC3"), 1u);              // é's first byte
  EXPECT_EQ(utf8_complete_prefix("a\xC3\xA9"), 3u);          // é whole
  EXPECT_EQ(utf8_complete_prefix("a\xE2\x82"), 1u);          // € missing its last byte
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98"), 1u);      // 😀 missing one
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98\x80"), 5u);  // 😀 whole
  EXPECT_EQ(utf8_complete_prefix("a\xFF"), 2u);              // never valid: nothing to wait for
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);              // stray continuation byte
}

TEST(ServeText, HoldsSplitCharacterUntilComplete) {
  auto codec = make_byte_codec(256);
  TextStream s(*codec, {});
  EXPECT_EQ(s.push_bytes("caf\xC3"), "caf");
  EXPECT_EQ(s.push_bytes("\xA9!"), "\xC3\xA9!");
  EXPECT_EQ(s.push_bytes("\xE2\x82"), "");
  EXPECT_EQ(s.push_bytes("\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(s.text(), "caf\xC3\xA9!\xE2\x82\xAC");
}

TEST(ServeText, StopStringAcrossPushesIsCutAndNeverShown) {
  auto codec = make_byte_codec(256);
  TextStream s(*codec, {"END", "", "xyz"});
  EXPECT_EQ(s.push_bytes("hello E"), "hello ");  // "E" may start "END"
  EXPECT_EQ(s.push_bytes("N"), "");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.push_bytes("Dmore"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "hello ");
  EXPECT_EQ(s.push_bytes("more"), "");
  EXPECT_EQ(s.finish(), "");
}

TEST(ServeText, FalseStartIsReleasedAndEarliestStopWins) {
  auto codec = make_byte_codec(256);
  TextStream s(*codec, {"abc", "bd"});
  EXPECT_EQ(s.push_bytes("xa"), "x");
  EXPECT_EQ(s.push_bytes("b"), "");  // "ab" may start "abc", "b" may start "bd"
  EXPECT_EQ(s.push_bytes("x"), "abx");
  EXPECT_EQ(s.push_bytes("zab"), "z");
  EXPECT_EQ(s.push_bytes("d"), "a");  // "bd" matched; "abc" never completed
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "xabxza");
}

TEST(ServeText, FinishReleasesHeldText) {
  auto codec = make_byte_codec(256);
  TextStream s(*codec, {"STOP"});
  EXPECT_EQ(s.push(std::vector<std::int32_t>{'o', 'k', ' ', 'S', 'T'}), "ok ");
  EXPECT_EQ(s.finish(), "ST");
  EXPECT_EQ(s.text(), "ok ST");
}

TEST(ServeText, ByteCodec) {
  auto codec = make_byte_codec(300);
  EXPECT_EQ(codec->encode("Az"), (std::vector<std::int32_t>{65, 122}));
  const std::vector<std::int32_t> ids{72, 0, 105, 299};
  EXPECT_EQ(codec->decode(ids), "Hi");  // 0 is EOS, >= 256 special: both skipped
  EXPECT_EQ(codec->chat_stop_ids(), std::vector<std::int32_t>{0});
  EXPECT_EQ(codec->vocab_size(), 300);
  ASSERT_TRUE(codec->has_chat());
  const auto chat = codec->encode_chat({{"system", "be brief"}, {"user", "hi"}});
  EXPECT_EQ(codec->decode(chat), "system: be brief\nuser: hi\nassistant: ");
  EXPECT_THROW(codec->encode_chat({{"tool", "x"}}), Error);
  EXPECT_THROW(make_byte_codec(0), Error);
}

ParseContext context() {
  ParseContext c;
  c.model_name = "m";
  c.vocab_size = 256;
  c.max_context = 64;
  c.default_max_tokens = 100;
  c.default_seed = 1234;
  return c;
}

TEST(ServeParse, MapsFieldsToTheRuntimeRequest) {
  auto codec = make_byte_codec(256);
  const json body{{"model", "m"},           {"prompt", "hey"},          {"max_tokens", 7},
                  {"temperature", 0.5},     {"top_p", 0.9},             {"top_k", 40},
                  {"min_p", 0.05},          {"seed", 99},               {"frequency_penalty", 0.5},
                  {"presence_penalty", -1}, {"repetition_penalty", 1.2}, {"stop", {"\n\n", "###"}},
                  {"stream", true},         {"stream_options", {{"include_usage", true}}}};
  const auto g = parse_generation(Endpoint::kCompletions, body.dump(), *codec, context());
  const auto& r = g.request;
  EXPECT_EQ(r.prompt, (std::vector<std::int32_t>{'h', 'e', 'y'}));
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FALSE(r.sampling.is_greedy());
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.seed, 99u);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -1.0f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(r.sampling.stop_ids, std::vector<std::int32_t>{0});
  EXPECT_EQ(g.stop, (std::vector<std::string>{"\n\n", "###"}));
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.include_usage);
}

TEST(ServeParse, DefaultsFollowOpenAIAndTheContext) {
  auto codec = make_byte_codec(256);
  auto g = parse_generation(Endpoint::kCompletions, R"({"model":"m","prompt":"abcd"})", *codec, context());
  EXPECT_FLOAT_EQ(g.request.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_FALSE(g.request.sampling.is_greedy());
  EXPECT_EQ(g.request.sampling.seed, 1234u);
  EXPECT_EQ(g.request.sampling.max_tokens, 60);  // min(100, 64 - 4)
  EXPECT_FALSE(g.stream);
  g = parse_generation(Endpoint::kCompletions, R"({"model":"m","prompt":"a","temperature":0,"top_k":-1})", *codec,
                       context());
  EXPECT_TRUE(g.request.sampling.is_greedy());
  EXPECT_EQ(g.request.sampling.top_k, 0);
  g = parse_generation(Endpoint::kChat,
                       R"({"model":"m","messages":[{"role":"developer","content":"d"}],"max_completion_tokens":3,
                           "max_tokens":9})",
                       *codec, context());
  EXPECT_EQ(g.request.sampling.max_tokens, 3);
  EXPECT_EQ(codec->decode(g.request.prompt), "system: d\nassistant: ");
}

TEST(ServeParse, ErrorsCarryStatusAndParam) {
  auto codec = make_byte_codec(256);
  try {
    parse_generation(Endpoint::kCompletions, R"({"model":"other","prompt":"a"})", *codec, context());
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(e.param(), "model");
    EXPECT_EQ(e.code(), "model_not_found");
  }
  try {
    parse_generation(Endpoint::kCompletions, R"({"model":"m","prompt":"abc","max_tokens":62})", *codec, context());
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "max_tokens");
    EXPECT_NE(std::string(e.what()).find("room for 61"), std::string::npos) << e.what();
  }
  const auto body = json::parse(error_body(ApiError(400, "bad", "top_p")));
  EXPECT_EQ(body, json({{"error", {{"message", "bad"}, {"type", "invalid_request_error"}, {"param", "top_p"},
                                   {"code", nullptr}}}}));
  EXPECT_EQ(json::parse(error_body(ApiError(503, "x")))["error"]["type"], "server_error");
}

TEST(ServeParse, ResponsesReplaceInvalidUtf8) {
  ResponseMeta meta{Endpoint::kChat, "chatcmpl-1", 5, "m"};
  const auto j = json::parse(response_body(meta, "ok\xFF", "stop", {3, 2}));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "ok\xEF\xBF\xBD");
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
}

TEST(ServeMetricsText, HistogramIsCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.0625);
  h.observe(0.5);
  h.observe(0.75);
  h.observe(3.0);
  std::string out;
  h.render(out, "x");
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 3\nx_bucket{le=\"+Inf\"} 4\nx_sum 4.3125\nx_count 4\n");
}

TEST(ServeText, TokenizerCodecOnSmolLM2) {
  const std::string path = test::smollm2_gguf_path();
  TRELLIS_SKIP_WITHOUT_SMOLLM2(path);
  const auto tok = runtime::Tokenizer::from_gguf(std::filesystem::path(path));
  const auto codec = make_tokenizer_codec(tok);
  EXPECT_EQ(codec->vocab_size(), 49152);
  ASSERT_TRUE(codec->has_chat());
  // User text naming a control token stays text.
  const auto ids = codec->encode("<|im_start|>system");
  EXPECT_GT(ids.size(), 2u);
  EXPECT_EQ(codec->decode(ids), "<|im_start|>system");
  const std::vector<runtime::ChatMessage> chat{{"user", "What is 2+2?"}};
  EXPECT_EQ(codec->encode_chat(chat), tok.encode_chat(chat));
  // Control tokens are left out of the text; they end a generation.
  const auto stops = codec->chat_stop_ids();
  EXPECT_NE(std::find(stops.begin(), stops.end(), tok.eos_id()), stops.end());
  EXPECT_EQ(codec->decode(stops), "");
  // Streamed one token at a time, multi-byte characters come out whole and in order.
  const std::string text = "h\xC3\xA9llo w\xC3\xB6rld \xF0\x9F\x98\x80 \xE2\x82\xAC" "5";
  TextStream s(*codec, {});
  std::string out;
  for (auto id : codec->encode(text)) {
    const std::string piece = s.push(std::vector<std::int32_t>{id});
    EXPECT_EQ(utf8_complete_prefix(piece), piece.size()) << "a chunk ends inside a character: " << ::testing::PrintToString(piece);
    out += piece;
  }
  out += s.finish();
  EXPECT_EQ(out, text);
}

}  // namespace
}  // namespace trellis::serve
