// Pre-tokenization (private to runtime/tokenizer): splitting text into the pieces BPE runs
// on. Pieces are byte ranges of the input, so invalid UTF-8 survives untouched.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace trellis::runtime::tokenizer {

struct Piece {
  std::size_t begin, end;  // byte offsets into the text
};

// Splits `text` with the GPT-2 pattern; with split_digits, every \p{N} code point is first
// made its own piece (the "smollm"/"starcoder" pre-tokenizers).
std::vector<Piece> pre_tokenize(std::string_view text, bool split_digits);

// Decodes one UTF-8 code point at text[pos]; sets len to its byte length. Invalid or
// truncated sequences decode as U+FFFD with length 1.
char32_t decode_utf8(std::string_view text, std::size_t pos, std::size_t& len);

}  // namespace trellis::runtime::tokenizer
