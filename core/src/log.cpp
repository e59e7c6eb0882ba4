#include "trellis/core/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis {
namespace {
LogOptions g_options;
}

void configure_logging(const LogOptions& options) {
  auto level = spdlog::level::from_str(to_lower(options.level));
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (level == spdlog::level::off && to_lower(options.level) != "off") {
    throw_error(ErrorCode::kInvalidArgument,
                "log level '{}' is not one of trace, debug, info, warn, error, critical, off",
                options.level);
  }
  if (options.rank != 0 && !options.all_ranks && level < spdlog::level::warn) {
    level = spdlog::level::warn;
  }
  // Built directly rather than through the registry so that configuring twice (tests do)
  // replaces the logger instead of throwing "logger exists".
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("trellis", std::move(sink));
  std::string who = options.world_size > 1 || !options.host.empty()
                        ? fmt::format("[r{}{}{}] ", options.rank, options.host.empty() ? "" : "@",
                                      options.host)
                        : std::string();
  logger->set_pattern("[%H:%M:%S.%e] " + who + "[%^%l%$] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  g_options = options;
}

const LogOptions& logging_options() { return g_options; }

}  // namespace trellis
