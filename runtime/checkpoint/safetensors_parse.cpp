// The safetensors header parser. Everything in the file is untrusted: every length and
// offset is checked against the file size before use, arithmetic is overflow-checked,
// and the first inconsistency throws kCorruptInput naming the file and the tensor.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

namespace trellis::runtime {
namespace {

// Far above any real header (the largest Llama headers are ~100 KiB) and small enough
// that a corrupt length cannot make us parse gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr std::uint64_t kMaxDims = 8;

[[noreturn]] void corrupt(const std::string& file, const std::string& tensor, const std::string& why) {
  if (tensor.empty()) throw_error(ErrorCode::kCorruptInput, "{}: corrupt safetensors file: {}", file, why);
  throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': {}", file, tensor, why);
}

std::uint64_t read_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

SafetensorsEntry parse_entry(const std::string& file, const std::string& name, const nlohmann::json& j,
                             std::uint64_t data_start, std::uint64_t file_size) {
  SafetensorsEntry e;
  e.name = name;
  if (!j.is_object()) corrupt(file, name, "header entry is not an object");
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) corrupt(file, name, "missing or non-string 'dtype'");
  e.dtype = dt->get<std::string>();
  std::size_t esize = safetensors_dtype_size(e.dtype);
  if (esize == 0) corrupt(file, name, "unknown dtype '" + e.dtype + "'");
  auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array() || sh->size() > kMaxDims)
    corrupt(file, name, "missing 'shape' or more than 8 dimensions");
  // numel * esize must fit in 64 bits: bound each product as we go.
  std::uint64_t bytes = esize;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) corrupt(file, name, "shape has a non-integer or negative dimension");
    auto v = d.get<std::uint64_t>();
    if (v != 0 && bytes > std::numeric_limits<std::uint64_t>::max() / v)
      corrupt(file, name, "shape overflows 64-bit byte counts");
    bytes *= v;
    e.shape.push_back(static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX)));
  }
  auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    corrupt(file, name, "'data_offsets' must be two non-negative integers");
  auto b = (*off)[0].get<std::uint64_t>(), en = (*off)[1].get<std::uint64_t>();
  if (b > en) corrupt(file, name, fmt::format("data_offsets [{}, {}) are reversed", b, en));
  std::uint64_t data_size = file_size - data_start;
  if (en > data_size)
    corrupt(file, name, fmt::format("data_offsets [{}, {}) run past the end of the data section "
                                    "({} bytes; file truncated?)", b, en, data_size));
  if (en - b != bytes)
    corrupt(file, name, fmt::format("data_offsets [{}, {}) hold {} bytes but shape x {} needs {}", b, en,
                                    en - b, e.dtype, bytes));
  e.begin = data_start + b;
  e.end = data_start + en;
  return e;
}

}  // namespace

std::size_t safetensors_dtype_size(std::string_view dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL" || dt == "F8_E4M3" || dt == "F8_E5M2") return 1;
  return 0;
}

std::vector<SafetensorsEntry> parse_safetensors(std::span<const std::byte> file, const std::string& name) {
  if (file.size() < 8) corrupt(name, "", fmt::format("{} bytes is shorter than the 8-byte header length", file.size()));
  std::uint64_t n = read_u64_le(file.data());
  if (n > kMaxHeaderBytes) corrupt(name, "", fmt::format("header length {} is implausible (> 100 MiB)", n));
  if (n > file.size() - 8)
    corrupt(name, "", fmt::format("header length {} runs past the end of the {}-byte file (truncated?)", n, file.size()));
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  nlohmann::json header = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) corrupt(name, "", "header is not a JSON object");
  std::vector<SafetensorsEntry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    entries.push_back(parse_entry(name, it.key(), it.value(), 8 + n, file.size()));
  }
  // Overlap check on a copy sorted by offset; empty tensors overlap nothing.
  std::vector<const SafetensorsEntry*> by_off;
  for (const auto& e : entries)
    if (e.end > e.begin) by_off.push_back(&e);
  std::sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_off.size(); ++i)
    if (by_off[i]->begin < by_off[i - 1]->end)
      corrupt(name, by_off[i]->name, fmt::format("its bytes overlap tensor '{}'", by_off[i - 1]->name));
  std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return entries;
}

}  // namespace trellis::runtime
