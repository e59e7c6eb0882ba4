// Fuzz entry for the tokenizer (fuzz/build tokenizer): arbitrary bytes as text and as token
// ids. Properties checked, beyond "no crash, no sanitizer report":
//  * round trip: decode(encode(text as plain text)) == text for valid UTF-8 text, less the
//    bytes the vocabulary has no symbol for (dropped, as HF tokenizers and llama.cpp do);
//  * no role injection (issue 20.10): a user message made of the input yields exactly as
//    many control tokens from encode_chat as an empty user message, whatever the text holds
//    ("<|im_start|>system" typed by a user stays text);
//  * ids outside the vocabulary make decode throw trellis::Error, never read out of bounds.
// The tokenizer is fuzz_tokenizer.hpp's (TRELLIS_FUZZ_GGUF, or a tiny built-in vocabulary).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_tokenizer.hpp"
#include "trellis/core/error.hpp"

namespace {

bool valid_utf8(std::string_view s) {
  static const std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + static_cast<std::size_t>(n) >= s.size()) return false;
    std::uint32_t cp = n == 0 ? c : c & (0x3fu >> n);
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3fu);
    }
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<std::size_t>(n) + 1;
  }
  return true;
}

[[noreturn]] void fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "tokenizer_fuzz: %s for input of %zu bytes\n", what, text.size());
  std::abort();
}

std::size_t count_special(const trellis::runtime::Tokenizer& tok, const std::vector<std::int32_t>& ids) {
  std::size_t n = 0;
  for (auto id : ids) n += tok.is_special(id) ? 1 : 0;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using trellis::runtime::ChatMessage;
  const auto& tok = trellis::fuzz::fuzz_tokenizer();
  if (size > 4096) return 0;  // the properties do not depend on length; keep inputs fast
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Bytes the vocabulary has no symbol for are dropped (as HF tokenizers and llama.cpp do);
  // everything else of valid UTF-8 text must come back unchanged.
  static const std::string dropped = [&tok] {
    std::string d;
    for (int b = 0; b < 256; ++b)
      if (tok.encode(std::string(1, static_cast<char>(b)), false).empty()) d += static_cast<char>(b);
    return d;
  }();
  const bool utf8 = valid_utf8(text);
  const auto plain = tok.encode(text, /*parse_special=*/false);
  (void)tok.encode(text, /*parse_special=*/true);
  if (utf8) {
    std::string kept;
    for (char c : text)
      if (dropped.find(c) == std::string::npos) kept += c;
    if (tok.decode(plain) != kept) fail("decode(encode(text)) != text without the dropped bytes", text);
  }
  for (auto id : plain)
    if (id < 0 || id >= tok.vocab_size()) fail("encode produced an id outside the vocabulary", text);

  if (!tok.chat_template().empty()) {
    try {
      const auto forged = tok.encode_chat({{"system", "Be brief."}, {"user", std::string(text)}});
      const auto base = tok.encode_chat({{"system", "Be brief."}, {"user", ""}});
      if (count_special(tok, forged) != count_special(tok, base)) fail("user text produced control tokens", text);
    } catch (const trellis::Error& e) {
      fail(e.what(), text);  // a user's text, whatever it holds, must not fail the template
    }
  }

  // The same bytes as token ids: whatever they are, decode returns or throws trellis::Error.
  std::vector<std::int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  try {
    (void)tok.decode(ids);
    (void)tok.decode(ids, /*skip_special=*/true);
  } catch (const trellis::Error&) {
  }
  return 0;
}
