// Every way a request can be refused: the status, OpenAI's error object and the field it
// names; and that a refused request never disturbs the server.
#include "serve_fixture.hpp"

namespace trellis::serve::testing {
namespace {

struct BadCase {
  const char* what;
  const char* path;
  std::string body;
  int status;
  json param;  // expected "param": a string or null
  const char* needle = "";  // a piece of the message
};

std::vector<BadCase> bad_cases() {
  auto c = [](json extra) { return completion("abc", 3, std::move(extra)).dump(); };
  auto ch = [](json extra) { return chat("hi", 3, std::move(extra)).dump(); };
  auto without = [](json j, const char* key) {
    j.erase(key);
    return j.dump();
  };
  const char* C = "/v1/completions";
  const char* H = "/v1/chat/completions";
  return {
      {"malformed json", C, "{\"model\": ", 400, nullptr, "not valid JSON"},
      {"not an object", C, "[1, 2]", 400, nullptr, "JSON object"},
      {"missing model", C, without(completion("abc", 3), "model"), 400, "model", "model"},
      {"model not a string", C, c({{"model", 5}}), 400, "model", "string"},
      {"missing prompt", C, without(completion("abc", 3), "prompt"), 400, "prompt", "required"},
      {"prompt wrong type", C, c({{"prompt", 5}}), 400, "prompt", "prompt"},
      {"prompt of objects", C, c({{"prompt", {{{"a", 1}}}}}), 400, "prompt", "prompt"},
      {"several prompts", C, c({{"prompt", {"a", "b"}}}), 400, "prompt", "only one prompt per request"},
      {"empty prompt", C, c({{"prompt", ""}}), 400, "prompt", "empty"},
      {"token id outside vocab", C, c({{"prompt", {1, 256}}}), 400, "prompt", "vocabulary"},
      {"negative token id", C, c({{"prompt", {1, -1}}}), 400, "prompt", "out of range"},
      {"prompt longer than context", C, c({{"prompt", std::string(130, 'a')}}), 400, "prompt", "context"},
      {"max_tokens zero", C, c({{"max_tokens", 0}}), 400, "max_tokens", "at least 1"},
      {"max_tokens negative", C, c({{"max_tokens", -4}}), 400, "max_tokens", "at least 1"},
      {"max_tokens string", C, c({{"max_tokens", "5"}}), 400, "max_tokens", "integer"},
      {"max_tokens fraction", C, c({{"max_tokens", 2.5}}), 400, "max_tokens", "integer"},
      {"max_tokens past context", C, c({{"max_tokens", 1000}}), 400, "max_tokens", "context of 128"},
      {"temperature negative", C, c({{"temperature", -0.1}}), 400, "temperature", "[0, 2]"},
      {"temperature too high", C, c({{"temperature", 2.5}}), 400, "temperature", "[0, 2]"},
      {"temperature string", C, c({{"temperature", "hot"}}), 400, "temperature", "number"},
      {"top_p zero", C, c({{"top_p", 0}}), 400, "top_p", "(0, 1]"},
      {"top_p above one", C, c({{"top_p", 1.5}}), 400, "top_p", "(0, 1]"},
      {"top_k below -1", C, c({{"top_k", -2}}), 400, "top_k", "top_k"},
      {"min_p one", C, c({{"min_p", 1}}), 400, "min_p", "[0, 1)"},
      {"frequency_penalty", C, c({{"frequency_penalty", 3}}), 400, "frequency_penalty", "[-2, 2]"},
      {"presence_penalty", C, c({{"presence_penalty", -2.5}}), 400, "presence_penalty", "[-2, 2]"},
      {"repetition_penalty", C, c({{"repetition_penalty", 0}}), 400, "repetition_penalty", "> 0"},
      {"seed not integer", C, c({{"seed", "x"}}), 400, "seed", "integer"},
      {"n two", C, c({{"n", 2}}), 400, "n", "n=1"},
      {"five stop strings", C, c({{"stop", {"a", "b", "c", "d", "e"}}}), 400, "stop", "at most 4"},
      {"stop not strings", C, c({{"stop", {1}}}), 400, "stop", "string"},
      {"stream not bool", C, c({{"stream", "yes"}}), 400, "stream", "boolean"},
      {"stream_options without stream", C, c({{"stream_options", {{"include_usage", true}}}}), 400,
       "stream_options", "stream"},
      {"logprobs", C, c({{"logprobs", 2}}), 400, "logprobs", "not supported"},
      {"echo", C, c({{"echo", true}}), 400, "echo", "not supported"},
      {"best_of", C, c({{"best_of", 3}}), 400, "best_of", "not supported"},
      {"logit_bias", C, c({{"logit_bias", {{"50", 10}}}}), 400, "logit_bias", "not supported"},
      {"suffix", C, c({{"suffix", "end"}}), 400, "suffix", "not supported"},
      {"tools", H, ch({{"tools", {{{"type", "function"}}}}}), 400, "tools", "not supported"},
      {"chat logprobs", H, ch({{"logprobs", true}}), 400, "logprobs", "not supported"},
      {"response_format json", H, ch({{"response_format", {{"type", "json_object"}}}}), 400, "response_format",
       "not supported"},
      {"missing messages", H, without(chat("hi", 3), "messages"), 400, "messages", "required"},
      {"empty messages", H, ch({{"messages", json::array()}}), 400, "messages", "non-empty"},
      {"message not object", H, ch({{"messages", {"hi"}}}), 400, "messages[0]", "object"},
      {"bad role", H, ch({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400, "messages[0].role",
       "wizard"},
      {"content number", H, ch({{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400, "messages[0].content",
       "string"},
      {"image part", H,
       ch({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "u"}}}}}}}}), 400,
       "messages[0].content", "image_url"},
      {"max_completion_tokens zero", H, ch({{"max_completion_tokens", 0}}), 400, "max_completion_tokens",
       "at least 1"},
  };
}

TEST(ServeErrors, EveryValidationErrorNamesItsField) {
  ServeEnv env;
  HttpClient client(env.port);  // one keep-alive connection survives every refusal
  for (const auto& bc : bad_cases()) {
    SCOPED_TRACE(bc.what);
    auto r = client.call(http::verb::post, bc.path, bc.body);
    EXPECT_EQ(r.status, bc.status) << r.body;
    json j;
    ASSERT_NO_THROW(j = r.j()) << r.body;
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], bc.param) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(bc.needle), std::string::npos) << r.body;
    EXPECT_TRUE(j["error"].contains("code"));
  }
  EXPECT_EQ(env.engine.admitted(), 0u);
  // And the server still answers.
  EXPECT_EQ(client.call(http::verb::post, "/v1/completions", completion("abc", 2).dump()).status, 200);
}

TEST(ServeErrors, NeutralValuesOfUnsupportedFieldsAndUnknownFieldsPass) {
  ServeEnv env;
  auto r = post(env.port, "/v1/completions",
                completion("abc", 2, {{"logprobs", nullptr}, {"echo", false}, {"best_of", 1}, {"n", 1},
                                      {"logit_bias", json::object()}, {"user", "u1"}, {"some_new_field", 7},
                                      {"top_k", -1}, {"seed", 42}, {"stop", nullptr}}));
  EXPECT_EQ(r.status, 200) << r.body;
  r = post(env.port, "/v1/chat/completions",
           chat("hi", 2, {{"response_format", {{"type", "text"}}}, {"tools", json::array()}, {"max_tokens", nullptr}}));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(ServeErrors, UnknownModelIs404) {
  ServeEnv env;
  auto r = post(env.port, "/v1/completions", completion("abc", 3, {{"model", "gpt-4"}}));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.j()["error"]["code"], "model_not_found");
  EXPECT_EQ(r.j()["error"]["param"], "model");
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("gpt-4"), std::string::npos);
}

TEST(ServeErrors, RoutesAndMethods) {
  ServeEnv env;
  auto r = get(env.port, "/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.j()["error"]["code"], "unknown_url");
  r = get(env.port, "/v1/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "POST");
  EXPECT_EQ(r.j()["error"]["type"], "invalid_request_error");
  r = http_call(env.port, http::verb::post, "/health", "{}");
  EXPECT_EQ(r.status, 405);
  r = http_call(env.port, http::verb::delete_, "/v1/models");
  EXPECT_EQ(r.status, 405);
  // A query string does not change the route.
  EXPECT_EQ(get(env.port, "/health?verbose=1").status, 200);
}

TEST(ServeErrors, ApiKey) {
  auto opt = test_options();
  opt.api_key = "s3cret-key";
  ServeEnv env(opt);
  for (const auto& headers : std::vector<std::vector<std::pair<std::string, std::string>>>{
           {}, {{"Authorization", "Bearer wrong"}}, {{"Authorization", "Bearer s3cret-ke"}},
           {{"Authorization", "Bearer s3cret-keyy"}}, {{"Authorization", "s3cret-key"}}}) {
    for (const char* path : {"/v1/models", "/metrics", "/nope"}) {
      auto r = get(env.port, path, headers);
      EXPECT_EQ(r.status, 401) << path;
      EXPECT_EQ(r.j()["error"]["code"], "invalid_api_key");
    }
    auto r = post(env.port, "/v1/completions", completion("abc", 2), headers);
    EXPECT_EQ(r.status, 401);
  }
  const std::vector<std::pair<std::string, std::string>> good{{"Authorization", "Bearer s3cret-key"}};
  EXPECT_EQ(get(env.port, "/v1/models", good).status, 200);
  EXPECT_EQ(get(env.port, "/metrics", {{"authorization", "bearer s3cret-key"}}).status, 200);
  EXPECT_EQ(post(env.port, "/v1/completions", completion("abc", 2), good).status, 200);
  EXPECT_EQ(get(env.port, "/health").status, 200);
  EXPECT_EQ(env.engine.admitted(), 1u);
}

TEST(ServeErrors, BodyOverLimitIs413) {
  auto opt = test_options();
  opt.max_body_bytes = 1024;
  ServeEnv env(opt);
  auto r = post(env.port, "/v1/completions", completion(std::string(4096, 'a'), 2));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.j()["error"]["type"], "invalid_request_error");
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("1024"), std::string::npos);
  // A chunked body over the limit too.
  RawClient c(env.port);
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" +
         std::string(0x800, 'a') + "\r\n");
  EXPECT_TRUE(c.read_until("HTTP/1.1 413"));
  EXPECT_EQ(post(env.port, "/v1/completions", completion("abc", 2)).status, 200);
}

TEST(ServeErrors, MalformedHttpIs400) {
  ServeEnv env;
  RawClient c(env.port);
  c.send("THIS IS NOT HTTP\r\n\r\n");
  EXPECT_TRUE(c.read_until("HTTP/1.1 400"));
  EXPECT_TRUE(c.wait_closed(Millis(3000)));
  EXPECT_EQ(get(env.port, "/health").status, 200);
}

TEST(ServeErrors, ChatWithoutTemplateIs400) {
  // A codec whose model has no chat template.
  class NoChat : public TextCodec {
   public:
    NoChat() : inner_(make_byte_codec(256)) {}
    std::vector<std::int32_t> encode(std::string_view t) const override { return inner_->encode(t); }
    bool has_chat() const override { return false; }
    std::vector<std::int32_t> encode_chat(const std::vector<runtime::ChatMessage>&) const override {
      throw std::logic_error("not called");
    }
    std::string decode(std::span<const std::int32_t> ids) const override { return inner_->decode(ids); }
    std::vector<std::int32_t> chat_stop_ids() const override { return {}; }
    int vocab_size() const override { return 256; }

   private:
    std::unique_ptr<TextCodec> inner_;
  } codec;
  runtime::LiveQueue q({});
  FakeEngine engine(q);
  engine.ready(test_limits());
  Server server(test_options(), q, codec);
  server.start();
  auto r = post(server.port(), "/v1/chat/completions", chat("hi", 2));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("chat template"), std::string::npos);
  EXPECT_EQ(post(server.port(), "/v1/completions", completion("abc", 2)).status, 200);
  server.stop();
}

TEST(ServeErrors, FullQueueWaitsThenSays429) {
  auto opt = test_options();
  opt.queue_wait = Millis(300);
  ServeEnv env(opt, runtime::LiveQueue::Limits{1});
  env.engine.set_paused(true);
  Reply first;
  Background t([&] { first = post(env.port, "/v1/completions", completion("abc", 2)); });
  Unpause unpause{env.engine};
  ASSERT_TRUE(eventually([&] { return env.queue.stats().waiting == 1; }));
  const auto t0 = Clock::now();
  auto r = post(env.port, "/v1/completions", completion("abc", 2));
  const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - t0).count();
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.j()["error"]["code"], "rate_limit_exceeded");
  EXPECT_GE(waited, 280);
  EXPECT_LT(waited, 5000);
  env.engine.set_paused(false);
  t.join();
  EXPECT_EQ(first.status, 200);
  EXPECT_NE(env.server->metrics_text().find("trellis_http_responses_total{code=\"429\"} 1"), std::string::npos);
}

TEST(ServeErrors, FullQueueRetriedUntilThereIsRoom) {
  auto opt = test_options();
  opt.queue_wait = Millis(10000);
  ServeEnv env(opt, runtime::LiveQueue::Limits{1});
  env.engine.set_paused(true);
  Reply first, second;
  Background a([&] { first = post(env.port, "/v1/completions", completion("abc", 2)); });
  Unpause unpause{env.engine};
  ASSERT_TRUE(eventually([&] { return env.queue.stats().waiting == 1; }));
  Background b([&] { second = post(env.port, "/v1/completions", completion("xyz", 2)); });
  // The second one is retrying; no thread of the server is blocked meanwhile.
  EXPECT_EQ(get(env.port, "/health").status, 200);
  env.engine.set_paused(false);
  a.join();
  b.join();
  EXPECT_EQ(first.status, 200);
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(second.j()["choices"][0]["text"], "{|");
}

TEST(ServeErrors, KvBudgetRejectionIs400) {
  auto cfg = test_limits();
  cfg.kv_budget_tokens = 16;
  ServeEnv env(test_options(), {}, true, cfg);
  auto r = post(env.port, "/v1/completions", completion("abc", 40));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("KV"), std::string::npos) << r.body;
}

TEST(ServeErrors, TooManyConnectionsIs503) {
  auto opt = test_options();
  opt.max_connections = 2;
  ServeEnv env(opt);
  RawClient a(env.port), b(env.port);
  // Both are accepted (and counted) before the third: the listener takes them in order.
  ASSERT_TRUE(eventually([&] { return env.server->metrics_text().find("trellis_http_connections 2") != std::string::npos; }));
  RawClient c(env.port);
  ASSERT_TRUE(c.read_until("\r\n\r\n"));
  ASSERT_TRUE(c.wait_closed(Millis(3000)));
  EXPECT_EQ(c.received().rfind("HTTP/1.1 503", 0), 0u) << c.received();
  const auto body = json::parse(c.received().substr(c.received().find("\r\n\r\n") + 4));
  EXPECT_EQ(body["error"]["code"], "too_many_connections");
  a.close();
  b.close();
  ASSERT_TRUE(eventually([&] { return env.server->metrics_text().find("trellis_http_connections 0") != std::string::npos; }));
  EXPECT_EQ(get(env.port, "/health").status, 200);
}

TEST(ServeErrors, EngineFailureMidStreamEndsTheStream) {
  ServeEnv env;
  env.engine.set_step(Millis(10));
  RawClient c(env.port);
  const std::string body = completion("abc", 120, {{"stream", true}}).dump();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body);
  ASSERT_TRUE(c.read_until("\"text\":\"d\""));
  env.queue.set_failed("stage 1 lost its peer");
  ASSERT_TRUE(c.read_until("data: [DONE]\n\n")) << c.received();
  EXPECT_NE(c.received().find("stage 1 lost its peer"), std::string::npos);
  EXPECT_NE(c.received().find("\"engine_failed\""), std::string::npos);
}

}  // namespace
}  // namespace trellis::serve::testing
