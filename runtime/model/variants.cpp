// Residual wirings of the communication-reducing variants (see variants.hpp for the math).
#include "trellis/runtime/model/variants.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/kernels/progress_hook.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::runtime {

using kernels::TensorView;

namespace {

// Buffers owned by the runner; each is [T, H] f32.
enum Buf { kA, kB, kLocal, kAccum, kCount };

void copy_rows(const TensorView& src, const TensorView& dst) {
  for (std::int64_t r = 0; r < src.rows(); ++r)
    std::memcpy(dst.row_ptr(r), src.row_ptr(r), static_cast<std::size_t>(src.cols()) * sizeof(float));
}

// The group of an lp layer shard: rank r of t/2 for TpLayout, never communicating (the
// pair's reductions go over the whole TP group through the runner).
class LayerShardGroup final : public transport::Group {
 public:
  LayerShardGroup(int rank, int size) : rank_(rank), size_(size), members_{rank} {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return members_; }
  std::string describe() const override { return "lp layer shard"; }
  void all_reduce(void*, std::size_t, transport::DType) override { fail("all-reduce"); }
  transport::RequestPtr all_reduce_async(void*, std::size_t, transport::DType) override { fail("all-reduce"); }
  void broadcast(void*, std::size_t, int) override { fail("broadcast"); }
  void all_gather(const void*, void*, std::size_t) override { fail("all-gather"); }
  void barrier() override { fail("barrier"); }

 private:
  [[noreturn]] static void fail(const char* what) {
    throw_error(ErrorCode::kInternal, "lp layer shard: unexpected {} (its reductions go over the TP group)", what);
  }
  int rank_, size_;
  std::vector<int> members_;
};

}  // namespace

VariantSpec parse_variant_spec(std::string_view name, std::string_view layers, int num_layers) {
  VariantSpec s;
  s.kind = parse_variant(name);
  s.range_first = 0;
  s.range_last = num_layers;
  if (!layers.empty()) {
    auto parts = split(layers, '-');
    if (parts.size() != 2)
      throw_error(ErrorCode::kInvalidArgument, "layer range '{}': expected A-B (inclusive, e.g. 16-31)", layers);
    s.range_first = static_cast<int>(parse_int(parts[0], "layer range start"));
    s.range_last = static_cast<int>(parse_int(parts[1], "layer range end")) + 1;
    if (s.range_first < 0 || s.range_last > num_layers || s.range_first >= s.range_last)
      throw_error(ErrorCode::kInvalidArgument, "layer range '{}' is not inside the model's layers 0-{}", layers,
                  num_layers - 1);
  }
  return s;
}

void validate_variant(const VariantSpec& spec, const ModelConfig& cfg, int tp) {
  int last = spec.range_last < 0 ? cfg.num_layers : spec.range_last;
  if (spec.range_first < 0 || last > cfg.num_layers || spec.range_first >= last)
    throw_error(ErrorCode::kInvalidArgument, "variant {}: layer range [{}, {}) is outside the model's {} layers",
                to_string(spec.kind), spec.range_first, last, cfg.num_layers);
  if (spec.kind == Variant::kLayerParallel) {
    if ((last - spec.range_first) % 2 != 0)
      throw_error(ErrorCode::kInvalidArgument,
                  "variant lp pairs consecutive layers: its range [{}, {}) holds {} layers, which is odd "
                  "(give it a layer range with an even number of layers)", spec.range_first, last, last - spec.range_first);
    // The paper puts one or more ranks on each layer of a pair; heads per rank must divide.
    if (tp > 1 && (tp % 2 != 0 || cfg.num_heads % (tp / 2) != 0 || cfg.num_kv_heads % (tp / 2) != 0 ||
                   cfg.intermediate_size % (tp / 2) != 0))
      throw_error(ErrorCode::kInvalidArgument,
                  "variant lp at t={} places each layer of a pair on t/2 ranks: it needs t even and the {} attention "
                  "heads, {} KV heads and intermediate size {} divisible by t/2 = {}", tp, cfg.num_heads,
                  cfg.num_kv_heads, cfg.intermediate_size, tp / 2);
  }
}

VariantRunner::VariantRunner(LlamaModel& model, VariantSpec spec, Millis deadline, VariantOptions opts)
    : m_(model), spec_(spec), deadline_(deadline), bufs_(kCount), progress_(opts.progress) {
  if (spec_.range_last < 0) spec_.range_last = model.config().num_layers;
  validate_variant(spec_, model.config(), model.group().size());
  if (spec_.kind == Variant::kLayerParallel && model.group().size() > 1 && opts.reader != nullptr) load_lp_shards(opts);
}

VariantRunner::~VariantRunner() = default;

std::vector<int> VariantRunner::lp_pair_starts() const {
  // As run_layers walks the stage: the in-range stretch, paired from its first layer; an odd
  // leftover at a stage edge runs standard.
  std::vector<int> starts;
  const int first = std::max(m_.first_layer(), spec_.range_first), last = std::min(m_.last_layer(), spec_.range_last);
  for (int l = first; l + 1 < last; l += 2) starts.push_back(l);
  return starts;
}

// The paper's placement: TP ranks [0, t/2) take layer k of every pair, [t/2, t) layer k+1,
// each as rank (r mod t/2) of a t/2-way split. The one-layer models never communicate (their
// group only reports rank and size); the pair's all-reduce runs over the whole TP group.
void VariantRunner::load_lp_shards(const VariantOptions& opts) {
  const int t = m_.group().size(), r = m_.group().rank(), half = t / 2;
  lp_shard_group_ = std::make_unique<LayerShardGroup>(r % half, half);
  const int side = r / half;  // 0: first layer of each pair, 1: second
  for (int k : lp_pair_starts()) {
    LoadOptions lo = opts.load;
    lo.first_layer = k + side;
    lo.last_layer = k + side + 1;
    lo.window_bytes = 0;  // their partial sums are reduced through the stage model's group and window
    lp_models_.emplace_back(k, std::make_unique<LlamaModel>(*opts.reader, m_.config(), *lp_shard_group_, m_.context(), lo));
  }
}

std::string_view VariantRunner::lp_placement() const {
  if (spec_.kind != Variant::kLayerParallel) return "";
  if (m_.group().size() == 1) return "single";
  return lp_shard_group_ ? "layer" : "heads";
}

int VariantRunner::lp_layer_held(int pair_first) const {
  for (const auto& [k, model] : lp_models_)
    if (k == pair_first) return model->first_layer();
  return -1;
}

bool VariantRunner::in_range(int layer) const { return layer >= spec_.range_first && layer < spec_.range_last; }

TensorView VariantRunner::buf(int which, std::int64_t rows) {
  // The buffers that get all-reduced live in the model's registered window where it fits (the
  // shm all-reduce then copies nothing): kA and kB alternate in Ladder, kAccum is Desync's sum.
  if (which == kA || which == kB) return m_.reduce_buffer(which == kA ? 0 : 1, rows);
  if (which == kAccum) return m_.reduce_buffer(1, rows);
  const std::int64_t h = m_.config().hidden_size;
  kernels::Tensor& t = bufs_[static_cast<std::size_t>(which)];
  if (t.numel() < rows * h) t = kernels::Tensor::empty(kernels::DType::kF32, {rows * h}, m_.device());
  return TensorView::matrix(t.view().data, kernels::DType::kF32, rows, h, -1, m_.device());
}

void VariantRunner::reduce(const TensorView& t) {
  m_.all_reduce(t);
  ++all_reduces_;
}

void VariantRunner::run_stage(const Batch& batch, const TensorView& x) {
  all_reduces_ = 0;
  if (m_.has_embedding()) m_.embed(batch, x);
  run_layers(batch, x, m_.first_layer(), m_.last_layer());
}

void VariantRunner::run_layers(const Batch& batch, const TensorView& x, int first, int last) {
  int l = first;
  while (l < last) {
    if (!in_range(l) || spec_.kind == Variant::kStandard) {
      m_.standard_layer(l, batch, x);
      all_reduces_ += 2;
      ++l;
      continue;
    }
    // The stretch of consecutive in-range layers inside [first, last).
    int end = l;
    while (end < last && in_range(end)) ++end;
    switch (spec_.kind) {
      case Variant::kParallel:
        for (; l < end; ++l) parallel_layer(batch, x, l);
        break;
      case Variant::kNoComm:
        for (; l < end; ++l) nocomm_layer(batch, x, l);
        break;
      case Variant::kLadder:
        ladder_span(batch, x, l, end);
        l = end;
        break;
      case Variant::kDesync2:
      case Variant::kDesync4:
        desync_span(batch, x, l, end, spec_.kind == Variant::kDesync2 ? 2 : 4);
        l = end;
        break;
      case Variant::kLayerParallel:
        // A pair cut by a stage edge runs its leftover layer as standard.
        for (; l + 1 < end; l += 2) lp_pair(batch, x, l);
        if (l < end) {
          m_.standard_layer(l, batch, x);
          all_reduces_ += 2;
          ++l;
        }
        break;
      case Variant::kStandard:
        break;
    }
  }
}

void VariantRunner::parallel_layer(const Batch& batch, const TensorView& x, int layer) {
  const auto& ctx = m_.context();
  TensorView a = buf(kA, x.rows()), f = buf(kB, x.rows());
  m_.attention_partial(layer, batch, x, a);
  m_.mlp_partial(layer, x, f);
  kernels::add(ctx, a, f, a);
  reduce(a);
  kernels::add(ctx, x, a, x);
}

void VariantRunner::nocomm_layer(const Batch& batch, const TensorView& x, int layer) {
  const auto& ctx = m_.context();
  TensorView p = buf(kA, x.rows());
  m_.attention_partial(layer, batch, x, p);
  kernels::add(ctx, x, p, x);
  m_.mlp_partial(layer, x, p);
  kernels::add(ctx, x, p, x);
}

// Ladder Residual, Algorithm 1: module m computes on x while module m-1's all-reduce is in
// flight, then waits for it and adds its output. Two buffers alternate so the one being
// reduced is never overwritten.
void VariantRunner::ladder_span(const Batch& batch, const TensorView& x, int first, int last) {
  const auto& ctx = m_.context();
  // Cooperative progress: the kernels of the next module test the in-flight all-reduce
  // between their blocks (every ~50 us of GEMM), where a background thread would wait for
  // the scheduler to preempt the GEMM. Installed for this thread only, for the span.
  std::optional<kernels::ScopedProgressHook> hook;
  if (progress_.options().cooperative) hook.emplace(&transport::ProgressThread::poll_hook, &progress_);
  transport::RequestPtr pending;
  TensorView pending_buf;
  int which = kA;
  for (int l = first; l < last; ++l) {
    for (int module = 0; module < 2; ++module) {
      TensorView out = buf(which, x.rows());
      if (module == 0) {
        m_.attention_partial(l, batch, x, out);
      } else {
        m_.mlp_partial(l, x, out);
      }
      if (pending) {
        ++ladder_waits_;
        if (pending->test()) ++ladder_waits_complete_;  // hidden behind this module
        pending->wait(Deadline::after(deadline_));
        kernels::add(ctx, x, pending_buf, x);
      }
      // The progress thread and/or the next module's kernels (cooperative) keep testing it.
      pending = progress_.drive(m_.all_reduce_async(out));
      ++all_reduces_;
      pending_buf = out;
      which = which == kA ? kB : kA;
    }
  }
  if (pending) {
    pending->wait(Deadline::after(deadline_));
    kernels::add(ctx, x, pending_buf, x);
  }
}

// Desynced Residual-nx: modules read a per-rank residual that holds this rank's partial
// outputs; every `group` modules one all-reduce of the summed partials re-synchronises x.
void VariantRunner::desync_span(const Batch& batch, const TensorView& x, int first, int last, int group) {
  const auto& ctx = m_.context();
  TensorView local = buf(kLocal, x.rows()), accum = buf(kAccum, x.rows()), out = buf(kA, x.rows());
  int in_group = 0;
  // A GPU has no memset op: the group's first partial is copied into accum instead of added
  // to zeros (the same sum).
  const bool gpu = m_.device() != kernels::Device::kCpu;
  auto sync = [&] {
    reduce(accum);
    kernels::add(ctx, x, accum, x);
    in_group = 0;
  };
  for (int l = first; l < last; ++l) {
    for (int module = 0; module < 2; ++module) {
      const bool first_in_group = in_group == 0;
      if (first_in_group && gpu) {
        kernels::copy(ctx, x, local);
      } else if (first_in_group) {
        copy_rows(x, local);
        std::memset(accum.data, 0, static_cast<std::size_t>(accum.numel()) * sizeof(float));
      }
      if (module == 0) {
        m_.attention_partial(l, batch, local, out);
      } else {
        m_.mlp_partial(l, local, out);
      }
      kernels::add(ctx, local, out, local);
      if (first_in_group && gpu)
        kernels::copy(ctx, out, accum);
      else
        kernels::add(ctx, accum, out, accum);
      if (++in_group == group) sync();
    }
  }
  if (in_group > 0) sync();  // a group cut by the range or stage edge
}

// Layer Parallelism on the pair (k, k+1): u = x + AR(A_k(x) + A_k+1(x)); x = u + AR(F_k(u) + F_k+1(u)).
void VariantRunner::lp_pair(const Batch& batch, const TensorView& x, int layer) {
  const auto& ctx = m_.context();
  TensorView a = buf(kA, x.rows()), b = buf(kB, x.rows());
  if (lp_shard_group_) {
    // Paper's placement: this rank's partial of its own layer of the pair; the all-reduce
    // over the t ranks sums both layers' shards.
    auto it = std::find_if(lp_models_.begin(), lp_models_.end(), [&](const auto& e) { return e.first == layer; });
    if (it == lp_models_.end())
      throw_error(ErrorCode::kInternal, "lp: no layer shard for the pair starting at layer {} (stage layers [{}, {}))", layer,
                  m_.first_layer(), m_.last_layer());
    LlamaModel& mine = *it->second;
    mine.attention_partial(mine.first_layer(), batch, x, a);
    reduce(a);
    kernels::add(ctx, x, a, x);
    mine.mlp_partial(mine.first_layer(), x, a);
    reduce(a);
    kernels::add(ctx, x, a, x);
    return;
  }
  m_.attention_partial(layer, batch, x, a);
  m_.attention_partial(layer + 1, batch, x, b);
  kernels::add(ctx, a, b, a);
  reduce(a);
  kernels::add(ctx, x, a, x);
  m_.mlp_partial(layer, x, a);
  m_.mlp_partial(layer + 1, x, b);
  kernels::add(ctx, a, b, a);
  reduce(a);
  kernels::add(ctx, x, a, x);
}

}  // namespace trellis::runtime
