// Host side of the CUDA ops: turn validated views into launcher arguments, stage host arrays
// (tokens, positions) in the context's scratch, and run matmuls through cuBLASLt or the
// decode GEMV (matmul.cu). Every CUDA/cuBLAS status goes through TRELLIS_CUDA_CHECK.
#include <cmath>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "cuda/state.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: break;
  }
  throw_error(ErrorCode::kUnsupported, "matmul: dtype {} has no cuBLASLt type", to_string(t));
}

}  // namespace

// The largest power of two (<= 256) dividing the address: cuBLASLt's heuristic assumes 256
// unless told, and would pick kernels that fault on a less aligned column slice.
int alignment(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<std::uintptr_t>(al) != 0) al /= 2;
  return al;
}

std::unique_ptr<LtPlan> make_lt_plan(CudaState& s, cudaDataType_t t, std::int64_t m, std::int64_t n, std::int64_t k,
                                     std::int64_t ldw, std::int64_t ldx, std::int64_t ldy, int al_a, int al_b, int al_c) {
  const int g = s.gpu;
  auto plan = std::make_unique<LtPlan>();
  LtPlan& d = *plan;
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T;
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
  TRELLIS_CUDA_CHECK(g, cublasLtMatrixLayoutCreate(&d.a, t, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), ldw));
  TRELLIS_CUDA_CHECK(g, cublasLtMatrixLayoutCreate(&d.b, t, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), ldx));
  TRELLIS_CUDA_CHECK(g, cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), ldy));
  cublasLtMatmulPreference_t pref = nullptr;
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const std::uint64_t ws = s.workspace_bytes;
  const auto aa = static_cast<std::uint32_t>(al_a), ab = static_cast<std::uint32_t>(al_b), ac = static_cast<std::uint32_t>(al_c);
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  TRELLIS_CUDA_CHECK(g, cublasLtMatmulAlgoGetHeuristic(s.lt, d.op, d.a, d.b, d.c, d.c, pref, 1, &result, &found));
  if (found == 0)
    throw_error(ErrorCode::kUnsupported, "matmul: cuBLASLt has no algorithm for M={} N={} K={} (cudaDataType {}) on GPU {}",
                m, n, k, static_cast<int>(t), g);
  d.algo = result.algo;
  return plan;
}

namespace {

// y = x w^T + beta y through cuBLASLt, in its column-major terms: y^T [N, M] = w [K, N]^T x^T,
// i.e. A = w (transposed, "T"), B = x ("N"), C = y^T; row-major leading dimensions carry over.
// x and w have the same type here (ops: x converted to w's type first). The descriptors and
// the heuristic's algorithm are made once per shape and kept (CudaState::plans): making them
// per call cost several microseconds of host time, as much as a prefill GEMM of 128 tokens
// takes on an H100, and left the GPU waiting between launches.
void lt_matmul(CudaState& s, const void* x, std::int64_t ldx, const TensorView& w, const TensorView& y, std::int64_t m,
               float beta) {
  const std::int64_t n = w.rows(), k = w.cols(), ldw = w.row_stride(), ldy = y.row_stride();
  const cudaDataType_t t = cuda_type(w.dtype);
  const int g = s.gpu;
  const int al_a = alignment(w.data), al_b = alignment(x), al_c = alignment(y.data);
  CudaState::GemmKey key{m, n, k, ldw, ldx, ldy, static_cast<int>(t), al_a, al_b, al_c};
  auto it = s.plans.find(key);
  if (it == s.plans.end()) {
    // Bounded: prefill chunks of every length would otherwise keep a plan each forever.
    if (s.plans.size() >= CudaState::kMaxPlans) s.plans.clear();
    it = s.plans.emplace(key, make_lt_plan(s, t, m, n, k, ldw, ldx, ldy, al_a, al_b, al_c)).first;
  }
  const LtPlan& d = *it->second;
  const float alpha = 1.0f;
  TRELLIS_CUDA_CHECK(g, cublasLtMatmul(s.lt, d.op, &alpha, w.data, d.a, x, d.b, &beta, y.data, d.c, y.data, d.c, &d.algo,
                                       s.workspace, s.workspace_bytes, s.stream));
}

void launched(const CudaState& s, cudaError_t e, const char* kernel) { check(e, kernel, s.gpu); }

}  // namespace

void matmul(const Context& ctx, const TensorView& x, const TensorView& w, const TensorView& y, const MatmulOptions& opt) {
  CudaState& s = ctx.cuda_state();
  if (is_quantized(w.dtype))
    throw_error(ErrorCode::kUnsupported,
                "matmul: quantised weight {} is not supported on cuda; convert it to bf16 at load (kernels::convert)",
                w.describe());
  const std::int64_t m = x.rows(), k = x.cols();
  if (m == 0 || w.rows() == 0) return;
  if (k == 0) return filling(s) ? void() : launched(s, launch_scale(mat_of(y), opt.beta, s.stream), "scale_kernel");
  const Mat xm = mat_of(x), wm = mat_of(w), ym = mat_of(y);
  const bool gemv_ok = gemv_supported(xm, wm);
  if (opt.algo == MatmulAlgo::kGemv && !gemv_ok)
    throw_error(ErrorCode::kUnsupported,
                "matmul: the cuda gemv needs f32 x, bf16/f16 weights, K a multiple of 8 and 16-byte aligned rows of x and w "
                "(x {}, w {})",
                x.describe(), w.describe());
  if (gemv_ok && (opt.algo == MatmulAlgo::kGemv || (opt.algo == MatmulAlgo::kAuto && m <= kGemvMaxRows)))
    return filling(s) ? void() : launched(s, launch_gemv(xm, wm, ym, opt.beta, s.stream), "gemv_kernel");
  // x already of w's type (f32, or 16-bit activations a caller rounded): straight to cuBLASLt.
  if (x.dtype == w.dtype) return filling(s) ? void() : lt_matmul(s, x.data, x.row_stride(), w, y, m, opt.beta);
  // 16-bit weights: cuBLASLt wants both inputs of one type, so x is rounded to w's type in
  // the scratch (dense, M x K) first. This is the one place the CUDA result differs from
  // the CPU's beyond summation order (kernels/README.md gives the bound).
  void* xc = scratch(s, dtype_bytes(w.dtype, m * k));
  if (filling(s)) return;
  const Mat dst{xc, static_cast<Elem>(w.dtype), m, k, k};
  launched(s, launch_convert(xm, dst, s.stream), "convert_kernel");
  lt_matmul(s, xc, k, w, y, m, opt.beta);
}

void add_bias(const Context& ctx, const TensorView& y, const TensorView& bias) {
  CudaState& s = ctx.cuda_state();
  if (filling(s)) return;
  launched(s, launch_add_bias(mat_of(y), mat_of(bias), s.stream), "add_bias_kernel");
}

void rms_norm(const Context& ctx, const TensorView& x, const TensorView& weight, float eps, const TensorView& y) {
  CudaState& s = ctx.cuda_state();
  if (filling(s)) return;
  launched(s, launch_rms_norm(mat_of(x), mat_of(weight), eps, mat_of(y), s.stream), "rms_norm_kernel");
}

void swiglu(const Context& ctx, const TensorView& gate, const TensorView& up, const TensorView& out) {
  CudaState& s = ctx.cuda_state();
  if (filling(s)) return;
  launched(s, launch_swiglu(mat_of(gate), mat_of(up), mat_of(out), s.stream), "swiglu_kernel");
}

void add(const Context& ctx, const TensorView& a, const TensorView& b, const TensorView& out) {
  CudaState& s = ctx.cuda_state();
  if (filling(s)) return;
  launched(s, launch_add(mat_of(a), mat_of(b), mat_of(out), s.stream), "add_kernel");
}

void softmax_rows(const Context& ctx, const TensorView& x) {
  CudaState& s = ctx.cuda_state();
  if (filling(s)) return;
  launched(s, launch_softmax_rows(mat_of(x), s.stream), "softmax_kernel");
}

void embedding(const Context& ctx, const TensorView& table, std::span<const std::int32_t> tokens,
               std::int64_t vocab_begin, const TensorView& out) {
  CudaState& s = ctx.cuda_state();
  if (tokens.empty()) return;
  if (s.mode != GraphMode::kOff) s.staging->note_ids(tokens.size());  // upload() stages them at `used`
  const void* ids = upload(s, scratch(s, tokens.size_bytes()), tokens.data(), tokens.size_bytes());
  if (filling(s)) return;
  launched(s, launch_embedding(mat_of(table), static_cast<const std::int32_t*>(ids), vocab_begin, mat_of(out), s.stream),
           "embedding_kernel");
}

void convert(const Context& ctx, const TensorView& src, const TensorView& dst) {
  CudaState& s = ctx.cuda_state();
  if (is_quantized(dst.dtype))
    throw_error(ErrorCode::kUnsupported, "convert: cannot quantise to {} on cuda", dst.describe());
  if (filling(s)) return;
  launched(s, launch_convert(mat_of(src), mat_of(dst), s.stream), "convert_kernel");
}

void apply_rope(const Context& ctx, const RopeTable& table, const TensorView& x, int n_heads,
                std::span<const std::int32_t> positions) {
  CudaState& s = ctx.cuda_state();
  if (positions.empty()) return;
  // The device recomputes the table's values (cos/sin of pos * inv_freq in double, rounded
  // to f32) from inv_freq and the positions: two small uploads instead of the table.
  const std::vector<double> inv = rope_inv_freq(table.config());
  const std::size_t pos_bytes = align_up(positions.size_bytes());
  auto* base = static_cast<std::byte*>(scratch(s, pos_bytes + inv.size() * sizeof(double)));
  const void* pos = upload(s, base, positions.data(), positions.size_bytes());
  const void* freq = upload(s, base + pos_bytes, inv.data(), inv.size() * sizeof(double));
  if (filling(s)) return;
  launched(s,
           launch_rope(mat_of(x), n_heads, table.head_dim(), static_cast<const std::int32_t*>(pos),
                       static_cast<const double*>(freq), s.stream),
           "rope_kernel");
}

}  // namespace trellis::kernels::cuda
