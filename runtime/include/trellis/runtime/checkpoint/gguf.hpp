// GGUF, the single-file model format of llama.cpp/ggml: a header, typed metadata key/values,
// a tensor table, then aligned tensor data. This header is the parsed view of one file.
//
// Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor_count,
// u64 kv_count; kv_count x {string key, u32 value type, value}; tensor_count x {string name,
// u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset}; padding to general.alignment
// (default 32); the data section. Strings are u64 length + bytes (no terminator). ne[0] is
// the fastest-varying dimension, so a tensor with ne = {576, 1536} is 1536 rows of 576.
//
// Every count, length and offset is checked against the bytes that are really there before
// it is used: a lying count cannot cause a huge allocation or a read past the end. Errors are
// trellis::Error kCorruptInput naming the file (and the key or tensor being read).
//
// Ownership and threading: GgufFile owns its parsed metadata; it refers to the caller's
// bytes (or to its own MappedFile when made by open()). Immutable after construction, so any
// thread may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trellis::runtime {
class MappedFile;
}

namespace trellis::runtime::gguf {

enum class ValueType : std::uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view to_string(ValueType t);

// ggml tensor types with their ids as stored in files. Only the ones listed have known
// block sizes; any other id in a file is reported as corrupt (its size cannot be checked).
enum class GgmlType : std::uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};

struct TypeTraits {
  std::string_view name;       // ggml's spelling: "F32", "Q4_1", ...
  std::int64_t block_elems;    // elements per block (1 for plain types)
  std::int64_t block_bytes;    // bytes per block
  bool dequantizable;          // trellis can convert it to f32/bf16
};
// Traits of a type id, or nullptr for an id this table does not know.
const TypeTraits* type_traits(std::uint32_t type_id);
const TypeTraits& type_traits(GgmlType t);
// Parses a ggml type name ("Q8_0", case-insensitive); nullopt when unknown.
std::optional<GgmlType> parse_type(std::string_view name);

// One metadata value. Scalars keep their stored type; arrays keep their element type and
// their items (arrays of arrays are allowed, to a small depth).
struct Value {
  ValueType type = ValueType::kU32;
  std::uint64_t u = 0;   // kU8..kU64 and kBool
  std::int64_t i = 0;    // kI8..kI64
  double f = 0;          // kF32, kF64
  std::string s;         // kString
  ValueType elem_type = ValueType::kU8;  // kArray
  std::vector<Value> items;              // kArray

  bool is_integer() const;
  // Numeric accessors convert between integer kinds when the value fits, and throw
  // kCorruptInput naming `what` otherwise (a string where a number is expected, ...).
  std::int64_t as_int(std::string_view what) const;
  double as_double(std::string_view what) const;
  bool as_bool(std::string_view what) const;
  const std::string& as_string(std::string_view what) const;
  const std::vector<Value>& as_array(std::string_view what) const;

  static Value of_u32(std::uint32_t v);
  static Value of_u64(std::uint64_t v);
  static Value of_i32(std::int32_t v);
  static Value of_f32(float v);
  static Value of_bool(bool v);
  static Value of_string(std::string v);
  static Value of_strings(const std::vector<std::string>& v);
  static Value of_i32s(const std::vector<std::int32_t>& v);
};

struct TensorEntry {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<std::int64_t> ne;  // ggml order: ne[0] fastest
  std::uint64_t offset = 0;      // from the start of the data section
  std::uint64_t nbytes = 0;      // stored size in bytes

  std::int64_t numel() const;
  std::int64_t row_elems() const { return ne.empty() ? 1 : ne[0]; }
  std::int64_t rows() const { return ne.empty() ? 0 : numel() / ne[0]; }
  std::uint64_t row_bytes() const;  // bytes of one ne[0]-row (whole blocks)
};

class GgufFile {
 public:
  // Parses `bytes` (which must outlive the GgufFile); `name` is used in messages.
  GgufFile(std::span<const std::byte> bytes, std::string name);
  // Maps and parses the file at `path`. Throws kNotFound / kIo / kCorruptInput naming it.
  static std::shared_ptr<const GgufFile> open(const std::filesystem::path& path);

  const std::string& name() const { return name_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order (keys are unique).
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // find() or throw kNotFound naming the file and the key.
  const Value& require(std::string_view key) const;

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* find_tensor(std::string_view name) const;
  // The stored bytes of a tensor (checked at parse time to lie inside the file).
  std::span<const std::byte> tensor_bytes(const TensorEntry& t) const;

 private:
  std::shared_ptr<const MappedFile> map_;  // set by open(); keeps bytes_ alive
  std::span<const std::byte> bytes_;
  std::string name_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, std::size_t, std::less<>> kv_index_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;

  void parse();
};

}  // namespace trellis::runtime::gguf
