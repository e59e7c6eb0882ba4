// A generation request on one connection: parse, submit to the LiveQueue (retrying a full
// queue on a timer), turn token events into text (stop strings, UTF-8), and answer with one
// JSON object or a stream of Server-Sent Events.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "session.hpp"

namespace trellis::serve {
namespace {

constexpr Millis kMaxRetryDelay{50};

std::int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

void Session::begin_generation(Endpoint ep) {
  ex_.generation = true;
  const auto stats = st_.queue.stats();
  if (st_.draining || stats.draining)
    throw ApiError(503, "the server is shutting down and takes no new requests", std::nullopt, "server_shutting_down");
  if (stats.failed) throw ApiError(503, fmt::format("the engine failed: {}", stats.failure), std::nullopt, "engine_failed");
  const auto limits = st_.queue.limits();
  if (!stats.ready || !limits)
    throw ApiError(503, "the engine is still loading the model; retry once GET /health says ok", std::nullopt,
                   "model_loading");
  ParseContext ctx;
  ctx.model_name = st_.opt.model_name;
  ctx.vocab_size = st_.codec.vocab_size();
  ctx.max_context = limits->max_context;
  ctx.default_max_tokens = st_.opt.default_max_tokens;
  ctx.default_seed = st_.random_seed();
  auto parsed = parse_generation(ep, parser_->get().body(), st_.codec, ctx);
  parser_->get().body().clear();
  parser_->get().body().shrink_to_fit();

  gen_ = std::make_unique<Generation>(st_.codec, std::move(parsed));
  auto& g = *gen_;
  g.serial = ++serial_;
  g.meta.endpoint = ep;
  g.meta.id = st_.response_id(ep);
  g.meta.created = unix_seconds();
  g.meta.model = st_.opt.model_name;
  g.req.request.name = g.meta.id;  // the engine's logs and traces then name the response id
  g.arrival_s = ex_.arrival_s;
  g.give_up = Clock::now() + st_.opt.queue_wait;
  start_monitor();
  try_submit();
}

runtime::LiveSink Session::make_sink() {
  // Runs on the engine's scheduler thread: only hand the event to the connection's strand.
  // The Session is held weakly (a sink lives as long as the queue keeps it), and the gate
  // keeps posts away from an io_context that Server::stop() is tearing down.
  std::weak_ptr<Session> weak = weak_from_this();
  return [gate = st_.gate, weak, serial = gen_->serial](const runtime::LiveEvent& e) {
    std::lock_guard lock(gate->mu);
    if (!gate->open) return;
    auto self = weak.lock();
    if (!self) return;
    auto ex = self->stream_.get_executor();
    net::post(ex, [self = std::move(self), serial, e]() {
      try {
        self->on_event(serial, e);
      } catch (const std::exception& err) {
        spdlog::error("serve: {} {}: {}", self->ex_.method, self->ex_.target, err.what());
        self->close("server error");
      }
    });
  };
}

void Session::try_submit() {
  if (closed_ || !gen_ || gen_->done) return;
  auto& g = *gen_;
  runtime::Request r = g.req.request;  // a copy: a full queue is retried with it
  const auto sub = st_.queue.submit(std::move(r), make_sink());
  using Admit = runtime::LiveQueue::Admit;
  switch (sub.status) {
    case Admit::kAccepted:
      g.id = sub.id;
      g.open = true;
      if (g.req.stream) start_stream();
      return;
    case Admit::kFull: {
      const auto now = Clock::now();
      if (now >= g.give_up)
        return fail(ApiError(429,
                             fmt::format("the engine is busy: its queue stayed full for {} ms ({})",
                                         st_.opt.queue_wait.count(), sub.reason),
                             std::nullopt, "rate_limit_exceeded", "rate_limit_error"));
      retry_timer_.expires_after(std::min<Clock::duration>(g.retry_delay, g.give_up - now));
      g.retry_delay = std::min(kMaxRetryDelay, g.retry_delay * 2);
      retry_timer_.async_wait([self = shared_from_this(), serial = g.serial](beast::error_code ec) {
        if (ec || !self->gen_ || self->gen_->serial != serial) return;
        self->try_submit();
      });
      return;
    }
    case Admit::kRejected:
      return fail(ApiError(400, sub.reason, g.req.endpoint == Endpoint::kChat ? "messages" : "prompt",
                           "context_length_exceeded"));
    case Admit::kStopping:
      return fail(ApiError(503, sub.reason, std::nullopt, "server_shutting_down"));
    case Admit::kNotReady:
      return fail(ApiError(503, sub.reason, std::nullopt, "model_loading"));
    case Admit::kFailed:
      return fail(ApiError(503, fmt::format("the engine failed: {}", sub.reason), std::nullopt, "engine_failed"));
  }
}

void Session::on_event(std::uint64_t serial, const runtime::LiveEvent& e) {
  if (closed_ || !gen_ || gen_->serial != serial) return;  // an earlier request's late event
  auto& g = *gen_;
  if (e.finished) g.open = false;
  if (g.done) return;
  if (!e.tokens.empty()) on_tokens(e);
  if (g.done || !e.finished) return;
  if (e.failed) {
    fail(ApiError(500, fmt::format("the engine failed while generating: {}", e.finish_reason), std::nullopt,
                  "engine_failed"));
  } else if (e.finish_reason == "stop" || e.finish_reason == "length") {
    complete(e.finish_reason);
  } else {
    fail(ApiError(503, fmt::format("the request was cancelled: {}", e.finish_reason), std::nullopt, "cancelled"));
  }
}

void Session::on_tokens(const runtime::LiveEvent& e) {
  auto& g = *gen_;
  const double t = e.time_s > 0 ? e.time_s : now_seconds();
  if (g.first_token_s < 0) {
    g.first_token_s = t;
    st_.metrics.observe_ttft(std::max(0.0, t - g.arrival_s));
  }
  g.last_token_s = t;
  g.completion_tokens += static_cast<std::int64_t>(e.tokens.size());
  const std::string piece = g.text.push(e.tokens);
  if (g.req.stream && !piece.empty()) send_event(chunk_body(g.meta, nullptr, &piece, "", g.req.include_usage));
  if (g.text.stopped()) {
    // Free the engine's slot and KV at once rather than after max_tokens.
    st_.queue.cancel(g.id, "stop");
    g.open = false;
    complete("stop");
  }
}

void Session::complete(std::string_view reason) {
  auto& g = *gen_;
  g.done = true;
  const std::string rest = g.text.finish();
  if (g.completion_tokens >= 2 && g.last_token_s > g.first_token_s)
    st_.metrics.observe_tpot((g.last_token_s - g.first_token_s) / static_cast<double>(g.completion_tokens - 1));
  count_outcome(reason);
  const Usage usage{static_cast<std::int64_t>(g.req.request.prompt.size()), g.completion_tokens};
  if (!g.req.stream) {
    reply(200, response_body(g.meta, g.text.text(), reason, usage));
    return;
  }
  const bool u = g.req.include_usage;
  if (!rest.empty()) send_event(chunk_body(g.meta, nullptr, &rest, "", u));
  const std::string empty;
  send_event(chunk_body(g.meta, nullptr, g.meta.endpoint == Endpoint::kChat ? nullptr : &empty, reason, u));
  if (u) send_event(usage_chunk_body(g.meta, usage));
  end_stream();
}

void Session::fail(const ApiError& e) {
  auto& g = *gen_;
  g.done = true;
  if (g.open) {
    st_.queue.cancel(g.id, "failed");
    g.open = false;
  }
  if (!g.req.stream || g.id < 0) {
    // Nothing sent yet: a plain error response with its status.
    reply_error(e);
    return;
  }
  // The 200 header is out: the error travels as an event, as OpenAI's streams do.
  spdlog::warn("serve: {} {}: {}", ex_.method, ex_.target, e.what());
  count_outcome(e.status() >= 500 ? "failed" : "rejected");
  send_event(error_body(e));
  end_stream();
}

void Session::end_stream() {
  send_chunk("data: [DONE]\n\n");
  if (chunked_) out_pending_ += "0\r\n\r\n";  // the last chunk of the chunked body
  stream_done_ = true;
  flush();
}

void Session::start_stream() {
  auto& g = *gen_;
  ex_.status = 200;
  // HTTP/1.0 has no chunked encoding: the stream is the raw body, ended by closing.
  chunked_ = parser_->get().version() >= 11;
  ex_.keep_alive = chunked_ && keep_alive_ && !st_.draining;
  st_.metrics.count_response(200);
  out_pending_ += fmt::format(
      "HTTP/1.{} 200 OK\r\nServer: trellis\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "X-Accel-Buffering: no\r\n{}Connection: {}\r\n\r\n",
      chunked_ ? 1 : 0, chunked_ ? "Transfer-Encoding: chunked\r\n" : "", ex_.keep_alive ? "keep-alive" : "close");
  if (g.meta.endpoint == Endpoint::kChat) {
    // OpenAI's first chat chunk names the role, with empty content.
    const std::string role = "assistant", empty;
    send_event(chunk_body(g.meta, &role, &empty, "", g.req.include_usage));
  }
  flush();
}

void Session::send_event(const std::string& json) { send_chunk("data: " + json + "\n\n"); }

void Session::send_chunk(std::string_view data) {
  if (!chunked_) {
    out_pending_.append(data);
  } else {
    out_pending_ += fmt::format("{:x}\r\n", data.size());
    out_pending_.append(data);
    out_pending_ += "\r\n";
  }
  flush();
}

void Session::flush() {
  if (writing_ || closed_ || out_pending_.empty()) return;
  writing_ = true;
  out_inflight_.swap(out_pending_);
  out_pending_.clear();
  // A client that stops reading blocks the write; it gets idle_timeout to read again.
  stream_.expires_after(st_.opt.idle_timeout);
  net::async_write(stream_, net::buffer(out_inflight_),
                   [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_flushed(ec); });
}

void Session::on_flushed(beast::error_code ec) {
  writing_ = false;
  out_inflight_.clear();
  if (closed_) return;
  if (ec) return close("client disconnected");
  if (!out_pending_.empty()) return flush();
  if (stream_done_) {
    stream_done_ = false;
    end_exchange();
  }
}

}  // namespace trellis::serve
