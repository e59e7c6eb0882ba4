// What every connection of one Server shares (private to serve/).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "trellis/runtime/engine/live.hpp"
#include "trellis/serve/metrics.hpp"
#include "trellis/serve/openai.hpp"
#include "trellis/serve/server.hpp"
#include "trellis/serve/text_codec.hpp"

namespace trellis::serve {

// The queue's sinks run on the engine's scheduler thread and may outlive the Server (the
// queue keeps a sink until its request's final event). Each sink posts to its connection
// only while the gate is open, under its mutex; Server::stop() closes the gate before the
// io_context goes away, so no sink ever touches a destroyed io_context.
struct SinkGate {
  std::mutex mu;
  bool open = true;
};

struct ServerState {
  ServerState(ServerOptions o, runtime::LiveQueue& q, const TextCodec& c)
      : opt(std::move(o)), queue(q), codec(c), rng_(std::random_device{}()) {}

  const ServerOptions opt;
  runtime::LiveQueue& queue;
  const TextCodec& codec;
  ServeMetrics metrics;
  std::shared_ptr<SinkGate> gate = std::make_shared<SinkGate>();
  std::atomic<bool> draining{false};
  std::atomic<int> connections{0};
  std::int64_t created = 0;  // Unix seconds at start(): the model's "created"

  // "cmpl-..." / "chatcmpl-...": random, so ids differ across restarts too.
  std::string response_id(Endpoint ep) {
    std::lock_guard lock(mu_);
    return fmt::format("{}-{:016x}{:08x}", ep == Endpoint::kChat ? "chatcmpl" : "cmpl", rng_(), ++serial_);
  }
  // The seed of a request that names none (OpenAI: a fresh draw each time).
  std::uint64_t random_seed() {
    std::lock_guard lock(mu_);
    return rng_();
  }

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
  std::uint32_t serial_ = 0;
};

}  // namespace trellis::serve
