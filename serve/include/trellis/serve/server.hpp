// Server: the OpenAI-compatible HTTP front end of `trellis serve` (Boost.Beast on Asio).
// It knows HTTP and JSON, not MPI: requests become runtime::Requests submitted to a
// LiveQueue, and the queue's token events come back as responses or Server-Sent Events.
//
// Routes:
//   POST /v1/completions, POST /v1/chat/completions   generation; "stream": true answers
//        with SSE chunks ("data: {json}\n\n" ... "data: [DONE]\n\n"), see openai.hpp
//   GET  /v1/models, GET /v1/models/{id}               the one model served
//   GET  /health     200 {"status":"ok"} once the engine is ready; 503 with "loading",
//                    "draining" or "failed" (and "error") otherwise. Never needs a key.
//   GET  /metrics    Prometheus text format 0.0.4 (metrics.hpp)
// Errors are OpenAI error objects with a 4xx/5xx status (openai.hpp's ApiError): 400 for
// an invalid request naming the field, 401 for a missing or wrong API key, 404 for an
// unknown path or model, 405 for a wrong method, 413 for a body over max_body_bytes, 429
// when the engine's queue stays full for queue_wait, 503 while loading, draining, failed or
// over max_connections.
//
// Behaviour worth knowing:
//  * A queue that is full is retried on a timer (no thread blocks) until queue_wait passes.
//  * Stop strings are matched on the server: the text is cut before the match, the request
//    finishes with "stop" and is cancelled in the queue (reason "stop") so its KV is freed.
//  * A client that goes away (socket closed or broken) while its request waits or runs gets
//    its request cancelled at once (reason "client disconnected").
//  * Timeouts: header_timeout to read a request header (from the connection's start, or from
//    the first byte of a keep-alive request), body_timeout for the body, idle_timeout
//    between keep-alive requests and for each write to a client that does not read.
//  * Every request is logged at info level in one line: method, path, status, tokens, time.
//
// Threading: the public members may be called from any thread, but stop() (and so the
// destructor) must not run on one of the server's own io threads. `queue` and `codec` must
// outlive the Server. The queue's sinks only post events to the connection's strand; they
// never block the engine's scheduler thread, and they are safe to run after the Server is
// gone (they then drop the event).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "trellis/runtime/engine/live.hpp"
#include "trellis/serve/text_codec.hpp"

namespace trellis::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // bind address (security default: loopback only)
  int port = 8000;                 // 0: any free port (tests); port() tells which
  std::string api_key;             // non-empty: every route but /health needs "Authorization: Bearer KEY"
  std::string model_name;          // the id in /v1/models and the only accepted "model" value
  std::size_t max_body_bytes = 1 << 20;
  int max_connections = 64;        // beyond it a new connection gets 503 and is closed
  std::chrono::milliseconds header_timeout{10000}, body_timeout{30000}, idle_timeout{60000};
  std::chrono::milliseconds queue_wait{2000};  // how long a request waits for room in a full queue before 429
  int default_max_tokens = 256;    // when the request gives none (capped by the context)
  int io_threads = 1;
};

class Server {
 public:
  Server(ServerOptions opt, runtime::LiveQueue& queue, const TextCodec& codec);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts the io threads; returns at once. trellis::Error kIo naming
  // host:port when it cannot bind (port taken, address not local); kInvalidArgument for bad
  // options or a second start().
  void start();
  int port() const;  // the bound port (after start)
  // SIGTERM: from now on generation requests get 503 with an error object, /health answers
  // 503 "draining", responses close their connection; requests already running go on to the
  // end. Also calls queue.begin_drain(). Idempotent.
  void stop_accepting();
  // Closes every connection (open requests are cancelled in the queue) and joins the io
  // threads. Idempotent.
  void stop();
  // What GET /metrics returns.
  std::string metrics_text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::serve
