// Tokenizer: the byte-level BPE tokenizer of GPT-2-style models (SmolLM2, StarCoder, GPT-2),
// built from a GGUF file's tokenizer.ggml.* metadata, with encode, decode, special tokens
// and the ChatML chat template used by --chat.
//
// Encoding, as in the reference implementations (Hugging Face tokenizers, llama.cpp):
//  1. special tokens (token_type control or user-defined) are cut out of the text first
//     when parse_special is set, longest match first;
//  2. pre-tokenization: for tokenizer.ggml.pre = "smollm"/"starcoder"/"refact", every \p{N}
//     code point becomes its own piece; then, for those and "gpt2"/"default", the GPT-2
//     pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+;
//  3. each piece's bytes are mapped to GPT-2's printable byte alphabet and merged by rank
//     (tokenizer.ggml.merges order) until no known pair remains.
// Decoding maps the byte alphabet back to bytes; control tokens decode to their text unless
// skipped.
//
// Errors: kUnsupported naming the file for a tokenizer model or pre-tokenizer other than
// the ones above; kCorruptInput naming the file and key for inconsistent metadata;
// kInvalidArgument for a token id outside the vocabulary.
// Threading: immutable after construction; encode/decode may run on several threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/checkpoint/gguf.hpp"

namespace trellis::runtime {

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

class Tokenizer {
 public:
  static Tokenizer from_gguf(const gguf::GgufFile& file);
  static Tokenizer from_gguf(const std::filesystem::path& path);
  // The tokenizer of a model given as trellis run/eval take it: a .gguf file, or a
  // directory holding one (as open_checkpoint picks it). nullopt for other checkpoints
  // (safetensors: they carry no tokenizer trellis reads).
  static std::optional<Tokenizer> for_model(const std::filesystem::path& model);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`; with parse_special, "<|im_start|>" in the text is token 1 of
  // SmolLM2 rather than its characters. Adds BOS only when add_bos is set.
  std::vector<std::int32_t> encode(std::string_view text, bool parse_special = true, bool add_bos = false) const;
  // The bytes of `ids` (may end in the middle of a UTF-8 character when streaming).
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;
  // The bytes of one token (empty for a skipped special token).
  std::string token_bytes(std::int32_t id) const;

  std::int32_t vocab_size() const;
  std::int32_t bos_id() const;
  std::int32_t eos_id() const;
  // Ids that end generation: EOS plus, for ChatML models, <|im_end|>.
  const std::vector<std::int32_t>& stop_ids() const;
  bool add_bos_default() const;  // tokenizer.ggml.add_bos_token
  bool is_special(std::int32_t id) const;
  const std::string& pre_tokenizer() const;

  // tokenizer.chat_template (Jinja text), or empty when the file has none.
  const std::string& chat_template() const;
  // The conversation rendered by the model's chat template (tokenizer.chat_template),
  // ending with the assistant header when add_generation_prompt. Supports ChatML
  // templates (<|im_start|>role\ncontent<|im_end|>\n), including a default system message
  // the template inserts when the conversation has none. Throws kUnsupported otherwise.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The same conversation as token ids, safe for untrusted text: the template's own markers
  // (<|im_start|>, <|im_end|>) are control tokens, while every message's role and content
  // are encoded as plain text, so "<|im_start|>system" typed by a user stays characters and
  // cannot open a turn. Equal to encode(apply_chat_template(...)) when no content holds a
  // special token's text. kInvalidArgument for a role other than system/user/assistant.
  std::vector<std::int32_t> encode_chat(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt = true) const;

  // Pre-tokenization only (step 2 above), as byte strings: for tests and diagnostics.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::runtime
