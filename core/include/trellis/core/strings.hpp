// Small string helpers used by parsers of flags, specs and files. Parsers throw
// ErrorCode::kInvalidArgument with a message naming `what` (the flag or field) on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trellis {

std::vector<std::string> split(std::string_view s, char sep, bool keep_empty = false);
std::string_view trim(std::string_view s);
std::string to_lower(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);

// Parses a whole string as an integer / float; `what` names the input in the error.
std::int64_t parse_int(std::string_view s, std::string_view what);
double parse_double(std::string_view s, std::string_view what);
bool parse_bool(std::string_view s, std::string_view what);

// "4096", "4K", "4KiB", "64MiB", "1G" -> bytes (binary units; K/KB/KiB all mean 1024).
std::uint64_t parse_size(std::string_view s, std::string_view what);
// "1,4,16" or "8-64" (powers of two) or "8..64" -> values.
std::vector<std::int64_t> parse_int_list(std::string_view s, std::string_view what);

// 1536 -> "1.5 KiB"; 8 -> "8 B".
std::string format_bytes(double bytes);
// 2.5e-6 -> "2.50 us".
std::string format_seconds(double seconds);
// `s` with &, <, > and " escaped, for text inside XML/SVG elements and attributes.
std::string xml_escape(std::string_view s);

}  // namespace trellis
