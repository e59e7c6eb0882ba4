// The last stage's logits (synchronous, or two-phase on a GPU: StageCompute::start_logits)
// on their way to the sampler, and the sampled tokens on their way back to rank 0.
#include "engine_class.hpp"

namespace trellis::runtime::detail {

void Engine::send_tokens(std::int64_t iteration, const SamplerStage& st, const std::vector<std::int32_t>& tokens) {
  TokensMsg m;
  m.iteration = iteration;
  m.tokens = tokens;
  m.cand_tokens = st.candidate_tokens();
  m.cand_probs = st.candidate_probs();
  if (opt_.serving) {  // the last stage's shares, for the server's /metrics
    const double wall = std::max(1e-9, now_seconds() - engine_start_s_);
    auto sh = rank_shares(trace_, wall);
    m.has_shares = true;
    m.busy = sh.busy_s / wall;
    m.comm = sh.comm_s / wall;
    m.wait = sh.wait_s / wall;
  }
  if (rank_ == 0) {
    tokens_q_.push(std::move(m));
    return;
  }
  std::vector<std::byte> msg;
  pack_tokens(m, msg);
  std::lock_guard lock(token_send_mu_);
  while (!token_sends_.empty() && token_sends_.front().second->test()) token_sends_.pop_front();
  token_sends_.emplace_back(std::move(msg), nullptr);
  auto& back = token_sends_.back();
  Tracer::Span span(trace_, opt_.cpu_sampler ? Lane::kSampler : Lane::kForward, TraceCat::kSend, "send tokens",
                    iteration, 0);
  back.second = links_.link(0).isend(back.first, kTagTokens);
}

void Engine::last_stage_output(const StageInput& in, const float* x, std::int64_t it) {
  finish_pending_logits();  // iterations reach the sampler in order
  const int B = in.logit_rows(), V = stage_.vocab_end() - stage_.vocab_begin();
  auto& cols = lcols_[it & 1];
  // Only prefill chunks that are not a prompt's last: no logits. The sampler (which knows it
  // from the same scheduling output) still answers with an empty token list, so rank 0 hears
  // that the iteration completed.
  if (B == 0) {
    wait_logits_send(it);
    cols.clear();
    if (rank_ != sampler_rank_) return;
    if (opt_.cpu_sampler) local_logits_q_.push(cols);
    else send_tokens(in.iteration, *inline_sampler_, inline_sampler_->run(in, cols.data()));
    return;
  }
  if (deferred_logits_) {
    // GPU: enqueue the LM head and the copy to pinned memory; the rows are collected after
    // the next forward is enqueued (forward_executor), or before this thread blocks.
    Tracer::Span span(trace_, Lane::kForward, TraceCat::kForward, "lm head", in.iteration);
    stage_.start_logits(in, x, static_cast<int>(it & 1));
    pending_logits_ = PendingLogits{it, in.iteration, B};
    return;
  }
  wait_logits_send(it);
  {
    Tracer::Span span(trace_, Lane::kForward, TraceCat::kForward, "lm head", in.iteration);
    lrows_.resize(static_cast<std::size_t>(B) * static_cast<std::size_t>(V));
    stage_.logits(in, x, lrows_.data());
    cols.resize(lrows_.size());
    transpose_to_columns(lrows_.data(), B, V, cols.data());
  }
  deliver_logits(it, in.iteration, &in);
}

void Engine::wait_logits_send(std::int64_t it) {
  if (logits_req_[it & 1])
    wait_request(*logits_req_[it & 1], deadline(), failed_, fmt::format("rank {}: logits send", rank_));
}

void Engine::finish_pending_logits() {
  if (!pending_logits_) return;
  const PendingLogits p = *pending_logits_;
  pending_logits_.reset();
  const int V = stage_.vocab_end() - stage_.vocab_begin();
  wait_logits_send(p.it);
  auto& cols = lcols_[p.it & 1];
  {
    Tracer::Span span(trace_, Lane::kForward, TraceCat::kRecv, "logits to host", p.iteration);
    const float* rows = stage_.finish_logits(static_cast<int>(p.it & 1));
    cols.resize(static_cast<std::size_t>(p.rows) * static_cast<std::size_t>(V));
    transpose_to_columns(rows, p.rows, V, cols.data());
  }
  deliver_logits(p.it, p.iteration, nullptr);
}

void Engine::deliver_logits(std::int64_t it, std::int64_t iteration, const StageInput* in) {
  auto& cols = lcols_[it & 1];
  if (rank_ == sampler_rank_) {
    if (opt_.cpu_sampler) {
      local_logits_q_.push(cols);  // a copy: the sampler owns it while this buffer is refilled
    } else {
      const auto& toks = inline_sampler_->run(*in, cols.data());
      send_tokens(iteration, *inline_sampler_, toks);
    }
    return;
  }
  Tracer::Span span(trace_, Lane::kForward, TraceCat::kSend, "send logits", iteration, sampler_rank_);
  logits_req_[it & 1] = links_.link(sampler_rank_).isend(std::as_bytes(std::span(cols)), kTagLogits);
  if (!opt_.cpu_sampler)  // naive PP: the last stage waits for its logits to be consumed
    wait_request(*logits_req_[it & 1], deadline(), failed_, fmt::format("rank {}: logits send", rank_));
}

}  // namespace trellis::runtime::detail
