// The configuration registry: every setting trellis knows is declared exactly once, in the
// table in core/src/settings.cpp (name, type, default, description, environment variable),
// in the manner of UCX's ucs_config_field_t rows. `trellis info --config` prints the table.
//
// A Config holds the values of one run. launchers/ fills it from the environment and from
// flags (the only place that reads either); every layer below reads typed values from it.
// Values are validated when set, so a bad value fails at start-up naming the setting and
// where it came from, not deep inside a run.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "trellis/core/clock.hpp"

namespace trellis {

enum class SettingType { kBool, kInt, kDouble, kString, kSize, kDurationMs };
std::string_view to_string(SettingType t);

struct SettingSpec {
  std::string_view name;           // dotted: "log.level", "comm.deadline_ms"
  SettingType type;
  std::string_view default_value;  // as text, parsed with the type's parser
  std::string_view description;
  std::string_view env;            // environment variable, or empty
  // Inclusive range of a numeric setting (int, size in bytes, ms), checked by Config::set
  // whatever the source (flag, --set, environment) and quoted in the error. Every numeric
  // row declares one: an unbounded thread count or size is how a typo takes a machine
  // down (issue 23.5). Ignored for bool and string settings.
  std::int64_t min = 0;
  std::int64_t max = 0;

  bool numeric() const { return type != SettingType::kBool && type != SettingType::kString; }
  // "0..1024", or for sizes "64KiB..1GiB".
  std::string range_text() const;
};

// All declared settings, in table order.
std::span<const SettingSpec> all_settings();
// The spec for `name`, or nullptr.
const SettingSpec* find_setting(std::string_view name);

enum class SettingSource { kDefault, kEnvironment, kFlag, kFile };
std::string_view to_string(SettingSource s);

class Config {
 public:
  // Starts with every setting at its default.
  Config();

  // Sets a value from text; throws ErrorCode::kInvalidArgument if the name is unknown, the
  // text does not parse as the setting's type, or a numeric value is outside the setting's
  // range (the error quotes it). `origin` (e.g. "--log-level" or "TRELLIS_LOG_LEVEL") is
  // quoted in that error; a rejected value leaves the old one in place.
  void set(std::string_view name, std::string_view value, SettingSource source,
           std::string_view origin = {});

  bool get_bool(std::string_view name) const;
  std::int64_t get_int(std::string_view name) const;
  double get_double(std::string_view name) const;
  std::string get_string(std::string_view name) const;
  std::uint64_t get_size(std::string_view name) const;
  Millis get_duration(std::string_view name) const;

  // The text of a value and where it came from.
  const std::string& raw(std::string_view name) const;
  SettingSource source(std::string_view name) const;

 private:
  struct Value {
    std::string text;
    SettingSource source = SettingSource::kDefault;
  };
  const Value& lookup(std::string_view name, SettingType expected) const;
  std::map<std::string, Value, std::less<>> values_;
};

}  // namespace trellis
