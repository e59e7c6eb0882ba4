// GGUF parsing. Every read goes through Cursor, which checks the remaining length first;
// counts are checked against the smallest possible encoding of what they count before any
// vector is sized from them, so a file that lies about a count fails with a message
// instead of allocating gigabytes.
#include <algorithm>
#include <cstring>
#include <limits>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf.hpp"
#include "trellis/runtime/checkpoint/mapped_file.hpp"

namespace trellis::runtime::gguf {
namespace {

constexpr std::uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;              // arrays of arrays of ...
constexpr std::uint64_t kMaxAlignment = 1u << 20;

class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, const std::string& file) : b_(bytes), file_(file) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t remaining() const { return b_.size() - pos_; }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    auto len = read<std::uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<std::size_t>(len));
    pos_ += len;
    return s;
  }

  void need(std::uint64_t n, std::string_view what) const {
    if (n > remaining())
      throw_error(ErrorCode::kCorruptInput,
                  "{}: GGUF truncated: {} needs {} bytes at offset {} but only {} remain", file_,
                  what, n, pos_, remaining());
  }

 private:
  std::span<const std::byte> b_;
  const std::string& file_;
  std::uint64_t pos_ = 0;
};

std::uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    case ValueType::kString: return 8;   // the length prefix, at least
    case ValueType::kArray: return 12;   // element type + count, at least
  }
  return 0;
}

ValueType check_value_type(std::uint32_t raw, const std::string& file, std::string_view key) {
  if (raw > static_cast<std::uint32_t>(ValueType::kF64))
    throw_error(ErrorCode::kCorruptInput, "{}: GGUF key '{}' has unknown value type {}", file, key, raw);
  return static_cast<ValueType>(raw);
}

Value read_value(Cursor& c, ValueType t, const std::string& file, std::string_view key, int depth) {
  Value v;
  v.type = t;
  switch (t) {
    case ValueType::kU8: v.u = c.read<std::uint8_t>(key); break;
    case ValueType::kU16: v.u = c.read<std::uint16_t>(key); break;
    case ValueType::kU32: v.u = c.read<std::uint32_t>(key); break;
    case ValueType::kU64: v.u = c.read<std::uint64_t>(key); break;
    case ValueType::kI8: v.i = c.read<std::int8_t>(key); break;
    case ValueType::kI16: v.i = c.read<std::int16_t>(key); break;
    case ValueType::kI32: v.i = c.read<std::int32_t>(key); break;
    case ValueType::kI64: v.i = c.read<std::int64_t>(key); break;
    case ValueType::kF32: v.f = c.read<float>(key); break;
    case ValueType::kF64: v.f = c.read<double>(key); break;
    case ValueType::kBool: {
      auto b = c.read<std::uint8_t>(key);
      if (b > 1) throw_error(ErrorCode::kCorruptInput, "{}: GGUF key '{}': bool byte {}", file, key, b);
      v.u = b;
      break;
    }
    case ValueType::kString: v.s = c.read_string(key); break;
    case ValueType::kArray: {
      if (depth >= kMaxArrayDepth)
        throw_error(ErrorCode::kCorruptInput, "{}: GGUF key '{}': arrays nested deeper than {}", file, key,
                    kMaxArrayDepth);
      v.elem_type = check_value_type(c.read<std::uint32_t>(key), file, key);
      auto n = c.read<std::uint64_t>(key);
      std::uint64_t min_each = scalar_size(v.elem_type);
      if (n > c.remaining() / min_each)
        throw_error(ErrorCode::kCorruptInput,
                    "{}: GGUF key '{}': array count {} cannot fit in the {} bytes left", file, key, n,
                    c.remaining());
      v.items.reserve(static_cast<std::size_t>(n));
      for (std::uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(c, v.elem_type, file, key, depth + 1));
      break;
    }
  }
  return v;
}

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const std::string& file, std::string_view tensor) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r) || r > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': size overflows", file, tensor);
  return r;
}

TensorEntry read_tensor_info(Cursor& c, const std::string& file) {
  TensorEntry t;
  t.name = c.read_string("tensor name");
  auto n_dims = c.read<std::uint32_t>(t.name);
  if (n_dims == 0 || n_dims > kMaxDims)
    throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': {} dimensions (1..{} allowed)", file, t.name, n_dims,
                kMaxDims);
  std::uint64_t numel = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    auto ne = c.read<std::uint64_t>(t.name);
    if (ne == 0)
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': dimension {} is zero", file, t.name, d);
    numel = checked_mul(numel, ne, file, t.name);
    t.ne.push_back(static_cast<std::int64_t>(ne));
  }
  auto type_id = c.read<std::uint32_t>(t.name);
  const TypeTraits* tr = type_traits(type_id);
  if (tr == nullptr)
    throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': unknown ggml type id {}", file, t.name, type_id);
  t.type = static_cast<GgmlType>(type_id);
  if (t.ne[0] % tr->block_elems != 0)
    throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': row of {} elements is not whole {} blocks of {}",
                file, t.name, t.ne[0], tr->name, tr->block_elems);
  t.nbytes = checked_mul(numel / static_cast<std::uint64_t>(tr->block_elems),
                         static_cast<std::uint64_t>(tr->block_bytes), file, t.name);
  t.offset = c.read<std::uint64_t>(t.name);
  return t;
}

}  // namespace

GgufFile::GgufFile(std::span<const std::byte> bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {
  parse();
}

std::shared_ptr<const GgufFile> GgufFile::open(const std::filesystem::path& path) {
  auto map = std::make_shared<const MappedFile>(path);
  std::shared_ptr<GgufFile> f(new GgufFile(map->bytes(), path.string()));
  f->map_ = std::move(map);
  return f;
}

void GgufFile::parse() {
  Cursor c(bytes_, name_);
  c.need(4, "magic");
  if (std::memcmp(bytes_.data(), "GGUF", 4) != 0)
    throw_error(ErrorCode::kCorruptInput, "{}: not a GGUF file (no 'GGUF' magic)", name_);
  c.read<std::uint32_t>("magic");
  version_ = c.read<std::uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw_error(ErrorCode::kCorruptInput, "{}: GGUF version {} (trellis reads 2 and 3)", name_, version_);
  auto n_tensors = c.read<std::uint64_t>("tensor count");
  auto n_kv = c.read<std::uint64_t>("metadata count");
  // A key/value is at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13)
    throw_error(ErrorCode::kCorruptInput, "{}: GGUF metadata count {} cannot fit in a {}-byte file", name_, n_kv,
                bytes_.size());
  if (n_tensors > c.remaining() / 32)
    throw_error(ErrorCode::kCorruptInput, "{}: GGUF tensor count {} cannot fit in a {}-byte file", name_,
                n_tensors, bytes_.size());

  kv_.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key");
    auto type = check_value_type(c.read<std::uint32_t>(key), name_, key);
    Value v = read_value(c, type, name_, key, 0);
    if (!kv_index_.emplace(key, kv_.size()).second)
      throw_error(ErrorCode::kCorruptInput, "{}: GGUF key '{}' appears twice", name_, key);
    kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const Value* a = find("general.alignment")) {
    auto al = a->as_int(name_ + ": general.alignment");
    if (al <= 0 || (al & (al - 1)) != 0 || static_cast<std::uint64_t>(al) > kMaxAlignment)
      throw_error(ErrorCode::kCorruptInput, "{}: general.alignment {} is not a power of two up to {}", name_, al,
                  kMaxAlignment);
    alignment_ = static_cast<std::uint64_t>(al);
  }

  tensors_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t k = 0; k < n_tensors; ++k) {
    TensorEntry t = read_tensor_info(c, name_);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' appears twice", name_, t.name);
    tensors_.push_back(std::move(t));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  const std::uint64_t size = bytes_.size();
  if (!tensors_.empty() && data_offset_ > size)
    throw_error(ErrorCode::kCorruptInput, "{}: GGUF truncated before the data section (offset {}, size {})", name_,
                data_offset_, size);
  for (const TensorEntry& t : tensors_) {
    if (t.offset % alignment_ != 0)
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': data offset {} is not a multiple of alignment {}",
                  name_, t.name, t.offset, alignment_);
    const std::uint64_t avail = size - data_offset_;
    if (t.offset > avail || t.nbytes > avail - t.offset)
      throw_error(ErrorCode::kCorruptInput,
                  "{}: tensor '{}': data [{}, {}) of the data section runs past the end of the file "
                  "({} bytes of data)",
                  name_, t.name, t.offset, t.offset + t.nbytes, avail);
  }
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& GgufFile::require(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) throw_error(ErrorCode::kNotFound, "{}: GGUF metadata has no key '{}'", name_, key);
  return *v;
}

const TensorEntry* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> GgufFile::tensor_bytes(const TensorEntry& t) const {
  return bytes_.subspan(data_offset_ + t.offset, t.nbytes);
}

}  // namespace trellis::runtime::gguf
