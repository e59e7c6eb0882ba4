#include "trellis/kernels/tensor.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda/cuda_ops.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {

std::string_view to_string(Device d) {
  switch (d) {
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
  }
  return "unknown-device";
}

std::string_view to_string(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kQ4_1: return "q4_1";
    case DType::kQ8_0: return "q8_0";
  }
  return "unknown-dtype";
}

DType parse_dtype(std::string_view text, std::string_view what) {
  if (text == "f32" || text == "float32") return DType::kF32;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "f16" || text == "float16" || text == "half") return DType::kF16;
  throw_error(ErrorCode::kInvalidArgument, "{}: unknown dtype '{}' (expected f32, bf16 or f16)", what, text);
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kQ4_1:
    case DType::kQ8_0:
      throw_error(ErrorCode::kUnsupported, "dtype_size: {} is a block type (32 elements per block)", to_string(t));
  }
  throw_error(ErrorCode::kUnsupported, "dtype_size: unknown dtype {}", static_cast<int>(t));
}

bool is_quantized(DType t) { return t == DType::kQ4_1 || t == DType::kQ8_0; }

std::int64_t dtype_block_elems(DType t) { return is_quantized(t) ? 32 : 1; }

std::size_t dtype_bytes(DType t, std::int64_t n) {
  // Block sizes of ggml's formats: Q4_1 = f16 d, f16 m, 16 nibble bytes; Q8_0 = f16 d, 32 int8.
  if (t == DType::kQ4_1 || t == DType::kQ8_0) {
    if (n % 32 != 0)
      throw_error(ErrorCode::kInvalidArgument, "{}: {} elements are not whole 32-element blocks", to_string(t), n);
    return static_cast<std::size_t>(n / 32) * (t == DType::kQ4_1 ? 20u : 34u);
  }
  return static_cast<std::size_t>(n) * dtype_size(t);
}

TensorView TensorView::vector(const void* data, DType t, std::int64_t n, Device d) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = t;
  v.device = d;
  v.ndim = 1;
  v.shape[0] = n;
  v.stride[0] = 1;
  return v;
}

TensorView TensorView::matrix(const void* data, DType t, std::int64_t rows, std::int64_t cols,
                              std::int64_t row_stride, Device d) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = t;
  v.device = d;
  v.ndim = 2;
  v.shape = {rows, cols, 0, 0};
  v.stride = {row_stride < 0 ? cols : row_stride, 1, 0, 0};
  if (row_stride >= 0 && row_stride < cols && rows > 1)
    throw_error(ErrorCode::kInvalidArgument, "matrix view: row stride {} is smaller than {} columns", row_stride, cols);
  return v;
}

TensorView TensorView::contiguous(const void* data, DType t, std::span<const std::int64_t> shp, Device d) {
  if (shp.empty() || shp.size() > static_cast<std::size_t>(kMaxDims))
    throw_error(ErrorCode::kInvalidArgument, "tensor view: rank {} not in [1, {}]", shp.size(), kMaxDims);
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = t;
  v.device = d;
  v.ndim = static_cast<int>(shp.size());
  std::int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    if (shp[static_cast<std::size_t>(i)] < 0)
      throw_error(ErrorCode::kInvalidArgument, "tensor view: negative dimension {}", shp[static_cast<std::size_t>(i)]);
    v.shape[static_cast<std::size_t>(i)] = shp[static_cast<std::size_t>(i)];
    v.stride[static_cast<std::size_t>(i)] = s;
    s *= shp[static_cast<std::size_t>(i)];
  }
  return v;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<std::size_t>(i)];
  return ndim == 0 ? 0 : n;
}

std::size_t TensorView::element_size() const { return dtype_size(dtype); }

bool TensorView::is_contiguous() const {
  std::int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    auto u = static_cast<std::size_t>(i);
    if (shape[u] != 1 && stride[u] != s) return false;
    s *= shape[u];
  }
  return true;
}

TensorView TensorView::as_matrix() const {
  if (ndim == 2 && stride[1] == 1) return *this;
  if (ndim < 1)
    throw_error(ErrorCode::kInvalidArgument, "tensor '{}' has no dimensions", name);
  if (stride[static_cast<std::size_t>(ndim - 1)] != 1 && shape[static_cast<std::size_t>(ndim - 1)] > 1)
    throw_error(ErrorCode::kInvalidArgument, "{}: the last dimension must be contiguous", describe());
  TensorView m = *this;
  m.ndim = 2;
  m.shape = {1, shape[static_cast<std::size_t>(ndim - 1)], 0, 0};
  m.stride = {shape[static_cast<std::size_t>(ndim - 1)], 1, 0, 0};
  if (ndim == 1) return m;
  // Leading dims collapse when each stride equals the next stride times the next size.
  for (int i = 0; i + 2 < ndim; ++i) {
    auto u = static_cast<std::size_t>(i);
    if (shape[u] > 1 && stride[u] != stride[u + 1] * shape[u + 1])
      throw_error(ErrorCode::kInvalidArgument, "{}: leading dimensions cannot be viewed as rows", describe());
  }
  std::int64_t rows = 1;
  for (int i = 0; i + 1 < ndim; ++i) rows *= shape[static_cast<std::size_t>(i)];
  m.shape[0] = rows;
  m.stride[0] = stride[static_cast<std::size_t>(ndim - 2)];
  return m;
}

std::int64_t TensorView::rows() const { return as_matrix().shape[0]; }
std::int64_t TensorView::cols() const { return ndim == 0 ? 0 : shape[static_cast<std::size_t>(ndim - 1)]; }
std::int64_t TensorView::row_stride() const { return as_matrix().stride[0]; }

TensorView TensorView::slice_rows(std::int64_t begin, std::int64_t count) const {
  if (ndim < 1 || begin < 0 || count < 0 || begin + count > shape[0])
    throw_error(ErrorCode::kInvalidArgument, "{}: rows [{}, {}) out of range", describe(), begin, begin + count);
  TensorView v = *this;
  v.data = static_cast<std::byte*>(data) + dtype_bytes(dtype, begin * stride[0]);
  v.shape[0] = count;
  return v;
}

TensorView TensorView::slice_cols(std::int64_t begin, std::int64_t count) const {
  if (ndim != 2 || begin < 0 || count < 0 || begin + count > shape[1])
    throw_error(ErrorCode::kInvalidArgument, "{}: columns [{}, {}) out of range", describe(), begin, begin + count);
  TensorView v = *this;
  v.data = static_cast<std::byte*>(data) + dtype_bytes(dtype, begin * stride[1]);
  v.shape[1] = count;
  return v;
}

void* TensorView::row_ptr(std::int64_t r) const {
  return static_cast<std::byte*>(data) + dtype_bytes(dtype, r * row_stride());
}

std::string TensorView::describe() const {
  std::string s = (name && *name) ? fmt::format("'{}' [", name) : std::string("tensor [");
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[static_cast<std::size_t>(i)]);
  s += fmt::format("] {}", to_string(dtype));
  if (ndim >= 2 && !is_contiguous()) {
    s += " strides (";
    for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", stride[static_cast<std::size_t>(i)]);
    s += ")";
  }
  s += fmt::format(" on {}", to_string(device));
  return s;
}

void Tensor::Free::operator()(std::byte* p) const {
  if (keep)
    keep.reset();
  else if (device == Device::kCuda)
    cuda::device_free(p);
  else
    std::free(p);
}

// The view and checks of a new tensor, before its memory.
Tensor Tensor::shaped(DType t, std::span<const std::int64_t> shape, Device d) {
  Tensor out;
  out.view_ = TensorView::contiguous(nullptr, t, shape, d);
  if (is_quantized(t) && out.view_.cols() % 32 != 0)
    throw_error(ErrorCode::kInvalidArgument, "Tensor::empty: rows of {} elements are not whole {} blocks of 32",
                out.view_.cols(), to_string(t));
  static std::atomic<std::uint64_t> next_serial{1};
  out.serial_ = next_serial.fetch_add(1, std::memory_order_relaxed);
  out.buf_ = std::unique_ptr<std::byte, Free>(nullptr, Free{d});
  return out;
}

Tensor Tensor::empty(DType t, std::span<const std::int64_t> shape, HostArena& arena) {
  Tensor out = shaped(t, shape, Device::kCpu);
  const std::size_t bytes = dtype_bytes(t, out.view_.numel());
  if (bytes > 0) {
    std::shared_ptr<std::byte> block = arena.allocate(bytes);
    std::byte* p = block.get();
    out.buf_.get_deleter().keep = std::move(block);
    out.buf_.reset(p);
  }
  out.bytes_ = bytes;
  out.view_.data = out.buf_.get();
  return out;
}

Tensor Tensor::empty(DType t, std::span<const std::int64_t> shape, Device d) {
  Tensor out = shaped(t, shape, d);
  std::size_t bytes = dtype_bytes(t, out.view_.numel());
  std::size_t rounded = (bytes + 63) / 64 * 64;
  if (d == Device::kCuda) {
    out.buf_.reset(static_cast<std::byte*>(cuda::device_alloc(rounded)));
  } else if (rounded > 0) {
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw_error(ErrorCode::kResourceExhausted, "Tensor::empty: cannot allocate {} bytes", rounded);
    out.buf_.reset(static_cast<std::byte*>(p));
  }
  out.bytes_ = bytes;
  out.view_.data = out.buf_.get();
  return out;
}

Tensor Tensor::zeros(DType t, std::span<const std::int64_t> shape, Device d) {
  Tensor out = empty(t, shape, d);
  if (out.bytes_ && d == Device::kCuda)
    cuda::device_zero(out.buf_.get(), out.bytes_);
  else if (out.bytes_)
    std::memset(out.buf_.get(), 0, out.bytes_);
  return out;
}

}  // namespace trellis::kernels
