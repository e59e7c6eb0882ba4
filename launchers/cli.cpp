#include "cli.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <thread>

#include "commands.hpp"
#include "cpu_binding.hpp"
#include "environment.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/log.hpp"
#include "trellis/core/shm_names.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::launchers {
namespace {

// Whether a failure is seen second-hand: a wait that ran out, or a link that broke. Those are
// often the symptom of another rank's failure that a rank nearer to it is naming at the same
// moment: a killed rank's host-mate names it within 0.1 s, and its own exit then breaks that
// host-mate's links to the other host, whose ranks would blame the host-mate (the fault suite
// saw it twice in 26 kills); a rank whose own thread timed out behind a slow link blamed
// itself 10 ms before rank 0 named the link (4 of 9 at start-up).
// A kRank error is one this rank saw as a symptom (another of its threads failed, or the
// failure of the rank feeding it was relayed to it).
bool second_hand(const Error& e) {
  return e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kLinkFailed || e.scope() == ErrorScope::kLink ||
         e.scope() == ErrorScope::kRank;
}

constexpr int kExitUsage = 2;

struct GlobalFlags {
  std::string log_level;
  bool log_all_ranks = false;
  std::vector<std::string> settings;  // NAME=VALUE
};

void print_usage(std::ostream& os) {
  os << "Usage: trellis [--log-level LEVEL] [--set NAME=VALUE]... COMMAND [OPTIONS]\n\nCommands:\n";
  for (const auto& c : all_commands()) os << fmt::format("  {:<14} {}\n", c.path, c.summary);
  os << "\nRun `trellis COMMAND --help` for the options of a command.\n";
}

void apply_flags(const GlobalFlags& flags, Config& config) {
  if (!flags.log_level.empty()) config.set("log.level", flags.log_level, SettingSource::kFlag, "--log-level");
  if (flags.log_all_ranks) config.set("log.all_ranks", "true", SettingSource::kFlag, "--log-all-ranks");
  for (const auto& kv : flags.settings) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw_error(ErrorCode::kInvalidArgument, "--set '{}': expected NAME=VALUE (see `trellis info --config`)", kv);
    }
    config.set(kv.substr(0, eq), kv.substr(eq + 1), SettingSource::kFlag, "--set " + kv);
  }
}

// Registers groups and commands from the table; `selected` receives the parsed command and
// `selected_path` its path ("info", "bench ring").
void build_app(CLI::App& app, GlobalFlags& flags, Action& selected, std::string_view& selected_path) {
  app.set_version_flag("--version", std::string(TRELLIS_VERSION));
  app.add_option("--log-level", flags.log_level,
                 "trace, debug, info, warn, error, critical or off (env TRELLIS_LOG_LEVEL)");
  app.add_flag("--log-all-ranks", flags.log_all_ranks,
               "Every rank logs at --log-level (default: only rank 0; others warn and above)");
  app.add_option("--set", flags.settings,
                 "Set any setting, NAME=VALUE; repeatable (list: trellis info --config)");
  app.require_subcommand(1);
  std::map<std::string, CLI::App*, std::less<>> groups;
  for (const auto& g : all_groups()) {
    auto* sub = app.add_subcommand(std::string(g.name), std::string(g.summary));
    sub->require_subcommand(1);
    groups.emplace(g.name, sub);
  }
  for (const auto& c : all_commands()) {
    CLI::App* parent = &app;
    std::string leaf(c.path);
    if (auto sp = c.path.find(' '); sp != std::string_view::npos) {
      parent = groups.find(c.path.substr(0, sp))->second;
      leaf = std::string(c.path.substr(sp + 1));
    }
    CLI::App* sub = parent->add_subcommand(leaf, std::string(c.summary));
    Action action = c.define(*sub);
    sub->callback([&selected, &selected_path, action, path = c.path] {
      selected = action;
      selected_path = path;
    });
  }
}

// The first word that is not a flag (nor a global flag's value) must name a command or
// group; returns it when it does not, for a clearer message than CLI11's.
std::string first_unknown_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--log-level" || a == "--set") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    for (const auto& g : all_groups()) if (g.name == a) return {};
    for (const auto& c : all_commands()) if (c.path == a) return {};
    return std::string(a);
  }
  return {};
}

// Removes the shared-memory segments of jobs whose creator died before unlinking them
// (killed during set-up); see core/shm_names.hpp. Every rank sweeps its host; a segment is
// removed once, by whichever rank gets there first.
void sweep_shared_memory() {
  for (const auto& seg : sweep_stale_shm_segments())
    spdlog::info("removed shared-memory segment {} ({}) of a dead job: its creator, pid {}, is gone", seg.name,
                 format_bytes(static_cast<double>(seg.bytes)), seg.pid);
}

// `sweep_shm`: every command but `trellis info`, which lists the leftovers instead.
int run_action(const Action& action, Config config, bool sweep_shm) {
  Session session;
  session.config = std::move(config);
  session.launch = detect_launch();
  if (auto why = session.launch.refusal(); !why.empty()) {
    // Every task refuses alike (each would otherwise be a world of one); task 0 says why.
    if (session.launch.slurm_task <= 0) std::cerr << "trellis: " << why << "\n";
    return kExitUsage;
  }
  if (auto hint = session.launch.hint(); !hint.empty()) std::cerr << "trellis: " << hint << "\n";
  if (auto why = session.launch.recovery_refusal(); !why.empty() && !session.config.get_bool("comm.allow_mpi_recovery")) {
    // Every rank refuses alike, before MPI_Init; rank 0 says why.
    if (session.launch.world_rank <= 0) std::cerr << "trellis: " << why << "\n";
    return kExitUsage;
  }
  session.under_mpirun = session.launch.uses_mpi();
  session.world_ptr = session.under_mpirun ? transport::make_mpi_bootstrap() : transport::make_local_bootstrap();
  // Heartbeats from the start, so that a rank lost during start-up (before any link is up)
  // is named by the world collective waiting on it after half the deadline (runtime's
  // prepare_job sets it again from the run's own comm.deadline_ms).
  session.world().watch_liveness(session.config.get_duration("comm.deadline_ms") / 2);
  LogOptions log;
  log.rank = session.rank();
  log.world_size = session.size();
  log.host = session.size() > 1 ? session.world().hostname() : "";
  log.level = session.config.get_string("log.level");
  log.all_ranks = session.config.get_bool("log.all_ranks");
  try {
    configure_logging(log);
  } catch (const Error& e) {
    std::cerr << "trellis: " << e.what() << "\n";
    return kExitUsage;
  }
  if (sweep_shm) sweep_shared_memory();
  try {
    bind_host_ranks(session);
    return action(session);
  } catch (const std::exception& e) {
    const auto* err = dynamic_cast<const Error*>(&e);
    std::string kind = err ? std::string(to_string(err->code())) : "unexpected error";
    if (session.size() > 1) {
      // A second-hand failure waits a moment before it speaks, so that the rank that saw the
      // cause first-hand (a dead or stopped process, a silent heartbeat) is the one the job's
      // first report names; its MPI_Abort usually ends this process during the wait. 2 s,
      // not 1: the launcher forwards a host's output up to ~1.1 s late, and a grace of 1 s let
      // a second-hand line from the other host reach the log first (1 of 20 kills).
      if (err && second_hand(*err)) {
        const auto deadline = session.config.get_duration("comm.deadline_ms");
        std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(std::chrono::milliseconds(2000), deadline / 2));
      }
      // Take the peers down with us: they may be waiting on this rank. MPI_Abort makes
      // mpirun end every rank and say which rank called it.
      spdlog::critical("rank {} failed ({}): {}", session.rank(), kind, e.what());
      session.world().abort(1);
    }
    spdlog::error("{}: {}", kind, e.what());
    return 1;
  }
}

}  // namespace

bool Session::require_world(bool ok, std::string_view message) const {
  if (!ok && rank() == 0) spdlog::error("{}", message);
  return ok;
}

int apply_flag_settings(Session& s, std::initializer_list<FlagSetting> flags) {
  try {
    for (const auto& f : flags)
      if (!f.value.empty()) s.config.set(f.setting, f.value, SettingSource::kFlag, f.flag);
  } catch (const Error& e) {
    if (s.is_root()) spdlog::error("{}", e.what());
    return kExitUsage;
  }
  return 0;
}

int run_cli(int argc, char** argv) {
  CLI::App app{"trellis: LLM inference across many machines, as pipeline stages x tensor-parallel ranks",
               "trellis"};
  GlobalFlags flags;
  Action selected;
  std::string_view selected_path;
  build_app(app, flags, selected, selected_path);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (auto unknown = first_unknown_command(argc, argv); !unknown.empty()) {
      std::cerr << "trellis: unknown command '" << unknown << "'\n\n";
    } else {
      std::cerr << "trellis: " << e.what() << "\n\n";
    }
    print_usage(std::cerr);
    return kExitUsage;
  }
  Config config;
  try {
    apply_environment(config);
    apply_flags(flags, config);
  } catch (const Error& e) {
    std::cerr << "trellis: " << e.what() << "\n";
    return kExitUsage;
  }
  if (!selected) {
    print_usage(std::cerr);
    return kExitUsage;
  }
  return run_action(selected, std::move(config), selected_path != "info");
}

}  // namespace trellis::launchers
