// Request parsing for the OpenAI endpoints (see openai.hpp for the accepted fields).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"
#include "trellis/serve/openai.hpp"

namespace trellis::serve {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

// A field that is present and not null, or nullptr: OpenAI treats null as "not given".
const json* field(const json& o, const char* name) {
  auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> opt_number(const json& o, const char* name) {
  const json* v = field(o, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(name, fmt::format("'{}' must be a number, got {}", name, v->type_name()));
  return v->get<double>();
}

std::optional<std::int64_t> opt_int(const json& o, const char* name) {
  const json* v = field(o, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad(name, fmt::format("'{}' must be an integer, got {}", name, v->dump()));
  if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
    bad(name, fmt::format("'{}' is too large: {}", name, v->dump()));
  const auto x = v->get<std::int64_t>();
  if (x < std::numeric_limits<int>::min()) bad(name, fmt::format("'{}' is too small: {}", name, x));
  return x;
}

std::optional<bool> opt_bool(const json& o, const char* name) {
  const json* v = field(o, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean, got {}", name, v->type_name()));
  return v->get<bool>();
}

// Checks lo <= x <= hi, with an open end where asked; the message shows the interval.
void check_range(const char* name, double x, double lo, double hi, bool lo_open = false, bool hi_open = false) {
  const bool ok = (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi) && std::isfinite(x);
  if (!ok)
    bad(name, fmt::format("'{}' must be in {}{:g}, {:g}{}, got {:g}", name, lo_open ? "(" : "[", lo, hi,
                          hi_open ? ")" : "]", x));
}

// Fields this server does not implement: refused unless they hold their neutral value,
// so a client that sends "logprobs": false or "n": 1 explicitly still works.
void reject_unsupported(const json& o) {
  static const char* const kNames[] = {"logprobs", "top_logprobs", "echo", "best_of", "logit_bias", "suffix",
                                       "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
                                       "response_format"};
  for (const char* name : kNames) {
    const json* v = field(o, name);
    if (!v) continue;
    const std::string_view n = name;
    const bool neutral = (v->is_boolean() && !v->get<bool>()) || (v->is_string() && v->get<std::string>().empty()) ||
                         ((v->is_array() || v->is_object()) && v->empty()) ||
                         (n == "best_of" && *v == 1) || (n == "top_logprobs" && *v == 0) ||
                         (n == "tool_choice" && *v == "none") || (n == "parallel_tool_calls" && v->is_boolean()) ||
                         (n == "response_format" && v->is_object() && v->value("type", "") == "text");
    if (!neutral) bad(name, fmt::format("'{}' is not supported by this server", name));
  }
}

void check_model(const json& o, const ParseContext& ctx) {
  const json* m = field(o, "model");
  if (!m) bad("model", "you must provide a model parameter ('model')");
  if (!m->is_string()) bad("model", fmt::format("'model' must be a string, got {}", m->type_name()));
  const auto name = m->get<std::string>();
  if (name != ctx.model_name)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, ctx.model_name),
                   "model", "model_not_found");
}

bool all_integers(const json& a) {
  return std::all_of(a.begin(), a.end(), [](const json& x) { return x.is_number_integer(); });
}

std::vector<std::int32_t> token_list(const json& a) {
  std::vector<std::int32_t> ids;
  for (const auto& x : a) {
    if (x.is_number_unsigned() ? x.get<std::uint64_t>() > 0x7fffffffULL : x.get<std::int64_t>() < 0)
      bad("prompt", fmt::format("prompt token id {} is out of range", x.dump()));
    ids.push_back(static_cast<std::int32_t>(x.get<std::int64_t>()));
  }
  return ids;
}

std::vector<std::int32_t> parse_prompt(const json& o, const TextCodec& codec) {
  const json* p = field(o, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  if (p->is_string()) return codec.encode(p->get<std::string>());
  if (!p->is_array())
    bad("prompt", fmt::format("'prompt' must be a string or a list of token ids, got {}", p->type_name()));
  if (p->empty()) bad("prompt", "'prompt' is an empty list");
  if (all_integers(*p)) return token_list(*p);
  const bool strings = std::all_of(p->begin(), p->end(), [](const json& x) { return x.is_string(); });
  const bool lists = std::all_of(p->begin(), p->end(), [](const json& x) { return x.is_array() && all_integers(x); });
  if (!strings && !lists)
    bad("prompt", "'prompt' must be a string, a list of token ids, or a list holding one of those");
  if (p->size() > 1)
    bad("prompt", fmt::format("only one prompt per request is supported; got a list of {}", p->size()));
  const json& one = (*p)[0];
  return strings ? codec.encode(one.get<std::string>()) : token_list(one);
}

std::string message_content(const json& m, std::size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  const json* c = field(m, "content");
  if (!c) bad(param, fmt::format("{} is required", param));
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array())
    bad(param, fmt::format("{} must be a string or a list of text parts, got {}", param, c->type_name()));
  std::string text;
  for (const auto& part : *c) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(param, fmt::format("every part of {} must be an object with a 'type'", param));
    const auto type = part["type"].get<std::string>();
    if (type != "text") bad(param, fmt::format("content part type '{}' is not supported; only 'text' is", type));
    const json* t = field(part, "text");
    if (!t || !t->is_string()) bad(param, fmt::format("a text part of {} needs a string 'text'", param));
    text += t->get<std::string>();
  }
  return text;
}

std::vector<std::int32_t> parse_messages(const json& o, const TextCodec& codec) {
  if (!codec.has_chat())
    throw ApiError(400, "this model has no chat template; use /v1/completions with a prompt instead", "messages");
  const json* ms = field(o, "messages");
  if (!ms) bad("messages", "'messages' is required");
  if (!ms->is_array() || ms->empty()) bad("messages", "'messages' must be a non-empty list of messages");
  std::vector<runtime::ChatMessage> chat;
  for (std::size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    if (!m.is_object()) bad(fmt::format("messages[{}]", i), fmt::format("messages[{}] must be an object", i));
    const json* r = field(m, "role");
    const std::string param = fmt::format("messages[{}].role", i);
    if (!r || !r->is_string()) bad(param, fmt::format("{} must be a string", param));
    auto role = r->get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant")
      bad(param, fmt::format("{} must be 'system', 'user' or 'assistant', got '{}'", param, role));
    chat.push_back({role, message_content(m, i)});
  }
  try {
    return codec.encode_chat(chat);
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

void parse_max_tokens(const json& o, Endpoint ep, std::size_t prompt, const ParseContext& ctx,
                      runtime::SamplingParams& sp) {
  const char* name = "max_tokens";
  auto given = opt_int(o, name);
  if (ep == Endpoint::kChat) {
    if (auto mct = opt_int(o, "max_completion_tokens")) {
      given = mct;
      name = "max_completion_tokens";
    }
  }
  const char* prompt_param = ep == Endpoint::kChat ? "messages" : "prompt";
  const auto p = static_cast<std::int64_t>(prompt);
  if (ctx.max_context > 0 && p >= ctx.max_context)
    bad(prompt_param, fmt::format("the prompt has {} tokens but this model's context holds {} (the prompt plus at "
                                  "least one new token must fit)",
                                  p, ctx.max_context));
  if (given) {
    if (*given < 1) bad(name, fmt::format("'{}' must be at least 1, got {}", name, *given));
    if (ctx.max_context > 0 && p + *given > ctx.max_context)
      bad(name, fmt::format("'{}' is {} but the prompt's {} tokens leave room for {} in this model's context of {} "
                            "tokens",
                            name, *given, p, ctx.max_context - p, ctx.max_context));
    sp.max_tokens = static_cast<int>(*given);
  } else {
    std::int64_t def = std::max(1, ctx.default_max_tokens);
    if (ctx.max_context > 0) def = std::min<std::int64_t>(def, ctx.max_context - p);
    sp.max_tokens = static_cast<int>(def);
  }
}

void parse_sampling(const json& o, runtime::SamplingParams& sp, const ParseContext& ctx) {
  if (auto t = opt_number(o, "temperature")) {
    check_range("temperature", *t, 0, 2);
    sp.temperature = static_cast<float>(*t);
  }
  sp.greedy = sp.temperature == 0.0f;
  if (auto v = opt_number(o, "top_p")) {
    check_range("top_p", *v, 0, 1, /*lo_open=*/true);
    sp.top_p = static_cast<float>(*v);
  }
  if (auto k = opt_int(o, "top_k")) {
    if (*k < -1) bad("top_k", fmt::format("'top_k' must be -1 (all tokens) or >= 0, got {}", *k));
    sp.top_k = *k < 0 ? 0 : static_cast<int>(*k);
  }
  if (auto v = opt_number(o, "min_p")) {
    check_range("min_p", *v, 0, 1, false, /*hi_open=*/true);
    sp.min_p = static_cast<float>(*v);
  }
  for (const char* name : {"frequency_penalty", "presence_penalty"}) {
    if (auto v = opt_number(o, name)) {
      check_range(name, *v, -2, 2);
      (std::string_view(name) == "frequency_penalty" ? sp.frequency_penalty : sp.presence_penalty) =
          static_cast<float>(*v);
    }
  }
  if (auto v = opt_number(o, "repetition_penalty")) {
    if (!(*v > 0) || !std::isfinite(*v))
      bad("repetition_penalty", fmt::format("'repetition_penalty' must be > 0, got {:g}", *v));
    sp.repetition_penalty = static_cast<float>(*v);
  }
  sp.seed = ctx.default_seed;
  if (const json* s = field(o, "seed")) {
    if (!s->is_number_integer()) bad("seed", fmt::format("'seed' must be an integer, got {}", s->dump()));
    sp.seed = s->is_number_unsigned() ? s->get<std::uint64_t>() : static_cast<std::uint64_t>(s->get<std::int64_t>());
  }
}

std::vector<std::string> parse_stop(const json& o) {
  const json* s = field(o, "stop");
  if (!s) return {};
  if (s->is_string()) return {s->get<std::string>()};
  if (!s->is_array()) bad("stop", fmt::format("'stop' must be a string or a list of strings, got {}", s->type_name()));
  if (s->size() > 4) bad("stop", fmt::format("'stop' holds at most 4 strings, got {}", s->size()));
  std::vector<std::string> out;
  for (const auto& x : *s) {
    if (!x.is_string()) bad("stop", fmt::format("every 'stop' entry must be a string, got {}", x.type_name()));
    out.push_back(x.get<std::string>());
  }
  return out;
}

// The field runtime::validate complains about: its messages start with the setting's name.
std::optional<std::string> param_of(const std::string& message) {
  for (const char* n : {"temperature", "top_k", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                        "repetition_penalty", "max_tokens"})
    if (message.rfind(n, 0) == 0) return std::string(n);
  return std::nullopt;
}

}  // namespace

GenerationRequest parse_generation(Endpoint endpoint, std::string_view body, const TextCodec& codec,
                                   const ParseContext& ctx) {
  json o;
  try {
    o = json::parse(body);
  } catch (const json::exception& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!o.is_object())
    throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", o.type_name()));
  check_model(o, ctx);
  reject_unsupported(o);
  if (auto n = opt_int(o, "n"); n && *n != 1) bad("n", fmt::format("only n=1 is supported, got n={}", *n));

  GenerationRequest g;
  g.endpoint = endpoint;
  auto& r = g.request;
  r.prompt = endpoint == Endpoint::kChat ? parse_messages(o, codec) : parse_prompt(o, codec);
  r.from_text = true;
  const char* prompt_param = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (r.prompt.empty()) bad(prompt_param, "the prompt is empty (it needs at least one token)");
  for (auto id : r.prompt)
    if (id < 0 || (codec.vocab_size() > 0 && id >= codec.vocab_size()))
      bad(prompt_param, fmt::format("the prompt holds token id {}, outside this model's vocabulary of {}", id,
                                    codec.vocab_size()));
  parse_max_tokens(o, endpoint, r.prompt.size(), ctx, r.sampling);
  parse_sampling(o, r.sampling, ctx);
  g.stop = parse_stop(o);
  r.sampling.stop_ids = codec.chat_stop_ids();
  g.stream = opt_bool(o, "stream").value_or(false);
  if (const json* so = field(o, "stream_options")) {
    if (!g.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    g.include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  if (auto why = runtime::validate(r.sampling, codec.vocab_size())) throw ApiError(400, *why, param_of(*why));
  return g;
}

}  // namespace trellis::serve
