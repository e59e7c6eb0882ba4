// The ggml type table and the metadata Value accessors.
#include <array>
#include <cmath>
#include <limits>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/runtime/checkpoint/gguf.hpp"

namespace trellis::runtime::gguf {
namespace {

struct Row {
  std::uint32_t id;
  TypeTraits traits;
};

// Block sizes from the ggml format (element count, bytes per block).
constexpr std::array kTypes = {
    Row{0, {"F32", 1, 4, true}},       Row{1, {"F16", 1, 2, true}},
    Row{2, {"Q4_0", 32, 18, true}},    Row{3, {"Q4_1", 32, 20, true}},
    Row{6, {"Q5_0", 32, 22, false}},   Row{7, {"Q5_1", 32, 24, false}},
    Row{8, {"Q8_0", 32, 34, true}},    Row{9, {"Q8_1", 32, 36, false}},
    Row{10, {"Q2_K", 256, 84, false}}, Row{11, {"Q3_K", 256, 110, false}},
    Row{12, {"Q4_K", 256, 144, false}}, Row{13, {"Q5_K", 256, 176, false}},
    Row{14, {"Q6_K", 256, 210, false}}, Row{15, {"Q8_K", 256, 292, false}},
    Row{24, {"I8", 1, 1, false}},      Row{25, {"I16", 1, 2, false}},
    Row{26, {"I32", 1, 4, false}},     Row{27, {"I64", 1, 8, false}},
    Row{28, {"F64", 1, 8, false}},     Row{30, {"BF16", 1, 2, true}},
};

}  // namespace

std::string_view to_string(ValueType t) {
  static constexpr std::array<std::string_view, 13> kNames = {
      "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<std::size_t>(t);
  return i < kNames.size() ? kNames[i] : "?";
}

const TypeTraits* type_traits(std::uint32_t type_id) {
  for (const Row& r : kTypes)
    if (r.id == type_id) return &r.traits;
  return nullptr;
}

const TypeTraits& type_traits(GgmlType t) {
  const TypeTraits* tr = type_traits(static_cast<std::uint32_t>(t));
  if (tr == nullptr) throw_error(ErrorCode::kInternal, "ggml type {} has no traits", static_cast<int>(t));
  return *tr;
}

std::optional<GgmlType> parse_type(std::string_view name) {
  std::string lower = to_lower(name);
  for (const Row& r : kTypes)
    if (to_lower(r.traits.name) == lower) return static_cast<GgmlType>(r.id);
  return std::nullopt;
}

std::int64_t TensorEntry::numel() const {
  std::int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

std::uint64_t TensorEntry::row_bytes() const {
  const TypeTraits& tr = type_traits(type);
  return static_cast<std::uint64_t>(row_elems() / tr.block_elems * tr.block_bytes);
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kU8: case ValueType::kU16: case ValueType::kU32: case ValueType::kU64:
    case ValueType::kI8: case ValueType::kI16: case ValueType::kI32: case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

std::int64_t Value::as_int(std::string_view what) const {
  switch (type) {
    case ValueType::kU8: case ValueType::kU16: case ValueType::kU32: case ValueType::kU64:
    case ValueType::kBool:
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw_error(ErrorCode::kCorruptInput, "{}: value {} is too large", what, u);
      return static_cast<std::int64_t>(u);
    case ValueType::kI8: case ValueType::kI16: case ValueType::kI32: case ValueType::kI64:
      return i;
    default:
      throw_error(ErrorCode::kCorruptInput, "{}: expected an integer, found {}", what, to_string(type));
  }
}

double Value::as_double(std::string_view what) const {
  if (type == ValueType::kF32 || type == ValueType::kF64) return f;
  if (is_integer()) return static_cast<double>(as_int(what));
  throw_error(ErrorCode::kCorruptInput, "{}: expected a number, found {}", what, to_string(type));
}

bool Value::as_bool(std::string_view what) const {
  if (type == ValueType::kBool) return u != 0;
  if (is_integer()) return as_int(what) != 0;
  throw_error(ErrorCode::kCorruptInput, "{}: expected a bool, found {}", what, to_string(type));
}

const std::string& Value::as_string(std::string_view what) const {
  if (type != ValueType::kString)
    throw_error(ErrorCode::kCorruptInput, "{}: expected a string, found {}", what, to_string(type));
  return s;
}

const std::vector<Value>& Value::as_array(std::string_view what) const {
  if (type != ValueType::kArray)
    throw_error(ErrorCode::kCorruptInput, "{}: expected an array, found {}", what, to_string(type));
  return items;
}

Value Value::of_u32(std::uint32_t v) { Value x; x.type = ValueType::kU32; x.u = v; return x; }
Value Value::of_u64(std::uint64_t v) { Value x; x.type = ValueType::kU64; x.u = v; return x; }
Value Value::of_i32(std::int32_t v) { Value x; x.type = ValueType::kI32; x.i = v; return x; }
Value Value::of_f32(float v) { Value x; x.type = ValueType::kF32; x.f = v; return x; }
Value Value::of_bool(bool v) { Value x; x.type = ValueType::kBool; x.u = v ? 1 : 0; return x; }
Value Value::of_string(std::string v) { Value x; x.type = ValueType::kString; x.s = std::move(v); return x; }

Value Value::of_strings(const std::vector<std::string>& v) {
  Value x;
  x.type = ValueType::kArray;
  x.elem_type = ValueType::kString;
  for (const auto& s : v) x.items.push_back(of_string(s));
  return x;
}

Value Value::of_i32s(const std::vector<std::int32_t>& v) {
  Value x;
  x.type = ValueType::kArray;
  x.elem_type = ValueType::kI32;
  for (auto i : v) x.items.push_back(of_i32(i));
  return x;
}

}  // namespace trellis::runtime::gguf
