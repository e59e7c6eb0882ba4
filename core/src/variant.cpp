#include "trellis/core/variant.hpp"

#include <array>
#include <utility>

#include "trellis/core/error.hpp"

namespace trellis {
namespace {

constexpr std::array<std::pair<Variant, std::string_view>, 7> kNames = {{
    {Variant::kStandard, "standard"},
    {Variant::kParallel, "parallel"},
    {Variant::kLadder, "ladder"},
    {Variant::kDesync2, "desync2"},
    {Variant::kDesync4, "desync4"},
    {Variant::kLayerParallel, "lp"},
    {Variant::kNoComm, "nocomm"},
}};

}  // namespace

std::string_view to_string(Variant v) {
  for (const auto& [kind, name] : kNames)
    if (kind == v) return name;
  return "?";
}

Variant parse_variant(std::string_view name) {
  for (const auto& [kind, n] : kNames)
    if (n == name) return kind;
  throw_error(ErrorCode::kInvalidArgument,
              "unknown variant '{}' (valid: standard, parallel, ladder, desync2, desync4, lp, nocomm)", name);
}

std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  for (const auto& [kind, name] : kNames) v.push_back(kind);
  return v;
}

bool variant_is_exact(Variant v) { return v != Variant::kNoComm; }

}  // namespace trellis
