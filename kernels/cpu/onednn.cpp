// oneDNN (Debian's libdnnl 2.6, OpenMP runtime) as a prefill GEMM: y = x w^T + beta y through
// its matmul primitive, which on AVX-512 CPUs is a JIT brgemm kernel ("brg:avx512_core").
// Measured against ours and OpenBLAS in docs/benchmarks.md ("Prefill GEMM: ours, OpenBLAS
// and oneDNN"); the matmul primitive was 15-30% faster than dnnl_sgemm, its other f32 entry.
//
// The weights [N, K] row-major are oneDNN's K x N "weights" with strides {1, ldb}, so no copy
// is made for f32; x and y keep their row strides. beta != 0 is a sum post-op.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/kernels/progress_hook.hpp"

namespace trellis::kernels::cpu {
namespace {

using DnnlType = dnnl::memory::data_type;

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Everything a primitive is specialised for: oneDNN bakes shapes, strides, the post-op's
// scale and the thread count (read at creation; always 1 here, see run()) into it.
struct Key {
  std::int64_t m, n, k, lda, ldb, ldc;
  DnnlType a_type, b_type;
  float beta;
  int threads;
  auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, a_type, b_type, beta, threads); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Descs {
  dnnl::memory::desc a, b, c;
};

Descs descs(const Key& key) {
  using Dims = dnnl::memory::dims;
  return {{{key.m, key.k}, key.a_type, Dims{key.lda, 1}},
          {{key.k, key.n}, key.b_type, Dims{1, key.ldb}},
          {{key.m, key.n}, DnnlType::f32, Dims{key.ldc, 1}}};
}

dnnl::matmul create(const Key& key) {
  const Descs d = descs(key);
  dnnl::primitive_attr attr;
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(d.a, d.b, d.c), attr, engine()));
}

// oneDNN's own primitive cache would find a primitive again too, but only after a primitive
// descriptor has been made (tens of microseconds); this is a map lookup. A dnnl::matmul is
// a reference-counted handle, so the copy returned stays valid if the map is cleared.
dnnl::matmul primitive(const Key& key) {
  static std::mutex mu;
  static std::map<Key, dnnl::matmul> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 512) cache.clear();  // prefill lengths vary: bound what is kept
  return cache.emplace(key, create(key)).first->second;
}

// One single-threaded matmul with A of a_type (f32 or bf16) and B of b_type at g's pointers.
void run_one(const GemmArgs& g, DnnlType a_type, DnnlType b_type) {
  const Key key{g.m, g.n, g.k, g.lda, g.ldb, g.ldc, a_type, b_type, g.beta, 1};
  try {
    dnnl::matmul mm = primitive(key);
    thread_local dnnl::stream stream(engine());
    const Descs d = descs(key);
    dnnl::memory a(d.a, engine(), const_cast<float*>(g.a));
    dnnl::memory b(d.b, engine(), const_cast<void*>(g.b));
    dnnl::memory c(d.c, engine(), g.c);
    mm.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw_error(e.status == dnnl_unimplemented ? ErrorCode::kUnsupported : ErrorCode::kInternal,
                "matmul: oneDNN {} matmul [{}, {}] x [{}, {}]^T (row strides {}, {}, {}): {} (status {})",
                a_type == DnnlType::bf16 ? "bf16" : "f32", g.m, g.k, g.n, g.k, g.lda, g.ldb, g.ldc, e.what(),
                static_cast<int>(e.status));
  }
}

// Runs f on column blocks of g, in our pool: blocks at least 256 columns wide, claimed as the
// pool claims any chunk, each run by oneDNN single-threaded. Not oneDNN's own OpenMP threads:
// after every call libgomp's workers spin for ~5 ms (measured; OMP_WAIT_POLICY, read from the
// environment when libgomp loads, is the only switch), taking a core from whatever runs next
// on a machine with few cores (our pool's next op, OpenBLAS). Claimed chunks also keep a
// loaded machine's descheduled thread from holding up the call.
void for_column_chunks(ThreadPool& pool, const GemmArgs& g, const std::function<void(const GemmArgs&)>& f) {
  constexpr std::int64_t kCols = 64;
  const std::size_t b_bytes = dtype_size(g.b_type);
  pool.parallel_for((g.n + kCols - 1) / kCols, [&](std::int64_t lo, std::int64_t hi) {
    omp_set_num_threads(1);  // a per-thread setting: oneDNN then makes no OpenMP team
    GemmArgs s = g;
    s.n = std::min(hi * kCols, g.n) - lo * kCols;
    s.b = static_cast<const char*>(g.b) + static_cast<std::size_t>(lo * kCols * g.ldb) * b_bytes;
    s.c = g.c + lo * kCols;
    f(s);
    poll_progress();
  }, 4);
}

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown ISA";
  }
}

}  // namespace

void gemm_onednn(ThreadPool& pool, const GemmArgs& g) {
  // 16-bit weights: each thread widens its own columns' rows (per 256, in its scratch).
  for_column_chunks(pool, g, [](const GemmArgs& s) {
    for_f32_weight_blocks(s, [](const GemmArgs& b) { run_one(b, DnnlType::f32, DnnlType::f32); });
  });
}

void gemm_onednn_bf16(ThreadPool& pool, const GemmArgs& g) {
  if (g.b_type != DType::kBF16)
    throw_error(ErrorCode::kInvalidArgument, "matmul: the oneDNN bf16 algorithm needs bf16 weights, not {}",
                to_string(g.b_type));
  // x rounded to bf16 (round to nearest even, as convert does), in per-thread scratch.
  thread_local std::vector<std::uint16_t> xb;
  xb.resize(static_cast<std::size_t>(g.m * g.k));
  convert(pool, TensorView::matrix(g.a, DType::kF32, g.m, g.k, g.lda), TensorView::matrix(xb.data(), DType::kBF16, g.m, g.k));
  GemmArgs s = g;
  s.a = reinterpret_cast<const float*>(xb.data());  // typed by the primitive, not by GemmArgs
  s.lda = g.k;
  for_column_chunks(pool, s, [](const GemmArgs& c) { run_one(c, DnnlType::bf16, DnnlType::bf16); });
}

bool onednn_has_avx512() {
  static const bool yes = [] {
    const unsigned isa = dnnl_get_effective_cpu_isa();  // a bit set: each ISA includes those below
    return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  }();
  return yes;
}

}  // namespace trellis::kernels::cpu

namespace trellis::kernels {

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  const char* runtime = v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
                        : v->cpu_runtime == DNNL_RUNTIME_THREADPOOL                                          ? "threadpool"
                                                                                                              : "sequential";
  return fmt::format("oneDNN {}.{}.{} ({} runtime, ISA {})", v->major, v->minor, v->patch, runtime,
                     cpu::isa_name(dnnl_get_effective_cpu_isa()));
}

}  // namespace trellis::kernels
