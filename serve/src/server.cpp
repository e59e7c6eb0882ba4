// The listener and the io threads; connections themselves live in session.cpp.
#include "trellis/serve/server.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <mutex>
#include <thread>
#include <vector>

#include "session.hpp"
#include "trellis/core/error.hpp"

namespace trellis::serve {
namespace {

// A connection over max_connections: one 503 with an OpenAI error object, then close.
class Refusal : public std::enable_shared_from_this<Refusal> {
 public:
  Refusal(tcp::socket s, std::string response) : stream_(std::move(s)), response_(std::move(response)) {}
  void run() {
    stream_.expires_after(std::chrono::seconds(2));
    net::async_write(stream_, net::buffer(response_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return;
      // FIN, then read what the client sent until it closes, so it reads the 503 rather
      // than a reset.
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->drain();
    });
  }

 private:
  void drain() {
    stream_.async_read_some(net::buffer(sink_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (!ec) self->drain();
    });
  }
  beast::tcp_stream stream_;
  std::string response_;
  std::array<char, 4096> sink_{};
};

std::string refusal_response(int max_connections) {
  const auto body = error_body(ApiError(
      503, fmt::format("the server already has {} open connections, its limit; retry later", max_connections),
      std::nullopt, "too_many_connections"));
  return fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nServer: trellis\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{}",
      body.size(), body);
}

}  // namespace

struct Server::Impl {
  Impl(ServerOptions o, runtime::LiveQueue& q, const TextCodec& c) : state(std::move(o), q, c) {}

  void do_accept() {
    acceptor->async_accept(net::make_strand(*ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
      if (ec) {
        // Out of descriptors and the like: try again shortly instead of spinning.
        spdlog::warn("serve: accept failed: {}", ec.message());
        retry->expires_after(std::chrono::milliseconds(50));
        retry->async_wait([this](beast::error_code e) {
          if (!e) do_accept();
        });
        return;
      }
      on_accept(std::move(socket));
      do_accept();
    });
  }

  void on_accept(tcp::socket socket) {
    try {
      if (state.connections.load() >= state.opt.max_connections) {
        state.metrics.count_response(503);
        spdlog::warn("serve: refused a connection: {} open, the limit", state.opt.max_connections);
        std::make_shared<Refusal>(std::move(socket), refusal_response(state.opt.max_connections))->run();
        return;
      }
      std::make_shared<Session>(std::move(socket), state)->start();
    } catch (const std::exception& e) {
      spdlog::error("serve: cannot start a connection: {}", e.what());
    }
  }

  void run_io() {
    // A handler that throws must not take the whole server down with its thread.
    for (;;) {
      try {
        ioc->run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("serve: io thread: {}", e.what());
      }
    }
  }

  ServerState state;
  std::mutex mu;
  bool started = false, stopped = false;
  int port = 0;
  std::unique_ptr<net::io_context> ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<net::steady_timer> retry;
  std::vector<std::thread> threads;
};

Server::Server(ServerOptions opt, runtime::LiveQueue& queue, const TextCodec& codec)
    : impl_(std::make_unique<Impl>(std::move(opt), queue, codec)) {}

Server::~Server() { stop(); }

namespace {

void check_options(const ServerOptions& o) {
  auto bad = [](const char* what, auto v) {
    throw_error(ErrorCode::kInvalidArgument, "serve: {} is out of range: {}", what, v);
  };
  if (o.port < 0 || o.port > 65535) bad("port", o.port);
  if (o.max_connections < 1) bad("max_connections", o.max_connections);
  if (o.io_threads < 1) bad("io_threads", o.io_threads);
  if (o.default_max_tokens < 1) bad("default_max_tokens", o.default_max_tokens);
  if (o.max_body_bytes < 1) bad("max_body_bytes", o.max_body_bytes);
  for (auto t : {o.header_timeout, o.body_timeout, o.idle_timeout})
    if (t.count() <= 0) bad("a timeout", t.count());
  if (o.queue_wait.count() < 0) bad("queue_wait", o.queue_wait.count());
  if (o.model_name.empty()) throw_error(ErrorCode::kInvalidArgument, "serve: model_name must not be empty");
}

tcp::endpoint resolve(net::io_context& ioc, const std::string& host, int port) {
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (!ec) return {addr, static_cast<unsigned short>(port)};
  tcp::resolver resolver(ioc);
  auto found = resolver.resolve(host, std::to_string(port), ec);
  if (ec || found.empty())
    throw_error(ErrorCode::kIo, "serve: cannot listen on {}:{}: cannot resolve '{}': {}", host, port, host,
                ec ? ec.message() : "no address");
  return found.begin()->endpoint();
}

}  // namespace

void Server::start() {
  auto& m = *impl_;
  std::lock_guard lock(m.mu);
  if (m.started) throw_error(ErrorCode::kInvalidArgument, "serve: Server::start() called twice");
  const auto& o = m.state.opt;
  check_options(o);
  m.ioc = std::make_unique<net::io_context>(o.io_threads);
  const auto ep = resolve(*m.ioc, o.host, o.port);
  try {
    m.acceptor = std::make_unique<tcp::acceptor>(*m.ioc);
    m.acceptor->open(ep.protocol());
    m.acceptor->set_option(net::socket_base::reuse_address(true));
    m.acceptor->bind(ep);
    m.acceptor->listen(net::socket_base::max_listen_connections);
    m.port = m.acceptor->local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    m.acceptor.reset();
    m.ioc.reset();
    throw_error(ErrorCode::kIo, "serve: cannot listen on {}:{}: {}", o.host, o.port, e.code().message());
  }
  m.state.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.retry = std::make_unique<net::steady_timer>(*m.ioc);
  m.work.emplace(m.ioc->get_executor());
  m.do_accept();
  for (int i = 0; i < o.io_threads; ++i) m.threads.emplace_back([&m] { m.run_io(); });
  m.started = true;
  spdlog::info("serve: listening on http://{}:{} (model '{}'{})", o.host, m.port, o.model_name,
               o.api_key.empty() ? ", no API key" : ", API key required");
}

int Server::port() const {
  std::lock_guard lock(impl_->mu);
  return impl_->port;
}

void Server::stop_accepting() {
  if (!impl_->state.draining.exchange(true)) spdlog::info("serve: draining: new requests get 503");
  impl_->state.queue.begin_drain();
}

void Server::stop() {
  auto& m = *impl_;
  std::lock_guard lock(m.mu);
  if (!m.started || m.stopped) return;
  m.stopped = true;
  {
    // From here on no sink posts to the io_context (see SinkGate).
    std::lock_guard gate(m.state.gate->mu);
    m.state.gate->open = false;
  }
  m.work.reset();
  m.ioc->stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  m.retry.reset();
  m.acceptor.reset();
  // Destroying the io_context destroys every pending handler and so every Session: their
  // sockets close and their open requests are cancelled in the queue.
  m.ioc.reset();
  spdlog::info("serve: stopped");
}

std::string Server::metrics_text() const {
  return impl_->state.metrics.render(impl_->state.queue.stats(), impl_->state.connections.load());
}

}  // namespace trellis::serve
