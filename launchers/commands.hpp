// The command table: every `trellis` subcommand is registered in commands.cpp and nowhere
// else. A command defines its flags on a CLI11 sub-app and returns the action to run once
// parsing succeeded; the action gets the Session and returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <span>
#include <string_view>

#include "session.hpp"

namespace trellis::launchers {

using Action = std::function<int(Session&)>;

struct CommandSpec {
  // "info", or "bench ring" for a command under a group ("bench").
  std::string_view path;
  std::string_view summary;
  Action (*define)(CLI::App& sub);
};

struct GroupSpec {
  std::string_view name;
  std::string_view summary;
};

std::span<const CommandSpec> all_commands();
std::span<const GroupSpec> all_groups();

// One define function per command, each in its cmd_*.cpp.
Action define_info(CLI::App& sub);
Action define_bench_ring(CLI::App& sub);
Action define_run(CLI::App& sub);
Action define_serve(CLI::App& sub);
Action define_convert(CLI::App& sub);
Action define_make_model(CLI::App& sub);
Action define_model_logits(CLI::App& sub);
Action define_bench_model(CLI::App& sub);
Action define_bench_comm(CLI::App& sub);
Action define_bench_handoff(CLI::App& sub);
Action define_bench_kernels(CLI::App& sub);
Action define_topo(CLI::App& sub);
Action define_plan(CLI::App& sub);
Action define_study_variants(CLI::App& sub);
Action define_study_swift(CLI::App& sub);
Action define_eval_ppl(CLI::App& sub);
Action define_verify_model(CLI::App& sub);

}  // namespace trellis::launchers
