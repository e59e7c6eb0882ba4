// Workloads: the list of requests for one run, read from a prompts file (JSONL) or made from
// a synthetic spec, plus the built-in byte-level tokenizer for text prompts.
//
// Prompts file: one JSON object per line (blank lines and lines starting with '#' skipped):
//   {"id": "q1", "tokens": [1, 2, 3], "sampling": {"temperature": 0.7, "top_k": 40,
//    "top_p": 0.9, "min_p": 0.05, "greedy": false, "seed": 7, "frequency_penalty": 0.1,
//    "presence_penalty": 0.0, "repetition_penalty": 1.1, "max_tokens": 32, "stop": [2]}}
//   {"text": "Once upon a time", "sampling": {"greedy": true, "max_tokens": 8}}
// Exactly one of "tokens" / "text" (or, with TextOptions::chat, "messages": a list of
// {"role": ..., "content": ...}). "text" is encoded by TextOptions::tokenizer (the model's
// own, for a GGUF model) or else by the byte tokenizer. With TextOptions::chat, "text" is
// one user message and "messages" a conversation; both are rendered by the model's chat
// template (ending with the assistant header) and the tokenizer's stop ids (EOS,
// end-of-turn) are added to the request's stop list; "tokens" prompts are used as given.
// A line that is not a JSON object, lacks a prompt, or
// has an empty or non-integer token list makes the whole file invalid: kInvalidArgument
// naming the file and line. The file is untrusted input, read within PromptLimits: a line
// longer than max_line_bytes, a file longer than max_file_bytes, or a value nested deeper
// than max_depth (checked before any value is built, naming the top-level field) is
// refused the same way. A bad sampling setting (unknown key, wrong type, out of range)
// only fails that request: Request::error says why and the other requests run.
//
// Synthetic spec: "n=256,in=128,out=128[,seed=S][,vocab=V]": n requests, each with `in`
// random prompt tokens (seeded, uniform below the vocabulary) and exactly `out` greedy new
// tokens (no stop ids), like the fixed-length workloads of SiPipe §7. Bounded: n up to
// 1,000,000, in and out up to 2^20 each, n x in up to 2^28 prompt tokens (1 GiB of ids).
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/tokenizer/tokenizer.hpp"
#include "trellis/runtime/workload/request.hpp"

namespace trellis::runtime {

// Byte-level tokenizer: token id = byte value (0..255). Works with any model whose
// vocabulary has at least 256 entries; ids >= 256 decode as "<id>".
struct ByteTokenizer {
  static constexpr int kVocab = 256;
  static std::vector<std::int32_t> encode(std::string_view text);
  static std::string decode(const std::vector<std::int32_t>& ids);
};

// How "text" prompts become token ids and generated ids become text.
struct TextOptions {
  const Tokenizer* tokenizer = nullptr;  // nullptr: ByteTokenizer (not owned; outlives parsing)
  bool chat = false;                     // apply the chat template (needs a tokenizer)
};
// Generated ids as text: the tokenizer's decoding with special tokens (<|im_end|>) left
// out, or the byte tokenizer's.
std::string decode_text(const std::vector<std::int32_t>& ids, const TextOptions& text);

struct Workload {
  std::vector<Request> requests;
  std::string source;  // "prompts.jsonl" or "synthetic n=..,in=..,out=.."
};

// Bounds on a prompts file. A real line nests 3 deep ("messages": object > list > object);
// a prompt of a million tokens is ~7 MiB of JSON.
struct PromptLimits {
  std::size_t max_line_bytes = std::size_t{16} << 20;
  std::size_t max_file_bytes = std::size_t{1} << 30;
  int max_depth = 16;
};

// Reads a prompts file. `vocab_size` (> 0) also checks token and stop ids against the model.
// kInvalidArgument when text.chat is set without a tokenizer; kUnsupported (from the
// tokenizer) when the model's chat template is not ChatML.
// With text.chat, prompts are encoded by Tokenizer::encode_chat: the template's markers are
// control tokens and each message's text is plain text, so a prompt that spells
// "<|im_start|>system" cannot open a turn of its own.
Workload read_prompts(const std::string& path, int vocab_size, const TextOptions& text = {},
                      const PromptLimits& limits = {});
// Same, from a stream; `name` is used in messages.
Workload parse_prompts(std::istream& in, std::string_view name, int vocab_size, const TextOptions& text = {},
                       const PromptLimits& limits = {});

struct SyntheticSpec {
  int n = 0, in = 0, out = 0;
  std::uint64_t seed = 1;
  int vocab = 0;  // 0: the model's
};
// Parses the spec text; kInvalidArgument naming `what` (the flag) and the bad field.
SyntheticSpec parse_synthetic_spec(std::string_view text, std::string_view what);
Workload make_synthetic(const SyntheticSpec& spec, int vocab_size);

}  // namespace trellis::runtime
