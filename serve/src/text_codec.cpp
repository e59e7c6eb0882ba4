#include "trellis/serve/text_codec.hpp"

#include <spdlog/spdlog.h>

#include "trellis/core/error.hpp"

namespace trellis::serve {
namespace {

class TokenizerCodec final : public TextCodec {
 public:
  explicit TokenizerCodec(const runtime::Tokenizer& tok) : tok_(tok), stops_(tok.stop_ids()) {
    // Probe the template once: apply_chat_template throws kUnsupported for anything but
    // ChatML, and a request should hear "no chat" rather than that error.
    try {
      (void)tok_.apply_chat_template({{"user", "x"}});
      has_chat_ = true;
    } catch (const Error& e) {
      spdlog::warn("serve: the model's chat template cannot be used ({}); /v1/chat/completions will refuse requests",
                   e.what());
    }
  }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    return tok_.encode(text, /*parse_special=*/false, tok_.add_bos_default());
  }
  bool has_chat() const override { return has_chat_; }
  std::vector<std::int32_t> encode_chat(const std::vector<runtime::ChatMessage>& messages) const override {
    return tok_.encode_chat(messages, /*add_generation_prompt=*/true);
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    return tok_.decode(ids, /*skip_special=*/true);
  }
  std::vector<std::int32_t> chat_stop_ids() const override { return stops_; }
  int vocab_size() const override { return tok_.vocab_size(); }

 private:
  const runtime::Tokenizer& tok_;
  std::vector<std::int32_t> stops_;
  bool has_chat_ = false;
};

class ByteCodec final : public TextCodec {
 public:
  explicit ByteCodec(int vocab) : vocab_(vocab) {}
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  bool has_chat() const override { return true; }
  std::vector<std::int32_t> encode_chat(const std::vector<runtime::ChatMessage>& messages) const override {
    std::string text;
    for (const auto& m : messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant")
        throw_error(ErrorCode::kInvalidArgument, "chat role must be system, user or assistant, got '{}'", m.role);
      text += m.role + ": " + m.content + "\n";
    }
    text += "assistant: ";
    return encode(text);
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (auto id : ids)
      if (id > 0 && id < 256) out.push_back(static_cast<char>(id));
    return out;
  }
  std::vector<std::int32_t> chat_stop_ids() const override { return {0}; }
  int vocab_size() const override { return vocab_; }

 private:
  int vocab_;
};

}  // namespace

std::unique_ptr<TextCodec> make_tokenizer_codec(const runtime::Tokenizer& tok) {
  return std::make_unique<TokenizerCodec>(tok);
}

std::unique_ptr<TextCodec> make_byte_codec(int vocab_size) {
  if (vocab_size < 1) throw_error(ErrorCode::kInvalidArgument, "byte codec: vocab_size must be >= 1, got {}", vocab_size);
  return std::make_unique<ByteCodec>(vocab_size);
}

}  // namespace trellis::serve
