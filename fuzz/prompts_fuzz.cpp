// Fuzz entry for the prompts reader (fuzz/build prompts): the input is a prompts file
// (JSON lines) read the way `trellis run --prompts` reads one, with the byte tokenizer or
// fuzz_tokenizer.hpp's, as plain text or through the chat template (the first byte picks),
// and the same bytes as a `--workload synthetic:` spec. Any input must end in a Workload or
// a trellis::Error naming the line; a crash, a sanitizer report, unbounded recursion (issue
// 20.4: a 100,000-deep "[[[[" crashed every rank) or an allocation past libFuzzer's
// -rss_limit_mb is a bug. Every request that parses is checked against the vocabulary.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include "fuzz_tokenizer.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/workload/workload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trellis::runtime;
  if (size == 0) return 0;
  const unsigned mode = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  TextOptions opts;
  if (mode & 1) opts.tokenizer = &trellis::fuzz::fuzz_tokenizer();
  opts.chat = opts.tokenizer && (mode & 2);
  const int vocab = opts.tokenizer ? opts.tokenizer->vocab_size() : 300;
  PromptLimits limits;
  limits.max_line_bytes = 1 << 14;  // small limits, so the fuzzer reaches them
  limits.max_file_bytes = 1 << 16;
  limits.max_depth = (mode & 4) ? 3 : 16;
  try {
    std::istringstream in(text);
    const Workload w = parse_prompts(in, "fuzz.jsonl", vocab, opts, limits);
    for (const Request& r : w.requests) {
      for (auto id : r.prompt)
        if (id < 0 || id >= vocab) {
          std::fprintf(stderr, "prompts_fuzz: request %s has prompt id %d outside 0..%d\n", r.name.c_str(), id, vocab - 1);
          std::abort();
        }
      (void)decode_text(r.prompt, opts);
    }
  } catch (const trellis::Error&) {
  }
  try {
    const SyntheticSpec s = parse_synthetic_spec(text, "--workload synthetic:");
    // Building the workload is linear in n x in (bounded at parse time); build small ones.
    if (static_cast<std::int64_t>(s.n) * s.in <= 4096) (void)make_synthetic(s, vocab);
  } catch (const trellis::Error&) {
  }
  return 0;
}
