// Code point classification and UTF-8 decoding for the pre-tokenizer.
#include <algorithm>

#include "tokenizer/pre_tokenize.hpp"
#include "tokenizer/unicode_tables.hpp"

namespace trellis::runtime::tokenizer {
namespace unicode {
namespace {
bool in(const CodepointRange* table, std::size_t n, char32_t c) {
  const CodepointRange* end = table + n;
  const CodepointRange* it =
      std::upper_bound(table, end, c, [](char32_t v, const CodepointRange& r) { return v < r.first; });
  return it != table && c <= (it - 1)->last;
}
}  // namespace

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in(kLetters, kLetters_count, c);
}
bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in(kNumbers, kNumbers_count, c);
}
bool is_whitespace(char32_t c) { return in(kWhiteSpace, kWhiteSpace_count, c); }
}  // namespace unicode

char32_t decode_utf8(std::string_view s, std::size_t pos, std::size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  len = 1;
  if (b0 < 0x80) return b0;
  int n;
  char32_t c;
  if ((b0 & 0xe0) == 0xc0) n = 1, c = b0 & 0x1f;
  else if ((b0 & 0xf0) == 0xe0) n = 2, c = b0 & 0x0f;
  else if ((b0 & 0xf8) == 0xf0) n = 3, c = b0 & 0x07;
  else return 0xfffd;
  if (pos + static_cast<std::size_t>(n) >= s.size()) return 0xfffd;  // truncated sequence
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[pos + static_cast<std::size_t>(k)]);
    if ((b & 0xc0) != 0x80) return 0xfffd;
    c = (c << 6) | (b & 0x3f);
  }
  static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (c < kMin[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0xfffd;
  len = static_cast<std::size_t>(n) + 1;
  return c;
}

}  // namespace trellis::runtime::tokenizer
