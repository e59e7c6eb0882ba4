#include "trellis/core/config.hpp"

#include <algorithm>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis {

std::string_view to_string(SettingType t) {
  switch (t) {
    case SettingType::kBool: return "bool";
    case SettingType::kInt: return "int";
    case SettingType::kDouble: return "double";
    case SettingType::kString: return "string";
    case SettingType::kSize: return "size";
    case SettingType::kDurationMs: return "ms";
  }
  return "?";
}

std::string_view to_string(SettingSource s) {
  switch (s) {
    case SettingSource::kDefault: return "default";
    case SettingSource::kEnvironment: return "environment";
    case SettingSource::kFlag: return "flag";
    case SettingSource::kFile: return "file";
  }
  return "?";
}

const SettingSpec* find_setting(std::string_view name) {
  for (const auto& s : all_settings()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

namespace {

// A byte count in the largest binary unit that divides it exactly ("64KiB", "1GiB", "100").
std::string size_text(std::int64_t bytes) {
  static constexpr const char* kUnits[] = {"", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{}{}", bytes, kUnits[u]);
}

[[noreturn]] void out_of_range(const SettingSpec& spec, std::string_view what, std::string_view value) {
  throw_error(ErrorCode::kInvalidArgument, "{}: {} is out of range: {} must be in {}", what, value, spec.name,
              spec.range_text());
}

// Parses `text` as `type` only to validate it (type and range); the typed getters parse
// again (cheap, and it keeps one representation).
void validate(const SettingSpec& spec, std::string_view text, std::string_view what) {
  switch (spec.type) {
    case SettingType::kBool: (void)parse_bool(text, what); break;
    case SettingType::kInt:
    case SettingType::kDurationMs: {
      auto v = parse_int(text, what);
      if (v < spec.min || v > spec.max) out_of_range(spec, what, text);
      break;
    }
    case SettingType::kDouble: {
      auto v = parse_double(text, what);
      if (!(v >= static_cast<double>(spec.min) && v <= static_cast<double>(spec.max))) out_of_range(spec, what, text);
      break;
    }
    case SettingType::kSize: {
      // Unsigned: a size above the int64 range is out of range, not wrapped negative.
      auto v = parse_size(text, what);
      if (v > static_cast<std::uint64_t>(spec.max) || v < static_cast<std::uint64_t>(std::max<std::int64_t>(spec.min, 0)))
        out_of_range(spec, what, text);
      break;
    }
    case SettingType::kString: break;
  }
}

}  // namespace

std::string SettingSpec::range_text() const {
  if (type == SettingType::kSize) return size_text(min) + ".." + size_text(max);
  return fmt::format("{}..{}", min, max);
}

Config::Config() {
  for (const auto& s : all_settings()) {
    values_.emplace(std::string(s.name), Value{std::string(s.default_value), SettingSource::kDefault});
  }
}

void Config::set(std::string_view name, std::string_view value, SettingSource source,
                 std::string_view origin) {
  const SettingSpec* spec = find_setting(name);
  if (spec == nullptr) {
    throw_error(ErrorCode::kInvalidArgument, "unknown setting '{}'{}", name,
                origin.empty() ? "" : fmt::format(" (from {})", origin));
  }
  std::string what = origin.empty() ? std::string(name)
                                    : fmt::format("{} (setting {})", origin, name);
  validate(*spec, trim(value), what);
  auto& v = values_.find(name)->second;
  v.text = std::string(trim(value));
  v.source = source;
}

const Config::Value& Config::lookup(std::string_view name, SettingType expected) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    throw_error(ErrorCode::kInternal, "setting '{}' is read but not declared in settings.cpp", name);
  }
  const SettingSpec* spec = find_setting(name);
  if (spec->type != expected) {
    throw_error(ErrorCode::kInternal, "setting '{}' is {} but read as {}", name,
                to_string(spec->type), to_string(expected));
  }
  return it->second;
}

bool Config::get_bool(std::string_view n) const { return parse_bool(lookup(n, SettingType::kBool).text, n); }
std::int64_t Config::get_int(std::string_view n) const { return parse_int(lookup(n, SettingType::kInt).text, n); }
double Config::get_double(std::string_view n) const { return parse_double(lookup(n, SettingType::kDouble).text, n); }
std::string Config::get_string(std::string_view n) const { return lookup(n, SettingType::kString).text; }
std::uint64_t Config::get_size(std::string_view n) const { return parse_size(lookup(n, SettingType::kSize).text, n); }
Millis Config::get_duration(std::string_view n) const {
  return Millis(parse_int(lookup(n, SettingType::kDurationMs).text, n));
}

const std::string& Config::raw(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw_error(ErrorCode::kInvalidArgument, "unknown setting '{}'", name);
  return it->second.text;
}

SettingSource Config::source(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw_error(ErrorCode::kInvalidArgument, "unknown setting '{}'", name);
  return it->second.source;
}

}  // namespace trellis
