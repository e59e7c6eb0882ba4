// One HTTP connection: reading requests under timeouts, routing, plain responses, the
// monitor read that notices a client going away, and closing.
#include "session.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

namespace trellis::serve {
namespace {

constexpr std::uint32_t kHeaderLimit = 16 * 1024;
constexpr std::size_t kReadChunk = 4096;
// Bytes a client may send while its request runs (a pipelined next request) before the
// server stops reading them; it then no longer notices that client going away.
constexpr std::size_t kMaxPipelined = 64 * 1024;
constexpr auto kLinger = std::chrono::seconds(1);

// Compares in time that depends only on the lengths, never on where the strings differ.
bool constant_time_equal(std::string_view a, std::string_view b) {
  const std::size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    const auto y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool is_disconnect(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::broken_pipe || ec == net::error::operation_aborted || ec == net::error::bad_descriptor;
}

}  // namespace

Session::Session(tcp::socket socket, ServerState& st)
    : st_(st), stream_(std::move(socket)), retry_timer_(stream_.get_executor()) {
  ++st_.connections;
}

Session::~Session() {
  // The server stopped (or the last handler went away) with a request still open.
  if (gen_ && gen_->open) st_.queue.cancel(gen_->id, "connection closed");
  --st_.connections;
}

void Session::start() { read_next(); }

void Session::read_next() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(static_cast<std::uint64_t>(st_.opt.max_body_bytes));
  parser_->header_limit(kHeaderLimit);
  ex_ = Exchange{};
  must_close_ = false;
  if (served_ == 0 || buffer_.size() > 0) {
    read_header();
    return;
  }
  // Between keep-alive requests the client may stay quiet for idle_timeout; the header
  // timeout starts with its next byte.
  stream_.expires_after(st_.opt.idle_timeout);
  stream_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                            self->buffer_.commit(n);
                            if (ec) {
                              self->close("idle");
                              return;
                            }
                            self->read_header();
                          });
}

void Session::read_header() {
  stream_.expires_after(st_.opt.header_timeout);
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (closed_) return;
  ex_.arrival_s = now_seconds();
  if (ec) {
    on_read_error(ec);
    return;
  }
  const auto& req = parser_->get();
  ex_.method = std::string(to_std(req.method_string()));
  ex_.target = std::string(to_std(req.target()));
  if (beast::iequals(req[http::field::expect], "100-continue")) {
    // curl sends this for bodies over 1 KiB and waits a second for the go-ahead.
    static const std::string k100 = "HTTP/1.1 100 Continue\r\n\r\n";
    stream_.expires_after(st_.opt.body_timeout);
    net::async_write(stream_, net::buffer(k100), [self = shared_from_this()](beast::error_code e, std::size_t) {
      if (e) return self->close("client disconnected");
      self->read_body();
    });
    return;
  }
  read_body();
}

void Session::read_body() {
  stream_.expires_after(st_.opt.body_timeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_body(ec); });
}

void Session::on_body(beast::error_code ec) {
  if (closed_) return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  try {
    route();
  } catch (const ApiError& e) {
    reply_error(e);
  } catch (const std::exception& e) {
    spdlog::error("serve: {} {}: {}", ex_.method, ex_.target, e.what());
    reply_error(ApiError(500, fmt::format("internal error: {}", e.what())));
  }
}

void Session::on_read_error(beast::error_code ec) {
  must_close_ = true;  // whatever is left of the request is not read
  if (ec == http::error::body_limit) {
    reply_error(ApiError(413,
                         fmt::format("the request body is larger than this server's limit of {} bytes",
                                     st_.opt.max_body_bytes),
                         std::nullopt, "request_too_large"));
  } else if (ec == http::error::header_limit) {
    reply_error(ApiError(431, fmt::format("the request header is larger than {} bytes", kHeaderLimit)));
  } else if (ec == beast::error::timeout) {
    // basic_stream closed the socket already; a slow client gets no answer, only the close.
    spdlog::debug("serve: dropped a client that sent no complete request in time");
    close("timeout");
  } else if (is_disconnect(ec) || ec == http::error::partial_message) {
    close("client disconnected");
  } else {
    reply_error(ApiError(400, fmt::format("malformed HTTP request: {}", ec.message())));
  }
}

bool Session::authorized() const {
  if (st_.opt.api_key.empty()) return true;
  const auto& req = parser_->get();
  auto it = req.find(http::field::authorization);
  if (it == req.end()) return false;
  std::string_view v(it->value().data(), it->value().size());
  constexpr std::string_view kBearer = "bearer ";
  if (v.size() < kBearer.size() || !beast::iequals(to_beast(v.substr(0, kBearer.size())), to_beast(kBearer)))
    return false;
  v.remove_prefix(kBearer.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return constant_time_equal(v, st_.opt.api_key);
}

void Session::route() {
  const auto& req = parser_->get();
  keep_alive_ = req.keep_alive();
  std::string_view path = ex_.target;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  const auto method = req.method();
  if (path == "/health") {
    if (method != http::verb::get) throw ApiError(405, "/health only answers GET", std::nullopt, "method_not_allowed");
    handle_health();
    return;
  }
  if (!authorized())
    throw ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer YOUR_KEY'", std::nullopt,
                   "invalid_api_key");
  route_authorized(method, path);
}

void Session::route_authorized(http::verb method, std::string_view path) {
  auto want = [&](http::verb v) {
    if (method != v)
      throw ApiError(405, fmt::format("{} only answers {}", path, to_std(http::to_string(v))), std::nullopt,
                     "method_not_allowed");
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    want(http::verb::post);
    begin_generation(path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat);
  } else if (path == "/v1/models") {
    want(http::verb::get);
    reply(200, models_body(st_.opt.model_name, st_.created));
  } else if (path.rfind("/v1/models/", 0) == 0) {
    want(http::verb::get);
    const auto id = path.substr(std::string_view("/v1/models/").size());
    if (id != st_.opt.model_name)
      throw ApiError(404, fmt::format("The model '{}' does not exist", id), "model", "model_not_found");
    reply(200, model_body(st_.opt.model_name, st_.created));
  } else if (path == "/metrics") {
    want(http::verb::get);
    reply(200, st_.metrics.render(st_.queue.stats(), st_.connections.load()), "text/plain; version=0.0.4; charset=utf-8");
  } else {
    throw ApiError(404, fmt::format("Unknown request URL: {} {}", ex_.method, path), std::nullopt, "unknown_url");
  }
}

void Session::handle_health() {
  const auto s = st_.queue.stats();
  nlohmann::json j;
  int status = 503;
  if (s.failed) {
    j = {{"status", "failed"}, {"error", s.failure}};
  } else if (st_.draining || s.draining) {
    j = {{"status", "draining"}};
  } else if (!s.ready) {
    j = {{"status", "loading"}};
  } else {
    j = {{"status", "ok"}};
    status = 200;
  }
  reply(status, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void Session::reply(int status, std::string body, std::string_view content_type, std::string_view allow) {
  // Answer in the client's HTTP version (1.0 or 1.1); a request that never parsed gets 1.1.
  const unsigned version = parser_ && parser_->is_header_done() && parser_->get().version() == 10 ? 10 : 11;
  auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), version);
  res->set(http::field::server, "trellis");
  res->set(http::field::content_type, to_beast(content_type));
  if (!allow.empty()) res->set(http::field::allow, to_beast(allow));
  if (status == 401) res->set(http::field::www_authenticate, "Bearer");
  ex_.keep_alive = keep_alive_ && !must_close_ && !st_.draining;
  res->keep_alive(ex_.keep_alive);
  res->body() = std::move(body);
  res->prepare_payload();
  ex_.status = status;
  st_.metrics.count_response(status);
  if (ex_.generation) count_outcome(status >= 500 ? "failed" : status >= 400 ? "rejected" : "");
  stream_.expires_after(st_.opt.idle_timeout);
  http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
    if (self->closed_) return;
    if (ec) return self->close("client disconnected");
    self->end_exchange();
  });
}

void Session::reply_error(const ApiError& e) {
  std::string_view allow;
  if (e.status() == 405) allow = ex_.target.rfind("/v1/c", 0) == 0 ? "POST" : "GET";
  reply(e.status(), error_body(e), "application/json", allow);
}

void Session::count_outcome(std::string_view outcome) {
  if (ex_.counted || outcome.empty()) return;
  ex_.counted = true;
  st_.metrics.count_request(outcome);
}

void Session::log_exchange() {
  if (ex_.logged || ex_.method.empty()) return;
  ex_.logged = true;
  const double ms = (now_seconds() - ex_.arrival_s) * 1e3;
  if (ex_.generation && gen_)
    spdlog::info("serve: {} {} {} prompt_tokens={} completion_tokens={} {:.1f} ms", ex_.method, ex_.target,
                 ex_.status, gen_->req.request.prompt.size(), gen_->completion_tokens, ms);
  else
    spdlog::info("serve: {} {} {} {:.1f} ms", ex_.method, ex_.target, ex_.status, ms);
}

void Session::end_exchange() {
  log_exchange();
  ++served_;
  if (!ex_.keep_alive) {
    linger_close();
    return;
  }
  if (monitoring_) {
    // The monitor read must end before the next request is read; its handler goes on.
    next_after_monitor_ = true;
    beast::error_code ec;
    stream_.socket().cancel(ec);
    return;
  }
  read_next();
}

void Session::start_monitor() {
  if (closed_ || monitoring_) return;
  monitoring_ = true;
  // No timeout: a generation may run for minutes; writes carry their own.
  stream_.expires_never();
  stream_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code ec, std::size_t n) { self->on_monitor(ec, n); });
}

void Session::on_monitor(beast::error_code ec, std::size_t n) {
  monitoring_ = false;
  buffer_.commit(n);
  if (closed_) return;
  if (next_after_monitor_) {
    next_after_monitor_ = false;
    if (ec && ec != net::error::operation_aborted) return close("client disconnected");
    read_next();
    return;
  }
  if (ec) {
    close("client disconnected");
    return;
  }
  // Bytes of a pipelined next request: keep them for later and go on watching.
  if (buffer_.size() < kMaxPipelined) start_monitor();
}

void Session::linger_close() {
  // Closing a socket with unread input makes the kernel send RST, which can destroy the
  // answer just written before the client reads it (a 413 whose body was not read). So
  // send FIN first and discard input for a moment.
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec || monitoring_) return close("connection closed");
  linger_until_ = Clock::now() + kLinger;
  linger_read();
}

void Session::linger_read() {
  if (closed_) return;
  stream_.expires_at(linger_until_);
  buffer_.clear();
  stream_.async_read_some(buffer_.prepare(kReadChunk), [self = shared_from_this()](beast::error_code ec, std::size_t) {
    if (ec) return self->close("connection closed");
    self->linger_read();
  });
}

void Session::close(const char* why) {
  if (closed_) return;
  closed_ = true;
  retry_timer_.cancel();
  if (gen_ && gen_->open) {
    st_.queue.cancel(gen_->id, why);
    gen_->open = false;
  }
  if (gen_ && !gen_->done) {
    // Abandoned before the answer was complete: 499, as nginx logs a client gone early.
    gen_->done = true;
    if (ex_.status == 0 || ex_.status == 200) ex_.status = 499;
    count_outcome("cancelled");
  }
  if (ex_.status != 0) log_exchange();
  stream_.close();
}

}  // namespace trellis::serve
