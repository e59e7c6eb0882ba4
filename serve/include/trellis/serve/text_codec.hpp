// TextCodec: text <-> token ids for the model a server serves, as the HTTP layer needs them.
//
// Two implementations:
//  * make_tokenizer_codec: the model's own tokenizer (a GGUF model). User text is encoded
//    with special tokens left as text ("<|im_start|>" typed by a user stays characters), with
//    BOS when the model asks for it (tokenizer.ggml.add_bos_token); chat goes through
//    Tokenizer::encode_chat, which renders the model's ChatML template and is safe against
//    role injection. decode skips special tokens; chat_stop_ids are EOS and end-of-turn.
//  * make_byte_codec: one token per byte (ids 0..255), for synthetic models and tests. Id 0
//    (the NUL byte) plays EOS / end of turn: it is the only stop id and decodes to nothing, as
//    do ids >= 256. Its chat format is one line per message, "ROLE: CONTENT\n", followed by
//    "assistant: " (so {user, "hi"} becomes "user: hi\nassistant: ").
//
// decode must be exact per token: decode(a ++ b) == decode(a) + decode(b). Both codecs
// here are byte-level, where that holds; the server decodes each new token on its own and
// deals with UTF-8 characters split across tokens itself.
//
// Threading: immutable; every member may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/tokenizer/tokenizer.hpp"

namespace trellis::serve {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Ids of user text: special tokens stay text. May return ids >= vocab_size() (the byte
  // codec under a vocabulary smaller than 256); the server rejects those requests.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Whether encode_chat works (a tokenizer without a ChatML template has no chat).
  virtual bool has_chat() const = 0;
  // The conversation rendered by the chat template, ending with the assistant's header.
  // Roles are "system", "user" or "assistant" (trellis::Error kInvalidArgument otherwise).
  virtual std::vector<std::int32_t> encode_chat(const std::vector<runtime::ChatMessage>& messages) const = 0;
  // The bytes of `ids`, special tokens skipped; may end inside a UTF-8 character.
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  // Ids that end a generation (end of turn, EOS).
  virtual std::vector<std::int32_t> chat_stop_ids() const = 0;
  virtual int vocab_size() const = 0;
};

// `tok` must outlive the codec.
std::unique_ptr<TextCodec> make_tokenizer_codec(const runtime::Tokenizer& tok);
// `vocab_size` >= 1 (kInvalidArgument otherwise): the model's vocabulary.
std::unique_ptr<TextCodec> make_byte_codec(int vocab_size);

}  // namespace trellis::serve
