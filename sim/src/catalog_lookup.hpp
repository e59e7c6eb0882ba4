// Private helper shared by the catalog files: the normalised key catalog lookups compare.
#pragma once

#include <string>
#include <string_view>

namespace trellis::sim::detail {

// Lower case, '_' and ' ' folded into '-': "H100_SXM" and "h100-sxm" are the same key.
inline std::string catalog_key(std::string_view name) {
  std::string k;
  k.reserve(name.size());
  for (char c : name) {
    if (c == '_' || c == ' ') c = '-';
    k.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
  }
  return k;
}

}  // namespace trellis::sim::detail
