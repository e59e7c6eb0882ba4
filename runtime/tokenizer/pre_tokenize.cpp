// The GPT-2 pre-tokenizer pattern, written as a hand-made scanner over code points rather
// than a regex: std::regex knows no \p{L}, and the pattern's one look-ahead (\s+(?!\S):
// a whitespace run gives its last character to the following word) is a single rule here.
#include "tokenizer/pre_tokenize.hpp"

#include "tokenizer/unicode_tables.hpp"

namespace trellis::runtime::tokenizer {
namespace {

enum class Cls { kLetter, kNumber, kSpace, kOther };

struct Cp {
  char32_t c;
  std::size_t offset;  // byte offset of the code point
  Cls cls;
};

Cls classify(char32_t c) {
  if (unicode::is_letter(c)) return Cls::kLetter;
  if (unicode::is_number(c)) return Cls::kNumber;
  if (unicode::is_whitespace(c)) return Cls::kSpace;
  return Cls::kOther;
}

// Length in code points of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
std::size_t contraction(const std::vector<Cp>& cp, std::size_t i, std::size_t e) {
  if (cp[i].c != U'\'' || i + 1 >= e) return 0;
  const char32_t a = cp[i + 1].c;
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 < e) {
    const char32_t b = cp[i + 2].c;
    if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  }
  return 0;
}

// Splits code points [s, e) with the GPT-2 pattern, appending pieces as code point ranges.
void split_gpt2(const std::vector<Cp>& cp, std::size_t s, std::size_t e,
                std::vector<std::pair<std::size_t, std::size_t>>& out) {
  std::size_t i = s;
  while (i < e) {
    if (std::size_t n = contraction(cp, i, e)) {
      out.emplace_back(i, i + n);
      i += n;
      continue;
    }
    // " ?X+" for X in letters, numbers, other (not space/letter/number).
    std::size_t j = (cp[i].c == U' ' && i + 1 < e) ? i + 1 : i;
    const Cls x = cp[j].cls;
    if (x != Cls::kSpace) {
      std::size_t k = j + 1;
      while (k < e && cp[k].cls == x) ++k;
      out.emplace_back(i, k);
      i = k;
      continue;
    }
    // x is whitespace, so cp[i] is too (either it is the space or j == i).
    std::size_t k = i + 1;
    while (k < e && cp[k].cls == Cls::kSpace) ++k;
    if (k < e && k - i >= 2) --k;  // \s+(?!\S): leave the last one to the next piece
    out.emplace_back(i, k);
    i = k;
  }
}

}  // namespace

std::vector<Piece> pre_tokenize(std::string_view text, bool split_digits) {
  std::vector<Cp> cp;
  cp.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t len;
    char32_t c = decode_utf8(text, pos, len);
    cp.push_back({c, pos, classify(c)});
    pos += len;
  }
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  if (split_digits) {
    std::size_t s = 0;
    for (std::size_t i = 0; i < cp.size(); ++i) {
      if (cp[i].cls != Cls::kNumber) continue;
      split_gpt2(cp, s, i, spans);
      spans.emplace_back(i, i + 1);
      s = i + 1;
    }
    split_gpt2(cp, s, cp.size(), spans);
  } else {
    split_gpt2(cp, 0, cp.size(), spans);
  }
  std::vector<Piece> pieces;
  pieces.reserve(spans.size());
  for (auto [a, b] : spans)
    pieces.push_back({cp[a].offset, b < cp.size() ? cp[b].offset : text.size()});
  return pieces;
}

}  // namespace trellis::runtime::tokenizer
