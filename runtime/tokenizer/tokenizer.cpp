// Byte-level BPE: vocabulary and merge ranks from GGUF metadata, special-token splitting,
// and GPT-2's byte <-> printable-character alphabet.
#include "trellis/runtime/tokenizer/tokenizer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <unordered_map>

#include "tokenizer/pre_tokenize.hpp"
#include "trellis/core/error.hpp"

namespace trellis::runtime {
namespace {

constexpr std::int32_t kTypeNormal = 1, kTypeControl = 3, kTypeUserDefined = 4;

void append_utf8(std::string& s, char32_t c) {
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xc0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xe0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (c & 0x3f));
  }
}

// GPT-2's reversible map from the 256 byte values to printable code points: printable
// Latin-1 bytes map to themselves, the rest to U+0100 onwards in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_text;
  std::unordered_map<char32_t, std::uint8_t> to_byte;
  ByteAlphabet() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(to_text[b], c);
      to_byte[c] = static_cast<std::uint8_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

struct Tokenizer::Impl {
  std::string file;
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  std::unordered_map<std::string, std::int32_t> ids;
  std::unordered_map<std::string, std::int32_t> merge_rank;  // "left right" -> rank
  std::vector<std::int32_t> specials;                         // longest text first
  std::string pre;
  bool split_digits = false;
  std::int32_t bos = -1, eos = -1;
  bool add_bos = false;
  std::vector<std::int32_t> stops;
  std::string chat_template;
  // Whether a byte without a symbol of its own was dropped yet (said once per tokenizer).
  mutable std::atomic<bool> dropped_said{false};

  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out) const;
};

namespace {

std::vector<std::string> string_array(const gguf::GgufFile& f, const char* key) {
  std::vector<std::string> out;
  const std::string what = f.name() + ": " + key;
  for (const gguf::Value& v : f.require(key).as_array(what)) out.push_back(v.as_string(what));
  return out;
}

std::int32_t token_id(const gguf::GgufFile& f, const char* key, std::size_t n) {
  const gguf::Value* v = f.find(key);
  if (v == nullptr) return -1;
  const std::int64_t id = v->as_int(f.name() + ": " + key);
  if (id < 0 || static_cast<std::size_t>(id) >= n)
    throw_error(ErrorCode::kCorruptInput, "{}: {} = {} is outside the {}-token vocabulary", f.name(), key, id, n);
  return static_cast<std::int32_t>(id);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::filesystem::path& path) { return from_gguf(*gguf::GgufFile::open(path)); }

std::optional<Tokenizer> Tokenizer::for_model(const std::filesystem::path& model) {
  namespace fs = std::filesystem;
  if (model.empty()) return std::nullopt;
  if (fs::is_regular_file(model) && model.extension() == ".gguf") return from_gguf(model);
  // A directory: safetensors first, then the first *.gguf, the order open_checkpoint uses.
  if (!fs::is_directory(model) || fs::exists(model / "model.safetensors") ||
      fs::exists(model / "model.safetensors.index.json"))
    return std::nullopt;
  for (const auto& e : fs::directory_iterator(model))
    if (e.path().extension() == ".gguf") return from_gguf(e.path());
  return std::nullopt;
}

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& f) {
  auto m = std::make_unique<Impl>();
  m->file = f.name();
  const std::string model = f.require("tokenizer.ggml.model").as_string(f.name() + ": tokenizer.ggml.model");
  if (model != "gpt2")
    throw_error(ErrorCode::kUnsupported, "{}: tokenizer.ggml.model '{}' (trellis implements 'gpt2' byte-level BPE)",
                f.name(), model);
  const gguf::Value* pre = f.find("tokenizer.ggml.pre");
  m->pre = pre ? pre->as_string(f.name() + ": tokenizer.ggml.pre") : "default";
  if (m->pre == "smollm" || m->pre == "starcoder" || m->pre == "refact") m->split_digits = true;
  else if (m->pre != "gpt2" && m->pre != "default")
    throw_error(ErrorCode::kUnsupported,
                "{}: pre-tokenizer '{}' (trellis implements smollm, starcoder, refact, gpt2, default)", f.name(),
                m->pre);

  m->tokens = string_array(f, "tokenizer.ggml.tokens");
  const std::size_t n = m->tokens.size();
  if (n == 0 || n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw_error(ErrorCode::kCorruptInput, "{}: tokenizer.ggml.tokens has {} entries", f.name(), n);
  m->types.assign(n, kTypeNormal);
  if (const gguf::Value* tt = f.find("tokenizer.ggml.token_type")) {
    const auto& items = tt->as_array(f.name() + ": tokenizer.ggml.token_type");
    if (items.size() != n)
      throw_error(ErrorCode::kCorruptInput, "{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.name(),
                  items.size(), n);
    for (std::size_t i = 0; i < n; ++i)
      m->types[i] = static_cast<std::int32_t>(items[i].as_int(f.name() + ": tokenizer.ggml.token_type"));
  }
  for (std::size_t i = 0; i < n; ++i) {
    m->ids.emplace(m->tokens[i], static_cast<std::int32_t>(i));  // first id wins on duplicates
    if ((m->types[i] == kTypeControl || m->types[i] == kTypeUserDefined) && !m->tokens[i].empty())
      m->specials.push_back(static_cast<std::int32_t>(i));
  }
  std::stable_sort(m->specials.begin(), m->specials.end(),
                   [&](std::int32_t a, std::int32_t b) { return m->tokens[a].size() > m->tokens[b].size(); });
  const auto merges = string_array(f, "tokenizer.ggml.merges");
  for (std::size_t r = 0; r < merges.size(); ++r) {
    if (merges[r].find(' ') == std::string::npos)
      throw_error(ErrorCode::kCorruptInput, "{}: tokenizer.ggml.merges[{}] '{}' is not 'left right'", f.name(), r,
                  merges[r]);
    m->merge_rank.emplace(merges[r], static_cast<std::int32_t>(r));
  }
  m->bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
  m->eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
  if (const gguf::Value* v = f.find("tokenizer.ggml.add_bos_token")) m->add_bos = v->as_bool("add_bos_token");
  if (m->eos >= 0) m->stops.push_back(m->eos);
  // End-of-turn / end-of-message ids, when the file names them (llama.cpp's EOG set).
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (f.find(key))
      if (std::int32_t id = token_id(f, key, n); id >= 0 && id != m->eos) m->stops.push_back(id);
  if (auto it = m->ids.find("<|im_end|>"); it != m->ids.end() && it->second != m->eos) m->stops.push_back(it->second);
  if (auto it = m->ids.find("<|endoftext|>"); it != m->ids.end() && it->second != m->eos) m->stops.push_back(it->second);
  for (std::size_t i = 1; i < m->stops.size(); ++i)  // each id once, first mention kept
    if (std::find(m->stops.begin(), m->stops.begin() + static_cast<std::ptrdiff_t>(i), m->stops[i]) !=
        m->stops.begin() + static_cast<std::ptrdiff_t>(i))
      m->stops.erase(m->stops.begin() + static_cast<std::ptrdiff_t>(i--));
  if (const gguf::Value* v = f.find("tokenizer.chat_template")) m->chat_template = v->as_string("chat_template");
  return Tokenizer(std::move(m));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  // Symbols: one per byte, in the printable alphabet.
  std::vector<std::string> sym;
  sym.reserve(piece.size());
  for (unsigned char b : piece) sym.push_back(alphabet().to_text[b]);
  std::string key;
  while (sym.size() > 1) {
    std::int32_t best = std::numeric_limits<std::int32_t>::max();
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      key.assign(sym[i]).append(" ").append(sym[i + 1]);
      auto it = merge_rank.find(key);
      if (it != merge_rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<std::int32_t>::max()) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (const std::string& s : sym) {
    if (auto it = ids.find(s); it != ids.end()) {
      out.push_back(it->second);
      continue;
    }
    // A merged symbol without a token of its own: fall back to its single characters.
    for (std::size_t p = 0; p < s.size();) {
      std::size_t len;
      tokenizer::decode_utf8(s, p, len);
      auto it = ids.find(s.substr(p, len));
      // Byte-level vocabularies may leave out the symbols of bytes that rarely or never
      // occur in text: SmolLM2 has none for 21 of the 256 (0x04, 0x06, ..., 0xF1, 0xFF; found
      // by fuzz/tokenizer_fuzz.cpp, which saw an exception here). The model's own tokenizer
      // (Hugging Face tokenizers) and llama.cpp drop such a byte, so the model has never seen
      // one; trellis drops it too, with the same ids as both, and says so once.
      if (it == ids.end()) {
        if (!dropped_said.exchange(true))
          spdlog::warn("{}: the vocabulary has no symbol for a byte of the text ('{}'); such bytes are dropped, "
                       "as the model's own tokenizer does", file, s.substr(p, len));
        p += len;
        continue;
      }
      out.push_back(it->second);
      p += len;
    }
  }
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<std::int32_t>& out) const {
  for (const tokenizer::Piece& p : tokenizer::pre_tokenize(text, split_digits))
    bpe(text.substr(p.begin, p.end - p.begin), out);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool parse_special, bool add_bos) const {
  std::vector<std::int32_t> out;
  if (add_bos && impl_->bos >= 0) out.push_back(impl_->bos);
  if (!parse_special || impl_->specials.empty()) {
    impl_->encode_plain(text, out);
    return out;
  }
  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    std::int32_t hit = -1;
    for (std::int32_t id : impl_->specials)
      if (text.compare(i, impl_->tokens[id].size(), impl_->tokens[id]) == 0) {
        hit = id;
        break;
      }
    if (hit < 0) {
      ++i;
      continue;
    }
    impl_->encode_plain(text.substr(start, i - start), out);
    out.push_back(hit);
    i += impl_->tokens[hit].size();
    start = i;
  }
  impl_->encode_plain(text.substr(start), out);
  return out;
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw_error(ErrorCode::kInvalidArgument, "{}: token id {} outside the {}-token vocabulary", impl_->file, id,
                vocab_size());
  const std::string& t = impl_->tokens[static_cast<std::size_t>(id)];
  if (impl_->types[static_cast<std::size_t>(id)] != kTypeNormal) return t;
  std::string out;
  for (std::size_t p = 0; p < t.size();) {
    std::size_t len;
    char32_t c = tokenizer::decode_utf8(t, p, len);
    auto it = alphabet().to_byte.find(c);
    if (it != alphabet().to_byte.end()) out += static_cast<char>(it->second);
    else out.append(t, p, len);
    p += len;
  }
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

std::int32_t Tokenizer::vocab_size() const { return static_cast<std::int32_t>(impl_->tokens.size()); }
std::int32_t Tokenizer::bos_id() const { return impl_->bos; }
std::int32_t Tokenizer::eos_id() const { return impl_->eos; }
const std::vector<std::int32_t>& Tokenizer::stop_ids() const { return impl_->stops; }
bool Tokenizer::add_bos_default() const { return impl_->add_bos; }
const std::string& Tokenizer::pre_tokenizer() const { return impl_->pre; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

bool Tokenizer::is_special(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const std::int32_t t = impl_->types[static_cast<std::size_t>(id)];
  return t == kTypeControl || t == kTypeUserDefined;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const tokenizer::Piece& p : tokenizer::pre_tokenize(text, impl_->split_digits))
    out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

}  // namespace trellis::runtime
