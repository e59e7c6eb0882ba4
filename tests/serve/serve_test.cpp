// The server over real sockets: completions and chat, whole and streamed, stop strings,
// /health, /v1/models, /metrics, keep-alive, a client that goes away, and a slow client.
#include "serve_fixture.hpp"

namespace trellis::serve::testing {
namespace {

TEST(ServeHealth, LoadingThenOkWithoutKey) {
  auto opt = test_options();
  opt.api_key = "secret";
  ServeEnv env(opt, {}, /*ready=*/false);
  auto r = get(env.port, "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.j()["status"], "loading");
  // Generation while loading: 503 with an error object.
  auto g = post(env.port, "/v1/completions", completion("abc", 3), {{"Authorization", "Bearer secret"}});
  EXPECT_EQ(g.status, 503);
  EXPECT_EQ(g.j()["error"]["code"], "model_loading");
  env.engine.ready(test_limits());
  r = get(env.port, "/health");  // no key needed
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.j(), json({{"status", "ok"}}));
}

TEST(ServeHealth, FailedEngineNamesTheFailure) {
  ServeEnv env;
  env.queue.set_failed("rank 3 died");
  auto r = get(env.port, "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.j()["status"], "failed");
  EXPECT_EQ(r.j()["error"], "rank 3 died");
  auto g = post(env.port, "/v1/completions", completion("abc", 3));
  EXPECT_EQ(g.status, 503);
  EXPECT_NE(g.j()["error"]["message"].get<std::string>().find("rank 3 died"), std::string::npos);
}

TEST(ServeModels, ListsTheOneModel) {
  ServeEnv env;
  auto r = get(env.port, "/v1/models");
  ASSERT_EQ(r.status, 200);
  auto j = r.j();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "trellis");
  EXPECT_GT(j["data"][0]["created"].get<std::int64_t>(), 1600000000);
  EXPECT_EQ(get(env.port, "/v1/models/test-model").j()["id"], "test-model");
  auto missing = get(env.port, "/v1/models/other");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.j()["error"]["code"], "model_not_found");
}

TEST(ServeCompletions, WholeResponse) {
  ServeEnv env;
  auto r = post(env.port, "/v1/completions", completion("abc", 5));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  auto j = r.j();
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_GT(j["created"].get<std::int64_t>(), 1600000000);
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "defgh");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 3}, {"completion_tokens", 5}, {"total_tokens", 8}}));
}

TEST(ServeCompletions, TokenIdPromptAndStopId) {
  ServeEnv env;
  // From 252 the fake engine counts 253, 254, 255, 0: the byte codec's stop id (EOS).
  auto r = post(env.port, "/v1/completions",
                json{{"model", "test-model"}, {"prompt", {250, 252}}, {"max_tokens", 10}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.j();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  // A list holding one string is one prompt too.
  r = post(env.port, "/v1/completions",
           json{{"model", "test-model"}, {"prompt", {"xy"}}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["text"], "z{");
}

TEST(ServeChat, WholeResponse) {
  ServeEnv env;
  // The byte codec renders "user: hi\nassistant: "; the engine counts on from ' ' (32).
  auto r = post(env.port, "/v1/chat/completions", chat("hi", 4, {{"temperature", 0}}));
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = r.j();
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", "!\"#$"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], std::string("user: hi\nassistant: ").size());
  // Content as a list of text parts, and max_completion_tokens.
  json body{{"model", "test-model"},
            {"messages", {{{"role", "system"}, {"content", {{{"type", "text"}, {"text", "s"}}}}},
                          {{"role", "user"}, {"content", "A"}}}},
            {"max_completion_tokens", 2}};
  r = post(env.port, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["usage"]["prompt_tokens"], std::string("system: s\nuser: A\nassistant: ").size());
  EXPECT_EQ(r.j()["usage"]["completion_tokens"], 2);
}

TEST(ServeStream, CompletionChunksAndDone) {
  ServeEnv env;
  auto r = post(env.port, "/v1/completions", completion("abc", 4, {{"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, id;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id);
    EXPECT_FALSE(c.contains("usage"));  // only with stream_options.include_usage
    ASSERT_EQ(c["choices"].size(), 1u);
    text += c["choices"][0]["text"].get<std::string>();
    const bool last = i + 2 == events.size();
    EXPECT_EQ(c["choices"][0]["finish_reason"].is_null(), !last) << events[i];
    if (last) {
      EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
    }
  }
  EXPECT_EQ(text, "defg");
  // The whole body ends exactly with the last event and [DONE].
  EXPECT_EQ(r.body.substr(r.body.size() - 14), "data: [DONE]\n\n");
}

TEST(ServeStream, ChatRoleFirstAndUsageLast) {
  ServeEnv env;
  auto r = post(env.port, "/v1/chat/completions",
                chat("hi", 3, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  auto first = json::parse(events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["usage"].is_null());
  auto usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  const auto prompt = static_cast<int>(std::string("user: hi\nassistant: ").size());
  EXPECT_EQ(usage["usage"], json({{"prompt_tokens", prompt}, {"completion_tokens", 3}, {"total_tokens", prompt + 3}}));
  auto fin = json::parse(events[events.size() - 3]);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  std::string text;
  for (std::size_t i = 1; i + 3 < events.size(); ++i) {
    auto c = json::parse(events[i]);
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    EXPECT_FALSE(c["choices"][0]["delta"].contains("role"));
    text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "!\"#");
}

TEST(ServeStop, StopStringCutsTextAndCancels) {
  ServeEnv env;
  auto r = post(env.port, "/v1/completions", completion("abc", 50, {{"stop", {"zz", "fg"}}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["text"], "de");
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "stop");
  // The engine heard about it at once rather than generating 50 tokens.
  EXPECT_TRUE(eventually([&] { return env.engine.cancelled_with("stop"); }));
  EXPECT_LT(r.j()["usage"]["completion_tokens"].get<int>(), 50);
}

TEST(ServeStop, StreamHoldsBackAPossibleStopString) {
  ServeEnv env;
  auto r = post(env.port, "/v1/completions", completion("abc", 50, {{"stop", "fgh"}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto piece = json::parse(events[i])["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(piece.find('f'), std::string::npos) << "the start of the stop string leaked: " << events[i];
    text += piece;
  }
  EXPECT_EQ(text, "de");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(eventually([&] { return env.engine.cancelled_with("stop"); }));
}

TEST(ServeStop, ChatStopsAtEndOfTurnId) {
  auto cfg = test_limits();
  cfg.max_context = 1024;
  ServeEnv env(test_options(), {}, true, cfg);
  // A chat prompt ending in byte 253: the engine counts 254, 255, then 0 (end of turn).
  auto r = post(env.port, "/v1/chat/completions",
                json{{"model", "test-model"},
                     {"messages", {{{"role", "assistant"}, {"content", "x"}}}},
                     {"max_tokens", 300}});
  ASSERT_EQ(r.status, 200) << r.body;
  // "assistant: x\nassistant: " ends in ' ' (32): 33..255 then 0 is 224 tokens, under 300.
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.j()["usage"]["completion_tokens"], 224);
}

TEST(ServeKeepAlive, SeveralRequestsOnOneConnection) {
  ServeEnv env;
  HttpClient c(env.port);
  for (int i = 0; i < 3; ++i) {
    auto r = c.call(http::verb::post, "/v1/completions", completion("abc", 2).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["choices"][0]["text"], "de");
    auto s = c.call(http::verb::post, "/v1/completions", completion("k", 2, {{"stream", true}}).dump());
    ASSERT_EQ(s.status, 200);
    EXPECT_EQ(sse_payloads(s.body).back(), "[DONE]");
  }
  EXPECT_EQ(c.call(http::verb::get, "/health").status, 200);
}

TEST(ServeKeepAlive, ExpectContinueIsAnswered) {
  ServeEnv env;
  RawClient c(env.port);
  const std::string body = completion("abc", 2).dump();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n");
  ASSERT_TRUE(c.read_until("100 Continue\r\n\r\n", Millis(3000))) << c.received();
  c.send(body);
  ASSERT_TRUE(c.read_until("\"de\"", Millis(5000))) << c.received();
}

TEST(ServeKeepAlive, Http10StreamIsRawAndEndsWithClose) {
  ServeEnv env;
  RawClient c(env.port);
  const std::string body = completion("abc", 3, {{"stream", true}}).dump();
  c.send("POST /v1/completions HTTP/1.0\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_TRUE(c.wait_closed(Millis(5000)));
  const auto& got = c.received();
  EXPECT_EQ(got.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << got;
  EXPECT_EQ(got.find("chunked"), std::string::npos) << got;
  const auto events = sse_payloads(got.substr(got.find("\r\n\r\n") + 4));
  ASSERT_EQ(events.size(), 5u) << got;  // d, e, f, the finish chunk, [DONE]
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST(ServeMetrics, CountersAndHistogramsMove) {
  ServeEnv env;
  auto before = get(env.port, "/metrics");
  ASSERT_EQ(before.status, 200);
  EXPECT_EQ(before.headers["content-type"].rfind("text/plain; version=0.0.4", 0), 0u);
  EXPECT_NE(before.body.find("trellis_time_to_first_token_seconds_count 0\n"), std::string::npos) << before.body;
  EXPECT_NE(before.body.find("trellis_requests_total{outcome=\"length\"} 0\n"), std::string::npos);
  ASSERT_EQ(post(env.port, "/v1/completions", completion("abc", 5)).status, 200);
  ASSERT_EQ(post(env.port, "/v1/completions", completion("abc", 0)).status, 400);
  // The answer can reach the client before the engine's next update says the request stopped
  // running (the test machine's load decides): wait for that update, up to a deadline.
  std::string m = env.server->metrics_text();
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       m.find("trellis_requests_running 0\n") == std::string::npos && std::chrono::steady_clock::now() < until;
       m = env.server->metrics_text())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (const char* want :
       {"# TYPE trellis_time_to_first_token_seconds histogram\n", "trellis_time_to_first_token_seconds_count 1\n",
        "trellis_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n", "trellis_time_per_output_token_seconds_count 1\n",
        "# TYPE trellis_requests_total counter\n", "trellis_requests_total{outcome=\"length\"} 1\n",
        "trellis_requests_total{outcome=\"rejected\"} 1\n", "trellis_prompt_tokens_total 3\n",
        "trellis_generation_tokens_total 5\n", "trellis_http_responses_total{code=\"200\"} 2\n",
        "trellis_http_responses_total{code=\"400\"} 1\n", "trellis_kv_cache_budget_tokens 4096\n",
        "trellis_stage_busy_ratio{stage=\"0\"} 0.5\n", "trellis_requests_running 0\n", "trellis_engine_ready 1\n",
        "# TYPE trellis_kv_cache_usage_ratio gauge\n"})
    EXPECT_NE(m.find(want), std::string::npos) << "missing: " << want << "\n" << m;
  // The iteration counter comes from the engine's update(); it moved.
  EXPECT_EQ(m.find("trellis_engine_iterations_total 0\n"), std::string::npos);
}

TEST(ServeDisconnect, ClientGoneMidStreamIsCancelled) {
  ServeEnv env;
  env.engine.set_step(Millis(10));
  RawClient c(env.port);
  const std::string body = completion("abc", 120, {{"stream", true}}).dump();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_TRUE(c.read_until("\"text\":\"d\"", Millis(5000))) << c.received();
  c.close();
  EXPECT_TRUE(eventually([&] { return env.queue.stats().cancelled >= 1; }));
  EXPECT_TRUE(env.engine.cancelled_with("client disconnected"));
  EXPECT_TRUE(eventually([&] { return env.server->metrics_text().find("trellis_requests_total{outcome=\"cancelled\"} 1") !=
                                      std::string::npos; }));
}

TEST(ServeDisconnect, ClientGoneWhileWaitingForWholeAnswer) {
  ServeEnv env;
  env.engine.set_step(Millis(10));
  RawClient c(env.port);
  const std::string body = completion("abc", 120).dump();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body);
  ASSERT_TRUE(eventually([&] { return env.engine.running() == 1; }));
  c.close();
  EXPECT_TRUE(eventually([&] { return env.queue.stats().cancelled >= 1; }));
  EXPECT_TRUE(env.engine.cancelled_with("client disconnected"));
}

TEST(ServeTimeouts, SlowHeaderIsDropped) {
  auto opt = test_options();
  opt.header_timeout = Millis(200);
  ServeEnv env(opt);
  RawClient c(env.port);
  const auto t0 = Clock::now();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");  // and never the rest
  EXPECT_TRUE(c.wait_closed(Millis(3000)));
  const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - t0);
  EXPECT_GE(waited.count(), 150);
  EXPECT_TRUE(c.received().empty()) << c.received();
  // Others are served meanwhile and after.
  EXPECT_EQ(get(env.port, "/health").status, 200);
}

TEST(ServeTimeouts, IdleKeepAliveIsClosed) {
  auto opt = test_options();
  opt.idle_timeout = Millis(200);
  ServeEnv env(opt);
  RawClient c(env.port);
  c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(c.read_until("{\"status\":\"ok\"}"));
  EXPECT_TRUE(c.wait_closed(Millis(3000)));
}

TEST(ServeTimeouts, SlowBodyIsDropped) {
  auto opt = test_options();
  opt.body_timeout = Millis(200);
  ServeEnv env(opt);
  RawClient c(env.port);
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":");
  EXPECT_TRUE(c.wait_closed(Millis(3000)));
  EXPECT_EQ(env.engine.admitted(), 0u);
}

TEST(ServeLifecycle, StopAcceptingDrains) {
  ServeEnv env;
  env.engine.set_step(Millis(5));
  // A stream already running goes on to its end.
  Reply running;
  Background t([&] { running = post(env.port, "/v1/completions", completion("abc", 40, {{"stream", true}})); });
  ASSERT_TRUE(eventually([&] { return env.engine.running() == 1; }));
  env.server->stop_accepting();
  auto r = post(env.port, "/v1/completions", completion("abc", 3));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.j()["error"]["type"], "server_error");
  auto h = get(env.port, "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.j()["status"], "draining");
  EXPECT_EQ(h.headers["connection"], "close");
  t.join();
  EXPECT_EQ(running.status, 200);
  auto events = sse_payloads(running.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST(ServeLifecycle, StopCancelsOpenRequestsAndIsIdempotent) {
  ServeEnv env;
  env.engine.set_step(Millis(10));
  RawClient c(env.port);
  const std::string body = completion("abc", 120, {{"stream", true}}).dump();
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body);
  ASSERT_TRUE(c.read_until("\"text\":\"d\""));
  env.server->stop();
  env.server->stop();
  EXPECT_TRUE(c.wait_closed(Millis(3000)));
  EXPECT_TRUE(eventually([&] { return env.queue.stats().cancelled >= 1; }));
}

TEST(ServeLifecycle, PortInUseNamesHostAndPort) {
  ServeEnv env;
  auto opt = test_options();
  opt.port = env.port;
  Server second(opt, env.queue, *env.codec);
  try {
    second.start();
    FAIL() << "a second server bound the same port";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(env.port)), std::string::npos) << e.what();
  }
}

TEST(ServeLifecycle, SeveralIoThreadsServeConcurrentStreams) {
  auto opt = test_options();
  opt.io_threads = 3;
  ServeEnv env(opt);
  std::vector<Reply> replies(6);
  {
    std::vector<std::unique_ptr<Background>> ts;
    for (int i = 0; i < 6; ++i)
      ts.push_back(std::make_unique<Background>([&, i] {
        replies[i] = post(env.port, "/v1/completions", completion("abc", 20, {{"stream", i % 2 == 0}}));
      }));
  }
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(replies[i].status, 200);
    if (i % 2) EXPECT_EQ(replies[i].j()["choices"][0]["text"], "defghijklmnopqrstuvw");
    else EXPECT_EQ(sse_payloads(replies[i].body).back(), "[DONE]");
  }
}

}  // namespace
}  // namespace trellis::serve::testing
