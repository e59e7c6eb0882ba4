#include "trellis/core/strings.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "trellis/core/error.hpp"

namespace trellis {

std::vector<std::string> split(std::string_view s, char sep, bool keep_empty) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t end = s.find(sep, start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view part = s.substr(start, end - start);
    if (keep_empty || !part.empty()) out.emplace_back(part);
    start = end + 1;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::int64_t parse_int(std::string_view s, std::string_view what) {
  s = trim(s);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    throw_error(ErrorCode::kInvalidArgument, "{}: '{}' is not an integer", what, s);
  }
  return v;
}

double parse_double(std::string_view s, std::string_view what) {
  s = trim(s);
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) {
    throw_error(ErrorCode::kInvalidArgument, "{}: '{}' is not a finite number", what, s);
  }
  return v;
}

bool parse_bool(std::string_view s, std::string_view what) {
  std::string v = to_lower(trim(s));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw_error(ErrorCode::kInvalidArgument, "{}: '{}' is not a boolean (use true/false, 1/0, on/off)",
              what, s);
}

std::uint64_t parse_size(std::string_view s, std::string_view what) {
  std::string_view t = trim(s);
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) throw_error(ErrorCode::kInvalidArgument, "{}: '{}' is not a size (e.g. 4096, 4K, 64MiB)", what, s);
  double number = parse_double(t.substr(0, i), what);
  std::string unit = to_lower(trim(t.substr(i)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw_error(ErrorCode::kInvalidArgument, "{}: unknown size unit '{}' in '{}' (use B, K, M, G, T)", what, unit, s);
  double bytes = number * mult;
  if (bytes != std::floor(bytes) || bytes > 1.8e19) {
    throw_error(ErrorCode::kInvalidArgument, "{}: '{}' is not a whole number of bytes", what, s);
  }
  return static_cast<std::uint64_t>(bytes);
}

std::vector<std::int64_t> parse_int_list(std::string_view s, std::string_view what) {
  std::vector<std::int64_t> out;
  for (const auto& part : split(s, ',')) {
    auto dots = part.find("..");
    auto dash = part.find('-', 1);
    if (dots != std::string::npos || dash != std::string::npos) {
      bool pow2 = dots == std::string::npos;
      std::size_t cut = pow2 ? dash : dots;
      std::int64_t lo = parse_int(part.substr(0, cut), what);
      std::int64_t hi = parse_int(part.substr(cut + (pow2 ? 1 : 2)), what);
      if (lo <= 0 || hi < lo) throw_error(ErrorCode::kInvalidArgument, "{}: bad range '{}'", what, part);
      for (std::int64_t v = lo; v <= hi; v = pow2 ? v * 2 : v + 1) out.push_back(v);
    } else {
      out.push_back(parse_int(part, what));
    }
  }
  if (out.empty()) throw_error(ErrorCode::kInvalidArgument, "{}: empty list", what);
  return out;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.{}f} {}", bytes, bytes == std::floor(bytes) ? 0 : 1, units[u]);
}

std::string format_seconds(double s) {
  double a = std::fabs(s);
  if (a < 1e-6) return fmt::format("{:.0f} ns", s * 1e9);
  if (a < 1e-3) return fmt::format("{:.2f} us", s * 1e6);
  if (a < 1.0) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace trellis
