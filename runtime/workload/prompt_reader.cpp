#include "prompt_reader.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::runtime::detail {

bool LineReader::next(std::string& line) {
  line.clear();
  // Byte by byte from the stream buffer (inline except at refills), so that a line without
  // a newline stops at the limit instead of growing with the input as std::getline would.
  std::streambuf* buf = in_.rdbuf();
  using Traits = std::char_traits<char>;
  bool any = false;
  for (Traits::int_type c; !Traits::eq_int_type(c = buf->sbumpc(), Traits::eof());) {
    if (!any) ++lineno_;
    any = true;
    if (++total_ > limits_.max_file_bytes)
      throw_error(ErrorCode::kInvalidArgument, "{}:{}: the prompts file is longer than {} (the limit of a prompts file)",
                  name_, lineno_, format_bytes(static_cast<double>(limits_.max_file_bytes)));
    if (c == '\n') return true;
    if (line.size() >= limits_.max_line_bytes)
      throw_error(ErrorCode::kInvalidArgument, "{}:{}: line longer than {} (the limit of one prompts-file line)", name_,
                  lineno_, format_bytes(static_cast<double>(limits_.max_line_bytes)));
    line.push_back(Traits::to_char_type(c));
  }
  return any;
}

namespace {

// Counts the nesting as the parser reports it and stops it at the first level too deep,
// remembering the top-level field it happened in (the error names it).
class ShapeCheck final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit ShapeCheck(int max_depth) : max_depth_(max_depth) {}
  std::optional<std::string> error;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_object() override { return leave(); }
  bool end_array() override { return leave(); }
  bool key(string_t& k) override {
    if (depth_ == 1) field_ = k.size() <= 64 ? k : k.substr(0, 64) + "...";  // the name is untrusted too
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    error = "not valid JSON";
    return false;
  }

 private:
  bool enter() {
    if (++depth_ <= max_depth_) return true;
    error = field_.empty() ? fmt::format("nested deeper than {} levels", max_depth_)
                           : fmt::format("field \"{}\" is nested deeper than {} levels", field_, max_depth_);
    return false;
  }
  bool leave() {
    --depth_;
    return true;
  }
  int max_depth_, depth_ = 0;
  std::string field_;
};

}  // namespace

std::optional<std::string> check_json_shape(std::string_view text, int max_depth) {
  ShapeCheck check(max_depth);
  const bool ok = nlohmann::json::sax_parse(text, &check);
  if (!ok && !check.error) check.error = "not valid JSON";
  return check.error;
}

}  // namespace trellis::runtime::detail
