// Test-only pieces for driving the engine without MPI and without the real model:
//  * InProcHub / InProcTransport: ranks as threads of one process, messages as copies in
//    per-(source, destination, tag) FIFO queues — the Link contract, nothing more.
//  * StandInStage: a deterministic stand-in "model" (NOT a language model and never used
//    outside tests) whose output depends on every earlier token of a sequence through a
//    per-slot state, so wrong slots, positions, ordering or hand-offs change the tokens. It
//    splits its layers across stages and its vocabulary across TP ranks like the real one.
#pragma once

#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/engine.hpp"

namespace trellis::test {

class InProcHub {
 public:
  struct Recv {
    std::span<std::byte> buf;
    std::shared_ptr<std::atomic<std::size_t>> done;  // bytes + 1 when complete
  };
  void send(int src, int dst, std::uint32_t tag, std::span<const std::byte> data) {
    std::lock_guard lock(mu_);
    auto& q = queues_[{src, dst, tag}];
    if (!q.posted.empty()) {
      deliver(q.posted.front(), data);
      q.posted.pop_front();
    } else {
      q.messages.emplace_back(data.begin(), data.end());
    }
  }
  std::shared_ptr<std::atomic<std::size_t>> recv(int src, int dst, std::uint32_t tag, std::span<std::byte> buf) {
    std::lock_guard lock(mu_);
    Recv r{buf, std::make_shared<std::atomic<std::size_t>>(0)};
    auto& q = queues_[{src, dst, tag}];
    if (!q.messages.empty()) {
      deliver(r, q.messages.front());
      q.messages.pop_front();
    } else {
      q.posted.push_back(r);
    }
    return r.done;
  }
  // Withdraws a receive that has not completed, as destroying a real link's request does
  // (transport/request.hpp): its buffer may be freed next (a thread that failed and unwound).
  void cancel(int src, int dst, std::uint32_t tag, const std::shared_ptr<std::atomic<std::size_t>>& done) {
    std::lock_guard lock(mu_);
    auto& posted = queues_[{src, dst, tag}].posted;
    for (auto it = posted.begin(); it != posted.end(); ++it)
      if (it->done == done) {
        posted.erase(it);
        return;
      }
  }

 private:
  static void deliver(const Recv& r, std::span<const std::byte> data) {
    if (data.size() > r.buf.size())
      throw_error(ErrorCode::kCorruptInput, "in-proc link: message of {} bytes into a {}-byte receive", data.size(),
                  r.buf.size());
    if (!data.empty()) std::memcpy(r.buf.data(), data.data(), data.size());
    r.done->store(data.size() + 1);
  }
  struct Queue {
    std::deque<std::vector<std::byte>> messages;
    std::deque<Recv> posted;
  };
  std::mutex mu_;
  std::map<std::tuple<int, int, std::uint32_t>, Queue> queues_;
};

class InProcRequest final : public transport::Request {
 public:
  InProcRequest(InProcHub& hub, int src, int dst, std::uint32_t tag, std::span<std::byte> buf, std::string what)
      : hub_(hub), src_(src), dst_(dst), tag_(tag), done_(hub.recv(src, dst, tag, buf)), what_(std::move(what)) {}
  ~InProcRequest() override {
    if (done_->load() == 0) hub_.cancel(src_, dst_, tag_, done_);
  }
  bool test() override { return done_->load() != 0; }
  std::size_t bytes() const override { return done_->load() - 1; }
  std::string describe() const override { return what_; }

 private:
  InProcHub& hub_;
  int src_, dst_;
  std::uint32_t tag_;
  std::shared_ptr<std::atomic<std::size_t>> done_;
  std::string what_;
};

class InProcLink final : public transport::Link {
 public:
  InProcLink(InProcHub& hub, int self, int peer) : hub_(hub), self_(self), peer_(peer) {}
  int peer() const override { return peer_; }
  transport::Backend backend() const override { return transport::Backend::kShm; }
  transport::RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) override {
    hub_.send(self_, peer_, tag, data);
    return transport::make_completed_request(data.size(), "in-proc send");
  }
  transport::RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) override {
    return std::make_unique<InProcRequest>(hub_, peer_, self_, tag, data,
                                           fmt::format("in-proc receive from rank {} tag {}", peer_, tag));
  }

 private:
  InProcHub& hub_;
  int self_, peer_;
};

class InProcTransport final : public transport::Transport {
 public:
  InProcTransport(InProcHub& hub, int self) : hub_(hub), self_(self) {}
  transport::Backend backend() const override { return transport::Backend::kShm; }
  transport::Capabilities capabilities() const override { return {}; }
  transport::Link& link(int peer) override {
    auto& l = links_[peer];
    if (!l) l = std::make_unique<InProcLink>(hub_, self_, peer);
    return *l;
  }
  void progress() override {}

 private:
  InProcHub& hub_;
  int self_;
  std::map<int, std::unique_ptr<InProcLink>> links_;
};

// The stand-in: hidden size 8, `layers` layers split over the stages, vocabulary split in
// ceil(V/t) chunks. Per slot and layer a running state mixes in every token seen.
class StandInStage final : public runtime::StageCompute {
 public:
  static constexpr int kHidden = 8;
  StandInStage(int vocab, int layers, int pp, int stage, int tp, int k, int slots)
      : vocab_(vocab), stage_(stage), pp_(pp) {
    first_layer_ = layers * stage / pp;
    last_layer_ = layers * (stage + 1) / pp;
    int chunk = (vocab + tp - 1) / tp;
    vb_ = std::min(vocab, k * chunk);
    ve_ = std::min(vocab, (k + 1) * chunk);
    state_.assign(static_cast<std::size_t>(slots * layers * kHidden), 0.0f);
    len_.assign(static_cast<std::size_t>(slots), 0);
    layers_ = layers;
  }
  int hidden_size() const override { return kHidden; }
  int vocab_size() const override { return vocab_; }
  int vocab_begin() const override { return vb_; }
  int vocab_end() const override { return ve_; }
  void forward(const runtime::StageInput& in, float* x, runtime::Tracer& trace) override {
    int row = 0;
    for (int q = 0; q < in.n_seqs(); ++q) {
      int slot = in.slots[static_cast<std::size_t>(q)];
      auto& len = len_[static_cast<std::size_t>(slot)];
      if (in.fresh[static_cast<std::size_t>(q)]) {
        len = 0;
        std::fill_n(state_.begin() + slot * layers_ * kHidden, layers_ * kHidden, 0.0f);
      }
      if (in.starts[static_cast<std::size_t>(q)] != len)
        throw_error(ErrorCode::kInternal, "stand-in stage {}: slot {} holds {} tokens, iteration {} starts at {}",
                    stage_, slot, len, in.iteration, in.starts[static_cast<std::size_t>(q)]);
      for (int j = 0; j < in.lengths[static_cast<std::size_t>(q)]; ++j, ++row) {
        float* h = x + row * kHidden;
        if (stage_ == 0) {
          auto t = in.tokens[static_cast<std::size_t>(row)];
          for (int d = 0; d < kHidden; ++d) h[d] = std::sin(0.37f * static_cast<float>(t) + 1.3f * static_cast<float>(d));
        }
        for (int l = first_layer_; l < last_layer_; ++l) {
          float* s = &state_[static_cast<std::size_t>((slot * layers_ + l) * kHidden)];
          for (int d = 0; d < kHidden; ++d) {
            s[d] = 0.6f * s[d] + h[d];
            h[d] = std::tanh(h[d] + 0.5f * s[(d + 1) % kHidden] * (1.0f + 0.1f * static_cast<float>(l)) +
                             0.01f * static_cast<float>(in.positions[static_cast<std::size_t>(row)]));
          }
        }
      }
      len += in.lengths[static_cast<std::size_t>(q)];
    }
    trace.record(runtime::Lane::kForward, runtime::TraceCat::kBlock, "block", now_ns(), now_ns(), in.iteration,
                 first_layer_);
  }
  // Two-phase logits as a GPU stage has them (StageCompute::start_logits): start computes the
  // rows into a "device" buffer of its slot, finish "copies" them to the slot's "pinned" rows.
  // Misuse the engine could make is an error naming it: a slot started twice without a
  // finish, a finish with no start, finishes out of start order.
  void set_async_logits(bool on) { async_ = on; }
  bool logits_async() const override { return async_; }
  void start_logits(const runtime::StageInput& in, const float* x, int slot) override {
    auto& s = slots_.at(static_cast<std::size_t>(slot));
    if (s.started)
      throw_error(ErrorCode::kInternal, "stand-in stage {}: logits slot {} started again before its finish", stage_, slot);
    s.device.assign(static_cast<std::size_t>(in.logit_rows() * (ve_ - vb_)), 0.0f);
    logits(in, x, s.device.data());
    s.started = true;
    s.order = ++started_;
  }
  const float* finish_logits(int slot) override {
    auto& s = slots_.at(static_cast<std::size_t>(slot));
    if (!s.started) throw_error(ErrorCode::kInternal, "stand-in stage {}: finish of logits slot {} with no start", stage_, slot);
    if (s.order != finished_ + 1)
      throw_error(ErrorCode::kInternal, "stand-in stage {}: logits finished out of order ({} after {})", stage_, s.order,
                  finished_);
    finished_ = s.order;
    s.started = false;
    s.pinned = s.device;
    ++async_finishes_;
    return s.pinned.data();
  }
  int async_finishes() const { return async_finishes_; }

  void logits(const runtime::StageInput& in, const float* x, float* out) override {
    int row = -1, out_row = 0;
    const int V = ve_ - vb_;
    for (int q = 0; q < in.n_seqs(); ++q) {
      row += in.lengths[static_cast<std::size_t>(q)];
      if (!in.sampled.empty() && in.sampled[static_cast<std::size_t>(q)] == 0) continue;  // a prefill chunk
      const int o = out_row++;
      const float* h = x + row * kHidden;
      for (int v = vb_; v < ve_; ++v) {
        float z = 0;
        for (int d = 0; d < kHidden; ++d) z += h[d] * std::cos(0.11f * static_cast<float>(v * (d + 3)));
        out[o * V + (v - vb_)] = 3.0f * z;
      }
    }
  }

 private:
  struct Slot {
    std::vector<float> device, pinned;
    bool started = false;
    long order = 0;
  };
  bool async_ = false;
  std::array<Slot, 2> slots_{};
  long started_ = 0, finished_ = 0;
  int async_finishes_ = 0;
  int vocab_, stage_, pp_, first_layer_ = 0, last_layer_ = 0, layers_ = 0, vb_ = 0, ve_ = 0;
  std::vector<float> state_;
  std::vector<int> len_;
};

}  // namespace trellis::test
