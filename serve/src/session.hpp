// Session: one HTTP connection (private to serve/). session.cpp reads requests, routes them
// and writes plain responses; generation.cpp runs a generation request against the queue
// and answers it whole or as Server-Sent Events.
//
// Life cycle: a Session is owned by its pending asynchronous operations (shared_from_this);
// every handler runs on the connection's strand. One request is handled at a time (HTTP/1.1
// keep-alive, no concurrent pipelining). While a generation request waits or runs, a "monitor"
// read stays pending on the socket: it is how a client that goes away is noticed (the read
// ends with EOF or an error), and the request is then cancelled in the queue at once.
#pragma once

// <utility> first: Boost 1.74's asio/awaitable.hpp uses std::exchange without including it.
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server_state.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/serve/openai.hpp"
#include "trellis/serve/text_stream.hpp"

namespace trellis::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// Beast 1.74 has its own string_view (boost::string_view).
inline std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }
inline beast::string_view to_beast(std::string_view s) { return {s.data(), s.size()}; }

// The generation request a connection is serving.
struct Generation {
  Generation(const TextCodec& codec, GenerationRequest g) : req(std::move(g)), text(codec, req.stop) {}
  GenerationRequest req;
  ResponseMeta meta;
  TextStream text;
  std::uint64_t serial = 0;  // tells this request's events from an earlier one's
  std::int64_t id = -1;      // the queue's id once accepted
  bool open = false;         // accepted and not finished in the queue: cancel it if abandoned
  bool done = false;         // the answer is complete (or abandoned); later events are ignored
  std::int64_t completion_tokens = 0;
  double arrival_s = 0, first_token_s = -1, last_token_s = -1;  // core/clock.hpp now_seconds()
  Clock::time_point give_up;      // a full queue is retried until then
  Millis retry_delay{5};
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ServerState& st);
  ~Session();
  void start();

 private:
  // What one request/response exchange was, for the log line.
  struct Exchange {
    std::string method, target;
    double arrival_s = 0;
    int status = 0;
    bool keep_alive = false;   // the response keeps the connection open
    bool generation = false;   // a generation route: counted in requests_total
    bool counted = false, logged = false;
  };

  // ---- connection: session.cpp ----
  void read_next();
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void on_read_error(beast::error_code ec);
  void route();
  void route_authorized(http::verb method, std::string_view path);
  bool authorized() const;
  void handle_health();
  void reply(int status, std::string body, std::string_view content_type = "application/json",
             std::string_view allow = {});
  void reply_error(const ApiError& e);
  void end_exchange();
  void count_outcome(std::string_view outcome);
  void log_exchange();
  void start_monitor();
  void on_monitor(beast::error_code ec, std::size_t n);
  void linger_close();
  void linger_read();
  // Closes the socket; a request still open in the queue is cancelled with `why`.
  void close(const char* why);

  // ---- generation: generation.cpp ----
  void begin_generation(Endpoint ep);
  void try_submit();
  runtime::LiveSink make_sink();
  void on_event(std::uint64_t serial, const runtime::LiveEvent& e);
  void on_tokens(const runtime::LiveEvent& e);
  void complete(std::string_view finish_reason);
  void fail(const ApiError& e);
  void start_stream();
  void end_stream();
  void send_event(const std::string& json);
  void send_chunk(std::string_view data);
  void flush();
  void on_flushed(beast::error_code ec);

  ServerState& st_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  net::steady_timer retry_timer_;
  Exchange ex_;
  std::unique_ptr<Generation> gen_;
  std::uint64_t serial_ = 0;
  int served_ = 0;             // exchanges completed on this connection
  bool keep_alive_ = false;    // the client allows keep-alive
  bool must_close_ = false;    // the request was not read whole: close after the answer
  bool closed_ = false;
  bool monitoring_ = false;    // the monitor read is pending
  bool next_after_monitor_ = false;
  // Streaming: bytes waiting to be written and bytes being written.
  std::string out_pending_, out_inflight_;
  bool writing_ = false, stream_done_ = false;
  bool chunked_ = true;  // HTTP/1.1 chunked body (HTTP/1.0: raw, ended by close)
  Clock::time_point linger_until_;
};

}  // namespace trellis::serve
