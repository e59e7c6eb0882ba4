// Logging: spdlog with the rank and host in every line, e.g.
//   [05:31:02.123] [r3@node7] [info] loaded shard 3/4 of model.safetensors
// Rank 0 logs at the configured level; other ranks log warnings and errors only unless
// all_ranks is set, so a 64-rank job prints one story, not 64.
//
// Code logs with spdlog directly (spdlog::info(...)); this header only configures it.
#pragma once

#include <string>

namespace trellis {

struct LogOptions {
  int rank = 0;
  int world_size = 1;
  std::string host;         // empty: leave the host out
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  bool all_ranks = false;   // non-root ranks log at `level` too
};

// Installs the default logger (stderr, colour when a terminal). Throws
// ErrorCode::kInvalidArgument naming the level when it is not one of the above.
void configure_logging(const LogOptions& options);

// Returns the options last passed to configure_logging (defaults before that).
const LogOptions& logging_options();

}  // namespace trellis
