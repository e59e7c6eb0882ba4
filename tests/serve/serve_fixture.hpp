// Test harness for serve/: a fake engine that plays the scheduler side of a LiveQueue, HTTP
// clients with a deadline on every operation, and a fixture that starts a real Server on a
// free port against both.
//
// The fake engine is deterministic: each iteration gives every running request one token,
// next = (last + 1) % vocab, starting from the prompt's last token; a request ends at a
// stop id ("stop") or after max_tokens ("length"); a cancellation ends it with the given
// reason and is recorded.
#pragma once

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without including it.
#include <utility>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/live.hpp"
#include "trellis/serve/server.hpp"
#include "trellis/serve/text_codec.hpp"

namespace trellis::serve::testing {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using namespace std::chrono_literals;

// Polls `pred` until it holds or `timeout` passes; true when it held.
inline bool eventually(const std::function<bool()>& pred, Millis timeout = Millis(5000)) {
  const auto until = Deadline::after(timeout);
  while (!pred()) {
    if (until.expired()) return false;
    std::this_thread::sleep_for(Millis(2));
  }
  return true;
}

class FakeEngine {
 public:
  explicit FakeEngine(runtime::LiveQueue& q, int vocab = 256) : q_(q), vocab_(vocab) {}
  ~FakeEngine() { stop(); }

  // Publishes the limits (the server then says ready) and starts the scheduler thread.
  void ready(const runtime::SchedulerConfig& cfg) {
    q_.set_ready(cfg);
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // While paused the engine takes nothing from the queue: submissions pile up as waiting.
  // Pausing returns once the scheduler thread is parked (it may be inside take()).
  void set_paused(bool p) {
    paused_ = p;
    if (p && thread_.joinable()) {
      EXPECT_TRUE(eventually([&] { return parked_.load(); }));
    }
  }
  // Wall time of one iteration (every running request gets one token per iteration).
  void set_step(Millis m) { step_ms_ = static_cast<int>(m.count()); }
  std::vector<std::pair<std::int64_t, std::string>> cancels() const {
    std::lock_guard lock(mu_);
    return cancels_;
  }
  bool cancelled_with(const std::string& reason) const {
    for (auto& [id, r] : cancels())
      if (r == reason) return true;
    return false;
  }
  int running() const { return running_count_.load(); }
  std::uint64_t admitted() const { return admitted_.load(); }

 private:
  struct Seq {
    std::int64_t id;
    std::int32_t last;
    int n, max;
    std::vector<std::int32_t> stops;
    std::int64_t prompt;
  };

  void loop() {
    runtime::LiveQueue::Inbox in;
    std::vector<Seq> run;
    std::uint64_t iterations = 0;
    while (!stop_) {
      if (paused_) {
        parked_ = true;
        std::this_thread::sleep_for(Millis(1));
        continue;
      }
      parked_ = false;
      q_.take(in, run.empty() ? Millis(5) : Millis(0));
      for (auto& r : in.added) {
        run.push_back({r.id, r.prompt.back(), 0, r.sampling.max_tokens, r.sampling.stop_ids,
                       static_cast<std::int64_t>(r.prompt.size())});
        ++admitted_;
      }
      for (auto& [id, why] : in.cancelled) {
        {
          std::lock_guard lock(mu_);
          cancels_.emplace_back(id, why);
        }
        auto it = std::find_if(run.begin(), run.end(), [&](const Seq& s) { return s.id == id; });
        if (it == run.end()) continue;
        finish(it->id, {}, why);
        run.erase(it);
      }
      if (in.shutdown) {
        for (auto& s : run) finish(s.id, {}, in.shutdown_reason);
        run.clear();
      }
      if (!run.empty()) {
        std::this_thread::sleep_for(Millis(step_ms_.load()));
        ++iterations;
        for (auto it = run.begin(); it != run.end();) {
          const std::int32_t next = (it->last + 1) % vocab_;
          it->last = next;
          ++it->n;
          const bool stop = std::find(it->stops.begin(), it->stops.end(), next) != it->stops.end();
          if (stop || it->n >= it->max) {
            finish(it->id, {next}, stop ? "stop" : "length");
            it = run.erase(it);
          } else {
            emit(it->id, {next});
            ++it;
          }
        }
      }
      std::int64_t kv = 0;
      for (auto& s : run) kv += s.prompt + s.n;
      running_count_ = static_cast<int>(run.size());
      q_.update(static_cast<int>(run.size()), 0, kv, iterations, {{0, 0.5, 0.25, 0.25}});
    }
  }
  void emit(std::int64_t id, std::vector<std::int32_t> tokens) {
    runtime::LiveEvent e;
    e.id = id;
    e.tokens = std::move(tokens);
    e.time_s = now_seconds();
    q_.emit(e);
  }
  void finish(std::int64_t id, std::vector<std::int32_t> tokens, const std::string& reason) {
    runtime::LiveEvent e;
    e.id = id;
    e.tokens = std::move(tokens);
    e.finished = true;
    e.finish_reason = reason;
    e.time_s = now_seconds();
    q_.emit(e);
  }

  runtime::LiveQueue& q_;
  int vocab_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, paused_{false}, parked_{false};
  std::atomic<int> step_ms_{1};
  std::atomic<int> running_count_{0};
  std::atomic<std::uint64_t> admitted_{0};
  mutable std::mutex mu_;
  std::vector<std::pair<std::int64_t, std::string>> cancels_;
};

// Runs `fn` on its own thread and joins it when going out of scope; an exception fails the
// test instead of terminating the binary.
class Background {
 public:
  explicit Background(std::function<void()> fn)
      : t_([fn = std::move(fn)] {
          try {
            fn();
          } catch (const std::exception& e) {
            ADD_FAILURE() << "background call: " << e.what();
          }
        }) {}
  ~Background() { join(); }
  void join() {
    if (t_.joinable()) t_.join();
  }

 private:
  std::thread t_;
};

// Unpauses the engine when leaving scope, so a failed assertion never leaves a Background
// call waiting on a paused engine.
struct Unpause {
  FakeEngine& e;
  ~Unpause() { e.set_paused(false); }
};

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  json j() const { return json::parse(body); }
};

// An HTTP/1.1 client on one connection (keep-alive); every operation has a deadline.
class HttpClient {
 public:
  explicit HttpClient(int port, Millis timeout = Millis(10000)) : stream_(ioc_), timeout_(timeout) {
    stream_.expires_after(timeout_);
    stream_.async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)),
                          [this](beast::error_code e) { ec_ = e; });
    run();
    if (ec_) throw std::runtime_error("connect: " + ec_.message());
  }
  Reply call(http::verb verb, const std::string& target, const std::string& body = "",
             const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, "127.0.0.1");
    for (auto& [k, v] : headers) req.set(k, v);
    if (!body.empty() || verb == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.prepare_payload();
    stream_.expires_after(timeout_);
    http::async_write(stream_, req, [this](beast::error_code e, std::size_t) { ec_ = e; });
    run();
    if (ec_) throw std::runtime_error("write: " + ec_.message());
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    stream_.expires_after(timeout_);
    http::async_read(stream_, buffer_, parser, [this](beast::error_code e, std::size_t) { ec_ = e; });
    run();
    if (ec_) throw std::runtime_error("read: " + ec_.message());
    Reply r;
    auto& res = parser.get();
    r.status = static_cast<int>(res.result_int());
    r.body = res.body();
    for (auto& f : res) {
      std::string name(f.name_string().data(), f.name_string().size());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(f.value().data(), f.value().size());
    }
    return r;
  }

 private:
  void run() {
    ioc_.restart();
    ioc_.run();
  }
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  Millis timeout_;
  beast::error_code ec_;
};

inline Reply http_call(int port, http::verb verb, const std::string& target, const std::string& body = "",
                       const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  HttpClient c(port);
  return c.call(verb, target, body, headers);
}
inline Reply post(int port, const std::string& target, const json& body,
                  const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  return http_call(port, http::verb::post, target, body.dump(), headers);
}
inline Reply get(int port, const std::string& target,
                 const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  return http_call(port, http::verb::get, target, "", headers);
}

// Bytes in, bytes out, for malformed, slow and disconnecting clients.
class RawClient {
 public:
  explicit RawClient(int port) : stream_(ioc_) {
    stream_.expires_after(Millis(5000));
    stream_.async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)),
                          [this](beast::error_code e) { ec_ = e; });
    run();
    if (ec_) throw std::runtime_error("connect: " + ec_.message());
  }
  void send(const std::string& data) {
    stream_.expires_after(Millis(5000));
    net::async_write(stream_, net::buffer(data), [this](beast::error_code e, std::size_t) { ec_ = e; });
    run();
    if (ec_) throw std::runtime_error("send: " + ec_.message());
  }
  // Reads until `needle` has arrived; false when the deadline passed or the peer closed first.
  bool read_until(const std::string& needle, Millis timeout = Millis(5000)) {
    const auto until = Deadline::after(timeout);
    while (received_.find(needle) == std::string::npos) {
      if (!read_some(until)) return false;
    }
    return true;
  }
  // Reads until the server closes the connection; false when it stayed open past `timeout`.
  bool wait_closed(Millis timeout) {
    const auto until = Deadline::after(timeout);
    while (read_some(until)) {
    }
    return closed_;
  }
  const std::string& received() const { return received_; }
  void close() {
    beast::error_code e;
    stream_.socket().shutdown(tcp::socket::shutdown_both, e);
    stream_.close();
  }

 private:
  bool read_some(const Deadline& until) {
    if (closed_ || until.expired()) return false;
    stream_.expires_after(until.remaining());
    std::size_t got = 0;
    stream_.async_read_some(net::buffer(buf_), [&](beast::error_code e, std::size_t n) {
      ec_ = e;
      got = n;
    });
    run();
    received_.append(buf_.data(), got);
    if (ec_ == beast::error::timeout) return false;
    if (ec_) {
      closed_ = true;
      return false;
    }
    return true;
  }
  void run() {
    ioc_.restart();
    ioc_.run();
  }
  net::io_context ioc_;
  beast::tcp_stream stream_;
  std::array<char, 65536> buf_{};
  std::string received_;
  beast::error_code ec_;
  bool closed_ = false;
};

// The payloads of an SSE body ("data: X\n\n" ...); fails the test on bad framing.
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    const auto end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos << " in: " << body;
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << "event without 'data: ': " << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

inline runtime::SchedulerConfig test_limits() {
  runtime::SchedulerConfig c;
  c.groups = 1;
  c.max_seqs_per_group = 8;
  c.kv_budget_tokens = 4096;
  c.max_context = 128;
  c.max_iteration_tokens = 4096;
  return c;
}

inline ServerOptions test_options() {
  ServerOptions o;
  o.port = 0;
  o.model_name = "test-model";
  o.header_timeout = Millis(5000);
  o.queue_wait = Millis(2000);
  return o;
}

// A Server on a free port, a LiveQueue and a fake engine behind it, with the byte codec.
struct ServeEnv {
  explicit ServeEnv(ServerOptions opt = test_options(), runtime::LiveQueue::Limits lim = {}, bool ready = true,
                    runtime::SchedulerConfig cfg = test_limits())
      : queue(lim), codec(make_byte_codec(256)), engine(queue) {
    spdlog::set_level(spdlog::level::warn);
    if (ready) engine.ready(cfg);
    server = std::make_unique<Server>(opt, queue, *codec);
    server->start();
    port = server->port();
  }
  ~ServeEnv() {
    server->stop();
    engine.stop();
  }
  runtime::LiveQueue queue;
  std::unique_ptr<TextCodec> codec;
  FakeEngine engine;
  std::unique_ptr<Server> server;
  int port = 0;
};

inline json completion(const std::string& prompt, int max_tokens, json extra = json::object()) {
  json j{{"model", "test-model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  j.update(extra);
  return j;
}
inline json chat(const std::string& content, int max_tokens, json extra = json::object()) {
  json j{{"model", "test-model"},
         {"messages", json::array({json{{"role", "user"}, {"content", content}}})},
         {"max_tokens", max_tokens}};
  j.update(extra);
  return j;
}

}  // namespace trellis::serve::testing
