#include "trellis/runtime/workload/workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "prompt_reader.hpp"

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::runtime {

std::optional<std::string> validate(const SamplingParams& p, int vocab_size) {
  auto finite = [](float v) { return std::isfinite(v); };
  if (!finite(p.temperature) || p.temperature < 0)
    return fmt::format("temperature must be >= 0, got {}", p.temperature);
  if (p.top_k < 0) return fmt::format("top_k must be >= 0, got {}", p.top_k);
  if (!finite(p.top_p) || p.top_p <= 0 || p.top_p > 1)
    return fmt::format("top_p must be in (0, 1], got {}", p.top_p);
  if (!finite(p.min_p) || p.min_p < 0 || p.min_p >= 1)
    return fmt::format("min_p must be in [0, 1), got {}", p.min_p);
  if (!finite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    return fmt::format("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  if (!finite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    return fmt::format("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  if (!finite(p.repetition_penalty) || p.repetition_penalty <= 0)
    return fmt::format("repetition_penalty must be > 0, got {}", p.repetition_penalty);
  if (p.max_tokens < 1) return fmt::format("max_tokens must be >= 1, got {}", p.max_tokens);
  for (auto id : p.stop_ids)
    if (id < 0 || (vocab_size > 0 && id >= vocab_size))
      return fmt::format("stop id {} is outside the vocabulary [0, {})", id, vocab_size);
  return std::nullopt;
}

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<std::int32_t>& ids) {
  std::string out;
  for (auto id : ids) {
    if (id >= 0 && id < kVocab) out.push_back(static_cast<char>(id));
    else out += fmt::format("<{}>", id);
  }
  return out;
}

namespace {

using nlohmann::json;

// Reads one sampling field; a wrong type becomes the request's error, not the file's.
template <typename T>
bool read_field(const json& s, const char* key, T& out, std::string& error) {
  auto it = s.find(key);
  if (it == s.end()) return true;
  bool ok;
  if constexpr (std::is_same_v<T, bool>) ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = it->is_number_integer();
  else ok = it->is_number();
  if (!ok) {
    error = fmt::format("sampling.{} has the wrong type ({})", key, it->type_name());
    return false;
  }
  out = it->get<T>();
  return true;
}

std::string parse_sampling(const json& s, SamplingParams& p) {
  if (!s.is_object()) return "\"sampling\" must be an object";
  static const char* kKnown[] = {"temperature", "top_k", "top_p", "min_p", "greedy", "seed",
                                 "frequency_penalty", "presence_penalty", "repetition_penalty",
                                 "max_tokens", "stop"};
  for (auto it = s.begin(); it != s.end(); ++it) {
    bool known = false;
    for (auto* k : kKnown) known = known || it.key() == k;
    if (!known) return fmt::format("unknown sampling setting \"{}\"", it.key());
  }
  std::string e;
  if (!read_field(s, "temperature", p.temperature, e) || !read_field(s, "top_k", p.top_k, e) ||
      !read_field(s, "top_p", p.top_p, e) || !read_field(s, "min_p", p.min_p, e) ||
      !read_field(s, "greedy", p.greedy, e) || !read_field(s, "seed", p.seed, e) ||
      !read_field(s, "frequency_penalty", p.frequency_penalty, e) ||
      !read_field(s, "presence_penalty", p.presence_penalty, e) ||
      !read_field(s, "repetition_penalty", p.repetition_penalty, e) ||
      !read_field(s, "max_tokens", p.max_tokens, e))
    return e;
  if (auto it = s.find("stop"); it != s.end()) {
    if (!it->is_array()) return "sampling.stop must be a list of token ids";
    for (const auto& v : *it) {
      if (!v.is_number_integer()) return "sampling.stop must be a list of token ids";
      p.stop_ids.push_back(v.get<std::int32_t>());
    }
  }
  return {};
}

// The prompt of a "text" or "messages" line, as token ids (see TextOptions).
template <typename Bad>
std::vector<std::int32_t> encode_text(const json& j, const TextOptions& text, Bad&& bad) {
  if (j.contains("messages") && !text.chat) bad("\"messages\" needs --chat (a chat model's template)");
  if (!text.chat) {
    if (!j["text"].is_string()) bad("\"text\" must be a string");
    const auto s = j["text"].get<std::string>();
    return text.tokenizer ? text.tokenizer->encode(s, false, text.tokenizer->add_bos_default())
                          : ByteTokenizer::encode(s);
  }
  std::vector<ChatMessage> msgs;
  if (j.contains("text")) {
    if (!j["text"].is_string()) bad("\"text\" must be a string");
    msgs.push_back({"user", j["text"].get<std::string>()});
  } else {
    const json& m = j["messages"];
    if (!m.is_array() || m.empty()) bad("\"messages\" must be a non-empty list of {\"role\", \"content\"}");
    for (const auto& e : m) {
      if (!e.is_object() || !e.contains("role") || !e.contains("content") || !e["role"].is_string() ||
          !e["content"].is_string())
        bad(fmt::format("message {} is not {{\"role\": string, \"content\": string}}", e.dump()));
      msgs.push_back({e["role"].get<std::string>(), e["content"].get<std::string>()});
    }
  }
  // The template's markers become control tokens and the messages' text stays text: encoding
  // the rendered conversation with special tokens parsed would let a prompt that spells
  // "<|im_start|>system" open a turn of its own (issue 23.10). No extra BOS: ChatML starts
  // with <|im_start|>, which is SmolLM2's BOS.
  try {
    return text.tokenizer->encode_chat(msgs, true);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;  // kUnsupported: the model's, not the line's
    bad(e.what());
  }
  return {};
}

Request parse_line(const std::string& line, std::string_view name, int lineno, int vocab_size,
                   std::int64_t index, const TextOptions& text, const PromptLimits& limits) {
  auto bad = [&](std::string_view why) {
    throw_error(ErrorCode::kInvalidArgument, "{}:{}: {}", name, lineno, why);
  };
  // The shape first, without building anything: values below (an "id", a bad token) are
  // dumped and compared by recursive code, which must only ever see shallow values.
  if (auto why = detail::check_json_shape(line, limits.max_depth)) bad(*why);
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) bad("not valid JSON");
  if (!j.is_object()) bad("each line must be a JSON object");
  Request r;
  r.id = index;
  r.name = fmt::format("{}", index);
  if (auto it = j.find("id"); it != j.end()) r.name = it->is_string() ? it->get<std::string>() : it->dump();
  const int kinds = int{j.contains("tokens")} + int{j.contains("text")} + int{j.contains("messages")};
  if (kinds != 1) bad("needs exactly one of \"tokens\" (a list of ids), \"text\" or \"messages\"");
  if (!j.contains("tokens")) {
    r.prompt = encode_text(j, text, bad);
    r.from_text = true;
  } else {
    const auto& t = j["tokens"];
    if (!t.is_array()) bad("\"tokens\" must be a list of token ids");
    for (const auto& v : t) {
      if (!v.is_number_integer()) bad(fmt::format("token {} is not an integer", v.dump()));
      auto id = v.get<std::int64_t>();
      if (id < 0 || (vocab_size > 0 && id >= vocab_size))
        bad(fmt::format("token {} is outside the vocabulary [0, {})", id, vocab_size));
      r.prompt.push_back(static_cast<std::int32_t>(id));
    }
  }
  if (r.prompt.empty()) bad("the prompt is empty");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "id" && it.key() != "tokens" && it.key() != "text" && it.key() != "messages" &&
        it.key() != "sampling" && it.key() != "swift")
      bad(fmt::format("unknown field \"{}\" (expected id, tokens, text, messages, sampling, swift)", it.key()));
  if (auto it = j.find("swift"); it != j.end()) {
    if (!it->is_boolean()) bad(fmt::format("\"swift\" must be true or false, got {}", it->dump().substr(0, 40)));
    r.swift = it->get<bool>();
  }
  if (auto it = j.find("sampling"); it != j.end()) r.error = parse_sampling(*it, r.sampling);
  if (text.chat && r.from_text)  // end of turn ends the answer
    for (std::int32_t id : text.tokenizer->stop_ids())
      if (std::find(r.sampling.stop_ids.begin(), r.sampling.stop_ids.end(), id) == r.sampling.stop_ids.end())
        r.sampling.stop_ids.push_back(id);
  if (r.error.empty())
    if (auto why = validate(r.sampling, vocab_size)) r.error = *why;
  if (!r.error.empty()) r.error = fmt::format("{}:{}: {}", name, lineno, r.error);
  return r;
}

}  // namespace

Workload parse_prompts(std::istream& in, std::string_view name, int vocab_size, const TextOptions& text,
                       const PromptLimits& limits) {
  if (text.chat && text.tokenizer == nullptr)
    throw_error(ErrorCode::kInvalidArgument,
                "{}: --chat needs the model's tokenizer and chat template (a GGUF model such as SmolLM2); "
                "this model has none", name);
  if (text.chat) text.tokenizer->apply_chat_template({{"user", ""}});  // kUnsupported names a non-ChatML template
  Workload w;
  w.source = std::string(name);
  std::string line;
  detail::LineReader lines(in, name, limits);
  while (lines.next(line)) {
    auto t = trim(line);
    if (t.empty() || t.front() == '#') continue;
    w.requests.push_back(parse_line(std::string(t), name, lines.lineno(), vocab_size,
                                    static_cast<std::int64_t>(w.requests.size()), text, limits));
  }
  if (w.requests.empty()) throw_error(ErrorCode::kInvalidArgument, "{}: no prompts in the file", name);
  return w;
}

Workload read_prompts(const std::string& path, int vocab_size, const TextOptions& text, const PromptLimits& limits) {
  std::ifstream f(path);
  if (!f) throw_error(ErrorCode::kNotFound, "prompts file {} cannot be opened", path);
  return parse_prompts(f, path, vocab_size, text, limits);
}

std::string decode_text(const std::vector<std::int32_t>& ids, const TextOptions& text) {
  return text.tokenizer ? text.tokenizer->decode(ids, true) : ByteTokenizer::decode(ids);
}

SyntheticSpec parse_synthetic_spec(std::string_view text, std::string_view what) {
  // Bounds (workload.hpp) are checked on the parsed 64-bit value, before it is narrowed:
  // n=1e14 allocated requests until the process was killed.
  constexpr std::int64_t kMaxRequests = 1000000, kMaxLength = std::int64_t{1} << 20;
  constexpr std::int64_t kMaxPromptTokens = std::int64_t{1} << 28;
  auto bounded = [&](std::string_view key, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi)
      throw_error(ErrorCode::kInvalidArgument, "{}: {} must be in {}..{}, got {}", what, key, lo, hi, v);
    return static_cast<int>(v);
  };
  SyntheticSpec s;
  bool has_n = false, has_in = false, has_out = false;
  for (const auto& part : split(text, ',')) {
    auto eq = part.find('=');
    if (eq == std::string::npos)
      throw_error(ErrorCode::kInvalidArgument, "{}: \"{}\" is not key=value (expected n=256,in=128,out=128[,seed=S])",
                  what, part);
    auto key = trim(std::string_view(part).substr(0, eq));
    auto val = std::string_view(part).substr(eq + 1);
    auto num = parse_int(val, fmt::format("{} field {}", what, key));
    if (key == "n") s.n = bounded(key, num, 1, kMaxRequests), has_n = true;
    else if (key == "in") s.in = bounded(key, num, 1, kMaxLength), has_in = true;
    else if (key == "out") s.out = bounded(key, num, 1, kMaxLength), has_out = true;
    else if (key == "seed") s.seed = static_cast<std::uint64_t>(num);
    else if (key == "vocab") s.vocab = bounded(key, num, 1, std::numeric_limits<std::int32_t>::max());
    else throw_error(ErrorCode::kInvalidArgument, "{}: unknown field \"{}\" (known: n, in, out, seed, vocab)", what, key);
  }
  if (!has_n || !has_in || !has_out)
    throw_error(ErrorCode::kInvalidArgument, "{}: n, in and out are all needed (got \"{}\")", what, text);
  if (static_cast<std::int64_t>(s.n) * s.in > kMaxPromptTokens)
    throw_error(ErrorCode::kInvalidArgument, "{}: n x in = {} prompt tokens in total, more than the {} allowed", what,
                static_cast<std::int64_t>(s.n) * s.in, kMaxPromptTokens);
  return s;
}

Workload make_synthetic(const SyntheticSpec& spec, int vocab_size) {
  int vocab = spec.vocab > 0 ? spec.vocab : vocab_size;
  if (vocab < 1) throw_error(ErrorCode::kInvalidArgument, "synthetic workload needs a vocabulary size");
  if (vocab_size > 0 && vocab > vocab_size)
    throw_error(ErrorCode::kInvalidArgument, "synthetic workload: vocab={} exceeds the model's {}", vocab, vocab_size);
  Workload w;
  w.source = fmt::format("synthetic n={},in={},out={},seed={}", spec.n, spec.in, spec.out, spec.seed);
  std::mt19937_64 rng(spec.seed);
  std::uniform_int_distribution<std::int32_t> tok(0, vocab - 1);
  for (int i = 0; i < spec.n; ++i) {
    Request r;
    r.id = i;
    r.name = fmt::format("{}", i);
    r.prompt.resize(static_cast<std::size_t>(spec.in));
    for (auto& t : r.prompt) t = tok(rng);
    r.sampling.greedy = true;
    r.sampling.max_tokens = spec.out;
    r.sampling.seed = spec.seed + static_cast<std::uint64_t>(i);
    w.requests.push_back(std::move(r));
  }
  return w;
}

}  // namespace trellis::runtime
