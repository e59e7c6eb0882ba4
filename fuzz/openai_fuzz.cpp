// Fuzz entry for the server's request parsing (fuzz/build openai): the body of a POST to
// /v1/completions or /v1/chat/completions (the first byte picks the endpoint and the codec:
// bytes, or fuzz_tokenizer.hpp's tokenizer), parsed as `trellis serve` parses it. Any body must
// end in a GenerationRequest or an ApiError with a 4xx status; anything else thrown, a crash
// or a sanitizer report is a bug. An accepted request is checked for what the engine relies
// on: ids inside the vocabulary, at least one prompt token and one token to generate, and
// prompt + max_tokens within the context.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "fuzz_tokenizer.hpp"
#include "trellis/serve/openai.hpp"
#include "trellis/serve/text_codec.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "openai_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trellis::serve;
  static const std::unique_ptr<TextCodec> bytes = make_byte_codec(300);
  static const std::unique_ptr<TextCodec> tok = make_tokenizer_codec(trellis::fuzz::fuzz_tokenizer());
  if (size == 0) return 0;
  const Endpoint ep = (data[0] & 1) ? Endpoint::kChat : Endpoint::kCompletions;
  const TextCodec& codec = (data[0] & 2) ? *tok : *bytes;
  ParseContext ctx;
  ctx.model_name = "m";
  ctx.vocab_size = codec.vocab_size();
  ctx.max_context = 512;
  ctx.default_max_tokens = 64;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const GenerationRequest g = parse_generation(ep, body, codec, ctx);
    const auto& r = g.request;
    if (r.prompt.empty()) fail("an accepted request has an empty prompt");
    for (auto id : r.prompt)
      if (id < 0 || id >= ctx.vocab_size) fail("an accepted request holds an id outside the vocabulary");
    if (r.sampling.max_tokens < 1) fail("an accepted request generates no token");
    if (static_cast<std::int64_t>(r.prompt.size()) + r.sampling.max_tokens > ctx.max_context)
      fail("an accepted request does not fit the context");
  } catch (const ApiError& e) {
    if (e.status() < 400 || e.status() >= 500) fail("bad input answered with a status outside 4xx");
  }
  return 0;
}
