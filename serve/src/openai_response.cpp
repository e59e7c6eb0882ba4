// Response objects of the OpenAI API, written as OpenAI writes them.
#include <nlohmann/json.hpp>

#include "trellis/serve/openai.hpp"

namespace trellis::serve {
namespace {

using json = nlohmann::json;

// Generated text may hold bytes that are not UTF-8 (a model is free to emit them): they
// become U+FFFD rather than an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* object_name(Endpoint ep, bool chunk) {
  if (ep == Endpoint::kChat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";  // completions use the same name for chunks
}

json head(const ResponseMeta& m, bool chunk) {
  return json{{"id", m.id}, {"object", object_name(m.endpoint, chunk)}, {"created", m.created}, {"model", m.model}};
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json reason_json(std::string_view r) { return r.empty() ? json(nullptr) : json(std::string(r)); }

}  // namespace

ApiError::ApiError(int status, std::string message, std::optional<std::string> param, std::optional<std::string> code,
                   std::string type)
    : std::runtime_error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)),
      type_(type.empty() ? (status >= 500 ? "server_error" : "invalid_request_error") : std::move(type)) {}

std::string error_body(const ApiError& e) {
  json err{{"message", e.what()},
           {"type", e.type()},
           {"param", e.param() ? json(*e.param()) : json(nullptr)},
           {"code", e.code() ? json(*e.code()) : json(nullptr)}};
  return dump(json{{"error", err}});
}

std::string response_body(const ResponseMeta& meta, std::string_view text, std::string_view finish_reason,
                          const Usage& usage) {
  json j = head(meta, false);
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason_json(finish_reason)}};
  if (meta.endpoint == Endpoint::kChat)
    choice["message"] = json{{"role", "assistant"}, {"content", std::string(text)}};
  else
    choice["text"] = std::string(text);
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string chunk_body(const ResponseMeta& meta, const std::string* role, const std::string* text,
                       std::string_view finish_reason, bool with_usage) {
  json j = head(meta, true);
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason_json(finish_reason)}};
  if (meta.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (role) delta["role"] = *role;
    if (text) delta["content"] = *text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text ? *text : std::string();
  }
  j["choices"] = json::array({choice});
  if (with_usage) j["usage"] = nullptr;
  return dump(j);
}

std::string usage_chunk_body(const ResponseMeta& meta, const Usage& usage) {
  json j = head(meta, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string model_body(const std::string& model, std::int64_t created) {
  return dump(json{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "trellis"}});
}

std::string models_body(const std::string& model, std::int64_t created) {
  json m{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "trellis"}};
  return dump(json{{"object", "list"}, {"data", json::array({m})}});
}

}  // namespace trellis::serve
