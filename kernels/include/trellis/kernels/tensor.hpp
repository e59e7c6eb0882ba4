// Tensors for the kernels layer: a non-owning TensorView that every op takes, and an owning
// Tensor that allocates aligned memory for one.
//
// A view knows its device (CPU or CUDA), its element type, its shape and its strides (in
// elements, not bytes), so one op signature serves every backend: the op checks the device
// of its operands against the Context's and dispatches (kernels/cpu/ or kernels/cuda/).
//
// Conventions every op follows:
//  * Matrices are row-major with a row stride that may exceed the column count (a view of a
//    column slice of a larger matrix, e.g. a tensor-parallel shard straight from a mmap).
//    The last dimension must be contiguous (stride 1).
//  * Weights are stored as in HF checkpoints: a linear layer's weight is [out, in].
//  * Activations are f32; weights may be f32, bf16 or f16.
//  * `name` is optional and only used in error messages; it must outlive the view (point it
//    at a string the model owns, e.g. the checkpoint's tensor name).
//
// Threading: views are plain values. Ops never take ownership of the memory they point to.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "trellis/core/half.hpp"
#include "trellis/kernels/host_arena.hpp"

namespace trellis::kernels {

enum class Device : std::uint8_t { kCpu, kCuda };

// Element types. After the plain types come ggml's block-quantised weight types (32 elements
// per block, see quant.hpp): kQ4_1 and kQ8_0. Only matmul weights and embedding tables may be
// quantised; every other op rejects them. Code that switches on DType must keep a default
// that throws kUnsupported.
enum class DType : std::uint8_t { kF32, kBF16, kF16, kQ4_1, kQ8_0 };

std::string_view to_string(Device d);
std::string_view to_string(DType t);
// "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"/"half" (case-sensitive). Throws
// ErrorCode::kInvalidArgument naming `what` (e.g. "--dtype") for anything else.
DType parse_dtype(std::string_view text, std::string_view what = "dtype");
// Bytes per element of a plain type; throws kUnsupported for a block type (use dtype_bytes).
std::size_t dtype_size(DType t);
// True for the block-quantised types (kQ4_1, kQ8_0).
bool is_quantized(DType t);
// Elements per block: 1 for plain types, 32 for the quantised ones.
std::int64_t dtype_block_elems(DType t);
// Bytes of n consecutive elements; for a block type n must be a whole number of blocks
// (throws kInvalidArgument otherwise). Views of block types keep shapes and strides in
// elements, so their column counts, row strides and slice offsets are multiples of 32.
std::size_t dtype_bytes(DType t, std::int64_t n);

inline constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};   // elements per dimension
  std::array<std::int64_t, kMaxDims> stride{};  // elements between neighbours per dimension
  const char* name = "";                        // for error messages only

  // A contiguous 1-D view of n elements.
  static TensorView vector(const void* data, DType t, std::int64_t n, Device d = Device::kCpu);
  // A rows x cols row-major view; row_stride < 0 means cols (dense).
  static TensorView matrix(const void* data, DType t, std::int64_t rows, std::int64_t cols,
                           std::int64_t row_stride = -1, Device d = Device::kCpu);
  // A dense row-major view of any rank <= kMaxDims.
  static TensorView contiguous(const void* data, DType t, std::span<const std::int64_t> shape,
                               Device d = Device::kCpu);
  static TensorView contiguous(const void* data, DType t, std::initializer_list<std::int64_t> shape,
                               Device d = Device::kCpu) {
    return contiguous(data, t, std::span<const std::int64_t>(shape.begin(), shape.size()), d);
  }

  std::int64_t numel() const;
  std::size_t element_size() const;
  // True when the elements are dense in row-major order.
  bool is_contiguous() const;

  // The view as rows x cols where cols is the last dimension and rows the product of the
  // others; requires the leading dimensions to be collapsible (each stride = next stride *
  // next size) and the last dimension contiguous. Throws kInvalidArgument naming the view.
  TensorView as_matrix() const;
  std::int64_t rows() const;        // as_matrix().shape[0]
  std::int64_t cols() const;        // shape[ndim-1]
  std::int64_t row_stride() const;  // as_matrix().stride[0]

  // Rows [begin, begin+count) of the first dimension (same rank). Throws if out of range.
  TensorView slice_rows(std::int64_t begin, std::int64_t count) const;
  // Columns [begin, begin+count) of the last dimension of a matrix (ndim == 2).
  TensorView slice_cols(std::int64_t begin, std::int64_t count) const;
  // A new name for error messages (the string must outlive the view).
  TensorView named(const char* n) const {
    TensorView v = *this;
    v.name = n;
    return v;
  }

  // Typed element access (host memory only; no checks in release builds).
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Address of row r of the matrix form.
  void* row_ptr(std::int64_t r) const;

  // "x [4, 2048] f32 (row stride 2048) on cpu"-style text for errors and logs.
  std::string describe() const;
};

// Owning tensor: 64-byte aligned host memory (Device::kCpu) or GPU memory (Device::kCuda:
// cudaMalloc on the calling thread's current device, the one the last CUDA Context made on
// this thread selected; 256-byte aligned). Movable, not copyable. Device tensors are read and
// written through ops and copy() (ops.hpp), never through ptr(). Allocating on kCuda throws
// kUnsupported when the CUDA backend is not built or there is no device, and
// kResourceExhausted naming the bytes requested and the bytes free when the GPU is full.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialised memory of the given shape.
  static Tensor empty(DType t, std::span<const std::int64_t> shape, Device d = Device::kCpu);
  static Tensor empty(DType t, std::initializer_list<std::int64_t> shape, Device d = Device::kCpu) {
    return empty(t, std::span<const std::int64_t>(shape.begin(), shape.size()), d);
  }
  // Uninitialised host memory from `arena` (host_arena.hpp: packed, on huge pages where the
  // kernel grants them); the tensor keeps its part of the arena alive.
  static Tensor empty(DType t, std::span<const std::int64_t> shape, HostArena& arena);
  static Tensor empty(DType t, std::initializer_list<std::int64_t> shape, HostArena& arena) {
    return empty(t, std::span<const std::int64_t>(shape.begin(), shape.size()), arena);
  }
  static Tensor zeros(DType t, std::span<const std::int64_t> shape, Device d = Device::kCpu);
  static Tensor zeros(DType t, std::initializer_list<std::int64_t> shape, Device d = Device::kCpu) {
    return zeros(t, std::span<const std::int64_t>(shape.begin(), shape.size()), d);
  }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: views are the currency
  template <typename T>
  T* ptr() const {
    return view_.ptr<T>();
  }
  std::int64_t numel() const { return view_.numel(); }
  std::size_t bytes() const { return bytes_; }
  bool empty_tensor() const { return bytes_ == 0; }
  // A number no other allocation of this process has had (0: never allocated). Memory freed
  // and allocated again can come back at the same address; a CUDA graph captured over the
  // first allocation must not be launched over the second (the driver keeps per-allocation
  // state: a launch after the free crashed inside cuGraphLaunch, docs/gpu-runs/README.md),
  // so whoever caches addresses compares serials, not pointers.
  std::uint64_t serial() const { return serial_; }

 private:
  struct Free {
    Free() noexcept : device(Device::kCpu) {}  // a constructor, not a member initialiser: GCC
    explicit Free(Device d) noexcept : device(d) {}  // needs it while Tensor is incomplete
    Device device;
    // Set for arena memory: the block's owner, released instead of freeing the pointer.
    mutable std::shared_ptr<std::byte> keep;
    void operator()(std::byte* p) const;
  };
  static Tensor shaped(DType t, std::span<const std::int64_t> shape, Device d);
  std::unique_ptr<std::byte, Free> buf_;
  std::size_t bytes_ = 0;
  std::uint64_t serial_ = 0;
  TensorView view_;
};

// Scalar bf16/f16 conversions (trellis/core/half.hpp: round-to-nearest-even; NaN stays NaN).
using ::trellis::bf16_to_f32;
using ::trellis::f16_to_f32;
using ::trellis::f32_to_bf16;
using ::trellis::f32_to_f16;

}  // namespace trellis::kernels
