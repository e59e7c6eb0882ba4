// Reading a prompts file as untrusted input (private to runtime/workload): lines of bounded
// length in a stream of bounded size, and JSON whose nesting is checked before any value is
// built. A prompts file may come from anyone; a 100,000-deep "[[[[...]]]]" crashed every
// rank through recursion in the JSON library (issue 23.4).
#pragma once

#include <cstddef>
#include <istream>
#include <optional>
#include <string>
#include <string_view>

#include "trellis/runtime/workload/workload.hpp"

namespace trellis::runtime::detail {

// Hands out the lines of a stream one by one, without their '\n'. kInvalidArgument naming
// `name` and the line when a line exceeds limits.max_line_bytes or the stream
// limits.max_file_bytes; nothing longer than the limit is ever held in memory.
class LineReader {
 public:
  LineReader(std::istream& in, std::string_view name, const PromptLimits& limits)
      : in_(in), name_(name), limits_(limits) {}
  // The next line into `line`; false at the end of the stream.
  bool next(std::string& line);
  int lineno() const { return lineno_; }

 private:
  std::istream& in_;
  std::string_view name_;
  PromptLimits limits_;
  int lineno_ = 0;
  std::size_t total_ = 0;  // bytes read so far, newlines included
};

// Why `text` is not a JSON document nested at most `max_depth` deep ("not valid JSON",
// "field \"tokens\" is nested deeper than 16 levels"), or nothing when it is. Runs
// nlohmann's SAX parser, which keeps its own stack instead of recursing, and stops at the
// first level too deep; depth 1 is the line's own object or list.
std::optional<std::string> check_json_shape(std::string_view text, int max_depth);

}  // namespace trellis::runtime::detail
