// TextStream: one request's generated token ids turned into the text a client may see, as
// the tokens arrive.
//
//  * Stop strings: when the text generated so far contains one of them, everything from
//    the earliest match on is dropped and stopped() becomes true; later tokens are ignored.
//  * Hold-back: text that could still turn out to be the start of a stop string (a suffix
//    of the pending text that is a prefix of a stop string) is held until it cannot, so a
//    stream never shows a client the first half of a stop string.
//  * UTF-8: the trailing bytes of a character split across tokens are held until the
//    character is complete, so no chunk ends inside a character. Bytes that can never
//    become valid UTF-8 are passed on (the JSON writer replaces them with U+FFFD).
//
// Threading: one request's stream, used from one thread (its connection's strand).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/serve/text_codec.hpp"

namespace trellis::serve {

class TextStream {
 public:
  // `codec` must outlive the stream. Empty stop strings are ignored.
  TextStream(const TextCodec& codec, std::vector<std::string> stops);

  // Adds newly generated ids; returns the text that may be shown now (possibly empty).
  std::string push(std::span<const std::int32_t> ids);
  // Bytes directly (what push does after decoding); for tests and other decoders.
  std::string push_bytes(std::string_view bytes);
  // The generation ended without a stop string: releases whatever was held back.
  std::string finish();

  bool stopped() const { return stopped_; }
  // Everything released so far (the sum of push/finish results).
  const std::string& text() const { return text_; }

 private:
  std::string release(std::size_t n);

  const TextCodec& codec_;
  std::vector<std::string> stops_;
  std::string pending_;  // decoded, not yet released
  std::string text_;
  bool stopped_ = false;
};

// Length of the longest prefix of `s` that does not end inside a UTF-8 character that may
// still be completed by more bytes. Exposed for tests.
std::size_t utf8_complete_prefix(std::string_view s);

}  // namespace trellis::serve
