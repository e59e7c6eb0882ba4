// Residual wirings of the communication-reducing variants (see variants.hpp for the math).
#include "trellis/runtime/model/variants.hpp"

#include <cstring>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/ops.hpp"

namespace trellis::runtime {

using kernels::TensorView;

namespace {

struct Name {
  Variant v;
  std::string_view name;
};
constexpr Name kNames[] = {
    {Variant::kStandard, "standard"}, {Variant::kParallel, "parallel"}, {Variant::kLadder, "ladder"},
    {Variant::kDesync2, "desync2"},   {Variant::kDesync4, "desync4"},   {Variant::kLayerParallel, "lp"},
    {Variant::kNoComm, "nocomm"},
};

// Buffers owned by the runner; each is [T, H] f32.
enum Buf { kA, kB, kLocal, kAccum, kCount };

void copy_rows(const TensorView& src, const TensorView& dst) {
  for (std::int64_t r = 0; r < src.rows(); ++r)
    std::memcpy(dst.row_ptr(r), src.row_ptr(r), static_cast<std::size_t>(src.cols()) * sizeof(float));
}

}  // namespace

std::string_view to_string(Variant v) {
  for (const auto& n : kNames)
    if (n.v == v) return n.name;
  return "?";
}

Variant parse_variant(std::string_view name) {
  for (const auto& n : kNames)
    if (n.name == name) return n.v;
  throw_error(ErrorCode::kInvalidArgument,
              "unknown variant '{}' (valid: standard, parallel, ladder, desync2, desync4, lp, nocomm)", name);
}

std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  for (const auto& n : kNames) v.push_back(n.v);
  return v;
}

bool variant_is_exact(Variant v) { return v != Variant::kNoComm; }

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
    if (tp > 1 && (tp % 2 != 0 || cfg.num_heads % (tp / 2) != 0))
      throw_error(ErrorCode::kInvalidArgument,
                  "variant lp at t={} needs t even and the {} attention heads divisible by t/2 (one or more "
                  "ranks per layer of a pair)", tp, cfg.num_heads);
  }
}

VariantRunner::VariantRunner(LlamaModel& model, VariantSpec spec, Millis deadline)
    : m_(model), spec_(spec), deadline_(deadline), bufs_(kCount) {
  if (spec_.range_last < 0) spec_.range_last = model.config().num_layers;
  validate_variant(spec_, model.config(), model.group().size());
}

bool VariantRunner::in_range(int layer) const { return layer >= spec_.range_first && layer < spec_.range_last; }

TensorView VariantRunner::buf(int which, std::int64_t rows) {
  const std::int64_t h = m_.config().hidden_size;
  kernels::Tensor& t = bufs_[static_cast<std::size_t>(which)];
  if (t.numel() < rows * h) t = kernels::Tensor::empty(kernels::DType::kF32, {rows * h});
  return TensorView::matrix(t.view().data, kernels::DType::kF32, rows, h);
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
        pending->wait(Deadline::after(deadline_));
        kernels::add(ctx, x, pending_buf, x);
      }
      pending = m_.all_reduce_async(out);
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
  auto sync = [&] {
    reduce(accum);
    kernels::add(ctx, x, accum, x);
    in_group = 0;
  };
  for (int l = first; l < last; ++l) {
    for (int module = 0; module < 2; ++module) {
      if (in_group == 0) {
        copy_rows(x, local);
        std::memset(accum.data, 0, static_cast<std::size_t>(accum.numel()) * sizeof(float));
      }
      if (module == 0) {
        m_.attention_partial(l, batch, local, out);
      } else {
        m_.mlp_partial(l, local, out);
      }
      kernels::add(ctx, local, out, local);
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
