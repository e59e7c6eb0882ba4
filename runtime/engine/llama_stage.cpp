#include "trellis/runtime/engine/llama_stage.hpp"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include <spdlog/spdlog.h>

#include "trellis/core/error.hpp"
#include "trellis/kernels/async_copy.hpp"
#include "trellis/kernels/graph.hpp"
#include "trellis/kernels/ops.hpp"

namespace trellis::runtime {
namespace {

class LlamaStage final : public StageCompute {
 public:
  explicit LlamaStage(LlamaModel& m) : m_(m) {}
  ~LlamaStage() override {
    if (captures_ > 0)
      spdlog::info("cuda graphs: {} captured, {} replays, over {} batch sizes (layers {}-{}); {} of the replays filled "
                   "while the step before ran ({} fills guessed wrong)",
                   captures_, replays_, graphs_.size(), m_.first_layer(), m_.last_layer() - 1, prefilled_launches_,
                   prefills_ - prefilled_launches_);
  }
  LlamaStage(LlamaModel& m, const VariantSpec& v, Millis deadline, VariantOptions opts, LlamaStageOptions so)
      : m_(m), graphs_on_(so.cuda_graphs), prefill_on_(so.cuda_graphs && so.graph_prefill) {
    if (v.kind != Variant::kStandard) runner_.emplace(m, v, deadline, std::move(opts));
    if (v.kind == Variant::kLayerParallel)
      spdlog::info("lp placement: {} (layer: each layer of a pair on its own half of the TP ranks, as the paper; "
                   "heads: both layers split over all ranks)",
                   runner_->lp_placement());
  }
  int hidden_size() const override { return static_cast<int>(m_.config().hidden_size); }
  int vocab_size() const override { return static_cast<int>(m_.config().vocab_size); }
  int vocab_begin() const override { return static_cast<int>(m_.layout().vocab_begin); }
  int vocab_end() const override { return static_cast<int>(m_.layout().vocab_end); }

  void forward(const StageInput& in, float* x, Tracer& trace) override {
    fill_batch(in);
    if (!moves_.empty()) {
      Tracer::Span span(trace, Lane::kForward, TraceCat::kBlock, "kv moves", in.iteration);
      m_.move_kv(moves_);
    }
    const auto H = m_.config().hidden_size;
    const auto host = kernels::TensorView::matrix(x, kernels::DType::kF32, in.n_tokens(), H);
    auto xv = host;
    if (on_device()) {
      xv = device_buffer(dx_, in.n_tokens(), H);
      dx_rows_ = in.n_tokens();
      // With a device hand-off in, the engine has already enqueued the copy into dx_.
      if (!m_.has_embedding() && !device_in_) {
        Tracer::Span span(trace, Lane::kForward, TraceCat::kRecv, "hidden to device", in.iteration);
        kernels::copy(m_.context(), host, xv);
      }
    }
    if (!(graphable(in) && graph_forward(in, xv, trace))) {
      graphed_last_ = false;
      if (auto* g = std::exchange(guessed_, nullptr)) g->drop_prefill();
      eager_layers(in, xv, trace);
    }
    if (on_device() && !m_.has_lm_head() && !device_out_) {
      // The host path of the stage hand-off: the next stage's sender reads host memory.
      Tracer::Span span(trace, Lane::kForward, TraceCat::kSend, "hidden to host", in.iteration);
      kernels::copy(m_.context(), xv, host);
    }
  }

  void logits(const StageInput& in, const float* x, float* out) override {
    fill_batch(in);
    const auto H = m_.config().hidden_size;
    const auto V = m_.layout().vocab_local();
    const int rows = in.logit_rows();
    auto ov = kernels::TensorView::matrix(out, kernels::DType::kF32, rows, V);
    if (rows == 0) return;
    if (!on_device()) {
      auto xv = kernels::TensorView::matrix(x, kernels::DType::kF32, in.n_tokens(), H);
      m_.local_logits(batch_, xv, ov);
      return;
    }
    if (dx_rows_ != in.n_tokens())
      throw_error(ErrorCode::kInternal, "logits() for {} tokens after a forward() of {} on the GPU", in.n_tokens(),
                  dx_rows_);
    // Synchronous device -> host copy (the inline sampler reads `out` at once); with the CPU
    // sampler the engine takes the two-phase path below instead.
    const auto dv = device_buffer(dlogits_[0], rows, V);
    m_.local_logits(batch_, device_buffer(dx_, in.n_tokens(), H), dv);
    kernels::copy(m_.context(), dv, ov);
  }

  // GPU: the LM head into this slot's device buffer, then a copy into pinned memory on the
  // copy stream, ordered after it by an event (kernels::Download). The next forward, which
  // the engine enqueues before finish_logits, writes the other slot's buffer and dx_ after
  // this LM head in stream order, so nothing the copy reads changes under it.
  bool logits_async() const override { return on_device(); }
  void start_logits(const StageInput& in, const float* x, int slot) override {
    (void)x;  // on a GPU the hidden state is dx_, left by forward()
    fill_batch(in);
    const auto H = m_.config().hidden_size;
    const auto V = m_.layout().vocab_local();
    if (dx_rows_ != in.n_tokens())
      throw_error(ErrorCode::kInternal, "start_logits() for {} tokens after a forward() of {} on the GPU", in.n_tokens(),
                  dx_rows_);
    const auto dv = device_buffer(dlogits_[slot & 1], in.logit_rows(), V);
    m_.local_logits(batch_, device_buffer(dx_, in.n_tokens(), H), dv);
    if (!download_) download_ = std::make_unique<kernels::Download>(m_.context(), 2);
    download_->start(slot & 1, dv);
  }
  const float* finish_logits(int slot) override { return static_cast<const float*>(download_->wait(slot & 1)); }

  int cuda_gpu() const override { return m_.device() == kernels::Device::kCuda ? m_.context().gpu() : -1; }
  void* cuda_stream() const override { return on_device() ? m_.context().cuda_stream() : nullptr; }
  void set_device_hidden_io(bool in, bool out) override {
    device_in_ = in;
    device_out_ = out;
  }
  void* device_hidden(int rows) override {
    if (!on_device()) return nullptr;
    return device_buffer(dx_, rows, m_.config().hidden_size).data;
  }

  // The guess: the batch of the step just enqueued with every sequence one token further
  // (what a decode step after a decode step is unless the scheduler changed the batch), its
  // tokens left as they were (launch_prefilled writes the real ones in).
  void prepare_next(Tracer& trace) override {
    if (!prefill_on_ || !graphed_last_) return;
    graphed_last_ = false;  // one guess per step
    guess_ = batch_;
    for (auto& c : guess_.seqs)
      if ((c.start_pos += c.n_tokens) + c.n_tokens > m_.kv_capacity()) return;  // it ends instead
    const auto rows = guess_.total_tokens();
    auto it = graphs_.find(rows);
    if (it == graphs_.end()) return;
    GraphPair& pair = it->second;
    auto& g = pair.graph[flip_];
    const auto xv = device_buffer(dx_, rows, m_.config().hidden_size);
    if (!g || !g->captured() || buffers(xv) != pair.fingerprint[flip_]) return;
    Tracer::Span span(trace, Lane::kForward, TraceCat::kPrep, "graph prefill", -1, m_.first_layer());
    if (!g->prefill([&] { body(guess_, xv); })) return;
    guessed_ = g.get();
    ++prefills_;
  }

 private:
  // The model's batch description, rebuilt from the prepared input (small integer copies;
  // the input itself is what token-safe execution double-buffers).
  void fill_batch(const StageInput& in) {
    if (filled_for_ == in.iteration && filled_for_ >= 0) return;
    batch_.tokens.assign(in.tokens.begin(), in.tokens.end());
    batch_.seqs.resize(in.slots.size());
    for (std::size_t i = 0; i < in.slots.size(); ++i) {
      SeqChunk& c = batch_.seqs[i];
      c = SeqChunk{in.slots[i], in.starts[i], in.lengths[i], in.sampled[i] != 0};
      if (i < in.candidates.size()) {
        c.every_logit = in.candidates[i] != 0;
        if (in.tree_offsets[i] >= 0) {
          const auto* p = in.parents.data() + in.tree_offsets[i];
          c.parents.assign(p, p + in.lengths[i]);
          c.kv_pos = in.kv_pos[i];
          c.prefix = in.prefix[i];
        }
      }
    }
    batch_.all_logits = false;
    batch_.skip.assign(in.skip.begin(), in.skip.end());
    moves_.clear();
    for (const auto& m : in.moves) moves_.push_back(KvMove{m.slot, m.src, m.dst, m.count});
    filled_for_ = in.iteration;
  }

  bool on_device() const { return m_.device() != kernels::Device::kCpu; }

  // The embedding (stage 0) and this stage's layers, op by op.
  void eager_layers(const StageInput& in, const kernels::TensorView& xv, Tracer& trace) {
    if (m_.has_embedding()) {
      Tracer::Span span(trace, Lane::kForward, TraceCat::kBlock, "embed", in.iteration);
      m_.embed(batch_, xv);
    }
    if (runner_) {
      // A variant rewires the residual across layers (ladder keeps a reduction in flight
      // from one layer into the next), so the stage's layers are one span.
      Tracer::Span span(trace, Lane::kForward, TraceCat::kBlock, "layers", in.iteration, m_.first_layer());
      runner_->run_layers(batch_, xv, m_.first_layer(), m_.last_layer());
      return;
    }
    for (int l = m_.first_layer(); l < m_.last_layer(); ++l) {
      Tracer::Span span(trace, Lane::kForward, TraceCat::kBlock, "block", in.iteration, l);
      m_.standard_layer(l, batch_, xv);
    }
  }

  // CUDA graphs (kernels/graph.hpp) for the decode forward of a GPU stage: every sequence one
  // token, the standard wiring, no skip set or KV moves, one TP rank (a TP all-reduce goes
  // through host memory, which a graph cannot hold).
  bool graphable(const StageInput& in) const {
    if (!graphs_on_ || !on_device() || runner_ || m_.tp_size() != 1 || !batch_.skip.empty() || !moves_.empty())
      return false;
    for (const auto& c : batch_.seqs)
      if (c.n_tokens != 1 || !c.parents.empty() || c.every_logit) return false;
    return in.n_tokens() > 0;
  }

  // One pair of graphs per batch size, used in turn (SiPipe's double graphs: the host fills
  // one's inputs while the GPU may still run the other's). A size is captured the second time
  // it comes (a size seen once, while a batch fills up, is not worth a capture); a graph whose
  // buffers moved (a larger batch grew the scratch) is captured again. False: not run (the
  // caller runs the ops eagerly).
  bool graph_forward(const StageInput& in, const kernels::TensorView& xv, Tracer& trace) {
    kernels::OpGraph* guessed = std::exchange(guessed_, nullptr);
    GraphPair& pair = graphs_[in.n_tokens()];
    if (++pair.seen < 2) {
      if (guessed) guessed->drop_prefill();
      return false;
    }
    const int slot = flip_;
    flip_ ^= 1;
    graphed_last_ = true;
    auto& g = pair.graph[slot];
    if (!g) g = std::make_unique<kernels::OpGraph>(m_.context());
    Tracer::Span span(trace, Lane::kForward, TraceCat::kBlock, "graph", in.iteration, m_.first_layer());
    const std::size_t expected = pair.fingerprint[slot];
    if (guessed) {
      // The fill made during the last step stands for this one when everything it staged
      // (positions, slots, cache lengths: all from the sequences) is what this step would
      // stage; only the token ids differ, and launch_prefilled writes those in.
      if (guessed == g.get() && same_sequences(guess_, batch_) && buffers(xv) == expected) {
        if (m_.has_embedding()) m_.check_tokens(batch_.tokens);
        if (g->launch_prefilled(m_.has_embedding() ? std::span<const std::int32_t>(batch_.tokens)
                                                   : std::span<const std::int32_t>())) {
          ++replays_;
          ++prefilled_launches_;
          return true;
        }
      }
      guessed->drop_prefill();
    }
    auto run_body = [&] { body(batch_, xv); };
    // The graph holds the addresses of the model's scratch and of x: both must be the
    // allocations it was captured with, before the fill and after it (a fill may not grow
    // them).
    if (g->captured() && buffers(xv) == expected && g->replay(run_body, [&] { return buffers(xv) == expected; })) {
      ++replays_;
    } else {
      g->capture(run_body);
      pair.fingerprint[slot] = buffers(xv);
      ++captures_;
    }
    return true;
  }
  // What a graph runs: the embedding (stage 0) and this stage's layers.
  void body(const Batch& b, const kernels::TensorView& xv) {
    if (m_.has_embedding()) m_.embed(b, xv);
    for (int l = m_.first_layer(); l < m_.last_layer(); ++l) m_.standard_layer(l, b, xv);
  }
  // Serials, not addresses, of the model's scratch and of x: a reallocation can return the
  // same address.
  std::size_t buffers(const kernels::TensorView& xv) const {
    return (m_.scratch_fingerprint() * 1000003u ^ std::hash<std::uint64_t>{}(dx_.serial())) * 1000003u ^
           std::hash<const void*>{}(xv.data);
  }
  // Whether two graphable batches stage the same graph inputs but for their token ids.
  static bool same_sequences(const Batch& a, const Batch& b) {
    if (a.seqs.size() != b.seqs.size() || a.tokens.size() != b.tokens.size() || a.skip != b.skip) return false;
    for (std::size_t i = 0; i < a.seqs.size(); ++i) {
      const SeqChunk &x = a.seqs[i], &y = b.seqs[i];
      if (x.slot != y.slot || x.start_pos != y.start_pos || x.n_tokens != y.n_tokens || x.logits != y.logits ||
          x.every_logit != y.every_logit || !x.parents.empty() || !y.parents.empty())
        return false;
    }
    return true;
  }
  // A [rows, cols] f32 view of a grow-only device tensor.
  kernels::TensorView device_buffer(kernels::Tensor& t, std::int64_t rows, std::int64_t cols) {
    if (t.numel() < rows * cols) t = kernels::Tensor::empty(kernels::DType::kF32, {rows * cols}, m_.device());
    return kernels::TensorView::matrix(t.view().data, kernels::DType::kF32, rows, cols, -1, m_.device());
  }

  struct GraphPair {
    int seen = 0;
    std::unique_ptr<kernels::OpGraph> graph[2];
    std::size_t fingerprint[2] = {0, 0};
  };

  LlamaModel& m_;
  bool graphs_on_ = false, prefill_on_ = false;
  // graph prefill (prepare_next): the guessed batch and the graph filled with it; whether the
  // last forward ran as a graph (only then is the next step guessed)
  Batch guess_;
  kernels::OpGraph* guessed_ = nullptr;
  bool graphed_last_ = false;
  std::int64_t prefills_ = 0, prefilled_launches_ = 0;
  std::map<std::int64_t, GraphPair> graphs_;
  int flip_ = 0;
  std::int64_t captures_ = 0, replays_ = 0;
  kernels::Tensor dx_, dlogits_[2];  // GPU models: the stage's hidden state and logits (per slot)
  std::unique_ptr<kernels::Download> download_;
  std::int64_t dx_rows_ = -1;
  bool device_in_ = false, device_out_ = false;  // stage hand-off on the device (set_device_hidden_io)
  std::optional<VariantRunner> runner_;
  Batch batch_;
  std::vector<KvMove> moves_;
  std::int64_t filled_for_ = -1;
};

class TimedRequest final : public transport::Request {
 public:
  TimedRequest(transport::RequestPtr inner, Tracer& t) : inner_(std::move(inner)), t_(t) {}
  bool test() override {
    if (done_) return true;
    auto start = now_ns();
    done_ = inner_->test();
    if (done_) t_.record(Lane::kForward, TraceCat::kAllReduce, "all-reduce", start, now_ns());
    return done_;
  }
  std::size_t bytes() const override { return inner_->bytes(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  transport::RequestPtr inner_;
  Tracer& t_;
  bool done_ = false;
};

class TimedGroup final : public transport::Group {
 public:
  TimedGroup(transport::Group& g, Tracer& t) : g_(g), t_(t) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  const std::vector<int>& members() const override { return g_.members(); }
  std::string describe() const override { return g_.describe(); }
  void all_reduce(void* data, std::size_t count, transport::DType dtype) override {
    Tracer::Span span(t_, Lane::kForward, TraceCat::kAllReduce, "all-reduce");
    g_.all_reduce(data, count, dtype);
  }
  transport::RequestPtr all_reduce_async(void* data, std::size_t count, transport::DType dtype) override {
    return std::make_unique<TimedRequest>(g_.all_reduce_async(data, count, dtype), t_);
  }
  void broadcast(void* data, std::size_t bytes, int root) override { g_.broadcast(data, bytes, root); }
  void all_gather(const void* in, void* out, std::size_t bytes) override { g_.all_gather(in, out, bytes); }
  void barrier() override { g_.barrier(); }
  std::span<std::byte> allocate_window(std::size_t bytes) override { return g_.allocate_window(bytes); }

 private:
  transport::Group& g_;
  Tracer& t_;
};

}  // namespace

std::unique_ptr<StageCompute> make_llama_stage(LlamaModel& model) { return std::make_unique<LlamaStage>(model); }

std::unique_ptr<StageCompute> make_llama_stage(LlamaModel& model, const VariantSpec& variant, Millis deadline,
                                               VariantOptions opts, LlamaStageOptions stage) {
  return std::make_unique<LlamaStage>(model, variant, deadline, std::move(opts), stage);
}

std::unique_ptr<transport::Group> make_timed_group(transport::Group& inner, Tracer& trace) {
  return std::make_unique<TimedGroup>(inner, trace);
}

}  // namespace trellis::runtime
