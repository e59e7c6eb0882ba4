// Device-agnostic entry points: check every operand (device, dtype, shape) and name the one
// that is wrong, then dispatch to the backend of the context's device: cpu/ or cuda/ (the
// latter throws "not built" in a build without CUDA, where no CUDA context can exist).
#include "trellis/kernels/ops.hpp"

#include <cstring>

#include "cpu/cpu_ops.hpp"
#include "cuda/cuda_ops.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

// The matrix form of `v`, after checking it lives on the context's device.
TensorView mat(const Context& ctx, const char* op, const TensorView& v) {
  ctx.check_device(op, v);
  if (v.data == nullptr && v.numel() > 0) throw_error(ErrorCode::kInvalidArgument, "{}: {} has no data", op, v.describe());
  return v.as_matrix();
}

void need_f32(const char* op, const TensorView& v) {
  if (v.dtype != DType::kF32) throw_error(ErrorCode::kInvalidArgument, "{}: {} must be f32", op, v.describe());
}

void same_shape(const char* op, const TensorView& a, const TensorView& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    throw_error(ErrorCode::kInvalidArgument, "{}: {} and {} differ in shape", op, a.describe(), b.describe());
}

bool on_cuda(const Context& ctx) { return ctx.device() == Device::kCuda; }
bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// The operands of an element-wise out = f(a, b): matrices of one shape, f32, on ctx's device.
struct Elementwise {
  TensorView a, b, out;
};
Elementwise elementwise(const Context& ctx, const char* op, const TensorView& a, const TensorView& b,
                        const TensorView& out, bool out_16bit_ok = false) {
  Elementwise e{mat(ctx, op, a), mat(ctx, op, b), mat(ctx, op, out)};
  need_f32(op, e.a);
  need_f32(op, e.b);
  if (!(out_16bit_ok && is_16bit(e.out.dtype))) need_f32(op, e.out);
  same_shape(op, e.a, e.b);
  same_shape(op, e.a, e.out);
  return e;
}

}  // namespace

void matmul(const Context& ctx, const TensorView& x, const TensorView& w, const TensorView& y,
            const MatmulOptions& opt) {
  const char* op = "matmul";
  TensorView a = mat(ctx, op, x), b = mat(ctx, op, w), c = mat(ctx, op, y);
  // On CUDA, activations already in the weight's 16-bit type go to cuBLASLt as they are.
  if (!(on_cuda(ctx) && a.dtype == b.dtype && (a.dtype == DType::kBF16 || a.dtype == DType::kF16))) need_f32(op, a);
  need_f32(op, c);
  if (a.cols() != b.cols())
    throw_error(ErrorCode::kInvalidArgument, "matmul: input {} has {} columns but weight {} has {} (weights are [out, in])",
                a.describe(), a.cols(), b.describe(), b.cols());
  if (c.rows() != a.rows() || c.cols() != b.rows())
    throw_error(ErrorCode::kInvalidArgument, "matmul: output {} should be [{}, {}] for input {} and weight {}",
                c.describe(), a.rows(), b.rows(), a.describe(), b.describe());
  if (opt.algo == MatmulAlgo::kGemv && a.rows() > cpu::kGemvMaxRows && !ctx.batch_invariant())
    throw_error(ErrorCode::kInvalidArgument, "matmul: the gemv algorithm takes at most {} rows; input {} has {}",
                cpu::kGemvMaxRows, a.describe(), a.rows());
  if (opt.algo == MatmulAlgo::kOnednnBf16 && !on_cuda(ctx) && b.dtype != DType::kBF16)
    throw_error(ErrorCode::kInvalidArgument, "matmul: the oneDNN bf16 algorithm needs bf16 weights; weight {} is {}",
                b.describe(), to_string(b.dtype));
  if (is_quantized(b.dtype) && (b.cols() % 32 != 0 || b.row_stride() % 32 != 0))
    throw_error(ErrorCode::kInvalidArgument, "matmul: quantised weight {} must have whole 32-element blocks per row",
                b.describe());
  if (on_cuda(ctx)) return cuda::matmul(ctx, a, b, c, opt);
  if (a.rows() == 0 || b.rows() == 0) return;
  if (a.cols() == 0) {  // an empty sum: y = beta * y (BLAS rejects K = 0 with lda = 0)
    for (std::int64_t r = 0; r < c.rows(); ++r) {
      auto* row = static_cast<float*>(c.row_ptr(r));
      for (std::int64_t j = 0; j < c.cols(); ++j) row[j] = opt.beta == 0.0f ? 0.0f : opt.beta * row[j];
    }
    return;
  }
  cpu::GemmArgs g;
  g.m = a.rows();
  g.n = b.rows();
  g.k = a.cols();
  g.a = a.ptr<const float>();
  g.lda = a.row_stride();
  g.b = b.data;
  g.b_type = b.dtype;
  g.ldb = b.row_stride();
  g.c = c.ptr<float>();
  g.ldc = c.row_stride();
  g.beta = opt.beta;
  if (is_quantized(b.dtype)) {
    cpu::quant_matmul(ctx.pool(), g);  // one algorithm: llama.cpp's arithmetic, whatever opt.algo says
    return;
  }
  // Batch invariance: the small-M arithmetic for every M (cpu::gemv_invariant).
  if (ctx.batch_invariant() && (opt.algo == MatmulAlgo::kAuto || opt.algo == MatmulAlgo::kGemv))
    return cpu::gemv_invariant(ctx.pool(), g);
  cpu::matmul(ctx.pool(), g, opt.algo);
}

void add_bias(const Context& ctx, const TensorView& y, const TensorView& bias) {
  TensorView c = mat(ctx, "add_bias", y), b = mat(ctx, "add_bias", bias);
  need_f32("add_bias", c);
  if (b.rows() != 1 || b.cols() != c.cols())
    throw_error(ErrorCode::kInvalidArgument, "add_bias: bias {} should be a vector of {}", b.describe(), c.cols());
  if (on_cuda(ctx)) return cuda::add_bias(ctx, c, b);
  cpu::add_bias(ctx.pool(), c, b);
}

void rms_norm(const Context& ctx, const TensorView& x, const TensorView& weight, float eps, const TensorView& y) {
  TensorView a = mat(ctx, "rms_norm", x), w = mat(ctx, "rms_norm", weight), o = mat(ctx, "rms_norm", y);
  need_f32("rms_norm", a);
  if (!(on_cuda(ctx) && is_16bit(o.dtype))) need_f32("rms_norm", o);
  same_shape("rms_norm", a, o);
  if (w.rows() != 1 || w.cols() != a.cols())
    throw_error(ErrorCode::kInvalidArgument, "rms_norm: weight {} should be a vector of {}", w.describe(), a.cols());
  if (!(eps >= 0)) throw_error(ErrorCode::kInvalidArgument, "rms_norm: eps must be >= 0 (got {})", eps);
  if (on_cuda(ctx)) return cuda::rms_norm(ctx, a, w, eps, o);
  cpu::rms_norm(ctx.pool(), a, w, eps, o);
}

void swiglu(const Context& ctx, const TensorView& gate, const TensorView& up, const TensorView& out) {
  const Elementwise e = elementwise(ctx, "swiglu", gate, up, out, /*out_16bit_ok=*/on_cuda(ctx));
  if (on_cuda(ctx)) return cuda::swiglu(ctx, e.a, e.b, e.out);
  cpu::swiglu(ctx.pool(), e.a, e.b, e.out);
}

void add(const Context& ctx, const TensorView& a, const TensorView& b, const TensorView& out) {
  const Elementwise e = elementwise(ctx, "add", a, b, out);
  if (on_cuda(ctx)) return cuda::add(ctx, e.a, e.b, e.out);
  cpu::add(ctx.pool(), e.a, e.b, e.out);
}

void softmax_rows(const Context& ctx, const TensorView& x) {
  TensorView m = mat(ctx, "softmax_rows", x);
  need_f32("softmax_rows", m);
  if (on_cuda(ctx)) return cuda::softmax_rows(ctx, m);
  cpu::softmax_rows(ctx.pool(), m);
}

void embedding(const Context& ctx, const TensorView& table, std::span<const std::int32_t> tokens,
               std::int64_t vocab_begin, const TensorView& out) {
  TensorView t = mat(ctx, "embedding", table), o = mat(ctx, "embedding", out);
  need_f32("embedding", o);
  if (o.rows() != static_cast<std::int64_t>(tokens.size()) || o.cols() != t.cols())
    throw_error(ErrorCode::kInvalidArgument, "embedding: output {} should be [{}, {}] for table {}", o.describe(),
                tokens.size(), t.cols(), t.describe());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0)
      throw_error(ErrorCode::kInvalidArgument, "embedding: token {} at index {} is negative (table {})", tokens[i], i,
                  t.describe());
  if (on_cuda(ctx)) return cuda::embedding(ctx, t, tokens, vocab_begin, o);
  cpu::embedding(ctx.pool(), t, tokens, vocab_begin, o);
}

void convert(const Context& ctx, const TensorView& src, const TensorView& dst) {
  TensorView s = mat(ctx, "convert", src), d = mat(ctx, "convert", dst);
  same_shape("convert", s, d);
  if (is_quantized(d.dtype))
    throw_error(ErrorCode::kUnsupported, "convert: cannot convert to the block type of {}", d.describe());
  if (is_quantized(s.dtype) && (s.cols() % 32 != 0 || s.row_stride() % 32 != 0))
    throw_error(ErrorCode::kInvalidArgument, "convert: quantised {} must have whole 32-element blocks per row",
                s.describe());
  if (on_cuda(ctx)) return cuda::convert(ctx, s, d);
  cpu::convert(ctx.pool(), s, d);
}

void copy(const Context& ctx, const TensorView& src, const TensorView& dst) {
  const char* op = "copy";
  if (!on_cuda(ctx)) {  // a CPU context copies host memory only: refuse a GPU operand by name
    ctx.check_device(op, src);
    ctx.check_device(op, dst);
  }
  for (const TensorView* v : {&src, &dst})
    if (v->data == nullptr && v->numel() > 0) throw_error(ErrorCode::kInvalidArgument, "copy: {} has no data", v->describe());
  TensorView s = src.as_matrix(), d = dst.as_matrix();
  same_shape(op, s, d);
  if (s.dtype != d.dtype)
    throw_error(ErrorCode::kInvalidArgument, "copy: {} and {} differ in dtype (convert changes types)", s.describe(),
                d.describe());
  if (on_cuda(ctx)) return cuda::copy(ctx, s, d);
  const std::size_t width = dtype_bytes(s.dtype, s.cols());
  for (std::int64_t r = 0; r < s.rows(); ++r) std::memmove(d.row_ptr(r), s.row_ptr(r), width);
}

}  // namespace trellis::kernels
