// The OpenAI API schema, declared once: request bodies of /v1/completions and
// /v1/chat/completions parsed and validated into a typed GenerationRequest, and the
// response objects (completions, chat completions, stream chunks, the model list, errors)
// written back as JSON text. Nothing here knows about sockets.
//
// Request fields (anything else is ignored, as OpenAI does):
//   model                 required; must equal the served model's name (404 model_not_found)
//   prompt                completions: a string, a list of token ids, or a list of one of those
//   messages              chat: [{role: system|user|assistant|developer, content: string or
//                         [{type: "text", text}]}] ("developer" is treated as "system")
//   max_tokens            >= 1 (chat: max_completion_tokens wins when both are given); the
//                         default is min(default_max_tokens, the context left by the prompt)
//   temperature [0, 2] (default 1; 0 is greedy), top_p (0, 1], top_k >= -1 (-1 and 0: all),
//   min_p [0, 1), seed (integer), frequency_penalty / presence_penalty [-2, 2],
//   repetition_penalty > 0, stop (string or up to 4 strings), n (only 1), stream,
//   stream_options.include_usage (only with stream), user (ignored)
// Refused as not supported when set to anything but their neutral value: logprobs,
// top_logprobs, echo, best_of, logit_bias, suffix, tools, tool_choice, functions,
// function_call, parallel_tool_calls, response_format (other than {"type": "text"}).
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/workload/request.hpp"
#include "trellis/serve/text_codec.hpp"

namespace trellis::serve {

enum class Endpoint { kCompletions, kChat };

// One request answered with an error: the HTTP status and OpenAI's error object
// {"error": {"message", "type", "param", "code"}}. `param` names the offending field.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt, std::string type = "");
  int status() const { return status_; }
  const std::optional<std::string>& param() const { return param_; }
  const std::optional<std::string>& code() const { return code_; }
  // "invalid_request_error" for 4xx, "server_error" for 5xx unless given.
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::optional<std::string> param_, code_;
  std::string type_;
};

// The JSON text of `e`'s error object.
std::string error_body(const ApiError& e);

// What parsing needs to know about the model and the engine.
struct ParseContext {
  std::string model_name;
  int vocab_size = 0;
  int max_context = 0;          // the engine's longest sequence (prompt + output)
  int default_max_tokens = 256;
  std::uint64_t default_seed = 0;  // used when the request gives no seed
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  runtime::Request request;        // prompt ids and sampling, stop ids included; id unset
  std::vector<std::string> stop;   // stop strings
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
};

// Parses and validates one request body. Throws ApiError (4xx) naming the field; never
// anything else for bad input. Calls runtime::validate on the sampling settings too.
GenerationRequest parse_generation(Endpoint endpoint, std::string_view body, const TextCodec& codec,
                                   const ParseContext& ctx);

// ---- responses ----

struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;         // "cmpl-..." or "chatcmpl-..."
  std::int64_t created = 0;  // Unix seconds
  std::string model;
};
struct Usage {
  std::int64_t prompt_tokens = 0, completion_tokens = 0;
};

// A whole (non-streamed) completion or chat completion.
std::string response_body(const ResponseMeta& meta, std::string_view text, std::string_view finish_reason,
                          const Usage& usage);
// One stream chunk's JSON (without "data: "): chat chunks carry delta {role} when `role` is
// set, {content} when `text` is given, {} otherwise; completion chunks carry text. A
// non-empty finish_reason marks the last content chunk. `with_usage` adds "usage": null.
std::string chunk_body(const ResponseMeta& meta, const std::string* role, const std::string* text,
                       std::string_view finish_reason, bool with_usage);
// The usage chunk that ends a stream with stream_options.include_usage: empty choices.
std::string usage_chunk_body(const ResponseMeta& meta, const Usage& usage);
// GET /v1/models and GET /v1/models/{id}.
std::string models_body(const std::string& model, std::int64_t created);
std::string model_body(const std::string& model, std::int64_t created);

}  // namespace trellis::serve
