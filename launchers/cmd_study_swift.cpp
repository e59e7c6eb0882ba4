// `trellis study swift`: each task's prompts generated twice with the same model, layout and
// settings — plain decoding, then SWIFT self-speculative decoding (run.swift=true) — through
// runtime::generate, as `trellis run` would; then the SWIFT paper's Table 4 per task with
// the measured wall-clock speedup, and whether the greedy outputs of the two runs are
// identical (runtime/study/swift_study.hpp). Collective like `trellis run`: every rank takes
// part in every generation; rank 0 reads the prompts, compares the outputs and prints.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.hpp"
#include "json_output.hpp"
#include "layout_flags.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/progress.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/runtime/engine/generate.hpp"
#include "trellis/runtime/study/swift_study.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"

namespace trellis::launchers {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultTasks =
    "examples/swift/summarisation.jsonl,examples/swift/reasoning.jsonl,examples/swift/story.jsonl";

struct SwiftStudyOptions {
  runtime::GenerateOptions gen;
  std::string tasks = kDefaultTasks;
  std::string chat = "auto";  // auto: on when the model has a chat template
  std::string device;         // --device as given (setting run.device)
  std::string keep_outputs;   // a folder for the runs' --out files, else temporary files
  std::string csv, svg;
  bool json = false;
};

struct Task {
  std::string name, path;
};

std::atomic<bool> g_stop{false};
extern "C" void on_study_stop(int) { g_stop.store(true); }

// A relative default that is not under the working directory is looked up in the source
// tree, so that the default tasks work from a build folder too.
std::string resolve_default(const std::string& path, bool is_default) {
  std::error_code ec;
  if (!is_default || fs::path(path).is_absolute() || fs::exists(path, ec)) return path;
  const fs::path in_source = fs::path(TRELLIS_SOURCE_DIR) / path;
  return fs::exists(in_source, ec) ? in_source.string() : path;
}

// --tasks: files that exist, each named by its stem, no two alike. Rank 0 only (it is the
// rank that reads prompts); throws kInvalidArgument naming the flag.
std::vector<Task> parse_tasks(const std::string& text) {
  const bool is_default = text == kDefaultTasks;
  std::vector<Task> out;
  std::set<std::string> names;
  for (const auto& part : split(text, ',')) {
    const std::string path = resolve_default(std::string(trim(part)), is_default);
    if (path.empty()) throw_error(ErrorCode::kInvalidArgument, "--tasks '{}': an empty file name", text);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      throw_error(ErrorCode::kInvalidArgument, "--tasks: {} is not a prompts file (JSONL; examples/swift/ has three)",
                  path);
    Task t{fs::path(path).stem().string(), path};
    if (!names.insert(t.name).second)
      throw_error(ErrorCode::kInvalidArgument, "--tasks: two files are named {} (a task's name is its file's stem)",
                  t.name);
    out.push_back(std::move(t));
  }
  if (out.empty()) throw_error(ErrorCode::kInvalidArgument, "--tasks: no prompts files given");
  return out;
}

// Whether text prompts go through the chat template: --chat on|off, or auto (on when the
// model is a GGUF file with a chat template).
bool chat_wanted(const SwiftStudyOptions& o) {
  if (o.chat == "on") return true;
  if (o.chat == "off" || o.gen.model_dir.empty()) return false;
  const auto tok = runtime::Tokenizer::for_model(o.gen.model_dir);
  return tok && !tok->chat_template().empty();
}

// Rank 0 decides (tasks, chat, the --keep-outputs folder) and tells the others: the paths and the decision travel as
// one text line per task, "chat" first; an error travels as "!message" and is thrown on
// every rank, so the job ends everywhere with the same message.
std::vector<Task> agree_on_tasks(Session& s, SwiftStudyOptions& o) {
  std::string msg;
  std::vector<Task> tasks;
  if (s.is_root()) {
    try {
      tasks = parse_tasks(o.tasks);
      if (!o.keep_outputs.empty()) {
        std::error_code ec;
        fs::create_directories(o.keep_outputs, ec);
        if (!fs::is_directory(o.keep_outputs, ec))
          throw_error(ErrorCode::kInvalidArgument, "--keep-outputs {}: not a folder, and cannot be made one",
                      o.keep_outputs);
      }
      msg = chat_wanted(o) ? "1" : "0";
      for (const auto& t : tasks) msg += "\n" + t.name + "\t" + t.path;
    } catch (const Error& e) {
      msg = std::string("!") + e.what();
    }
  }
  std::vector<std::byte> b(msg.size());
  if (!msg.empty()) std::memcpy(b.data(), msg.data(), msg.size());
  s.world().broadcast(b, 0, s.deadline());
  msg.assign(reinterpret_cast<const char*>(b.data()), b.size());
  if (!msg.empty() && msg[0] == '!') throw Error(ErrorCode::kInvalidArgument, msg.substr(1));
  const auto lines = split(msg, '\n');
  o.gen.chat = !lines.empty() && lines[0] == "1";
  if (!s.is_root())
    for (std::size_t i = 1; i < lines.size(); ++i) {
      const auto tab = lines[i].find('\t');
      tasks.push_back({std::string(lines[i].substr(0, tab)), std::string(lines[i].substr(tab + 1))});
    }
  return tasks;
}

std::string out_path(const SwiftStudyOptions& o, const Task& t, const char* kind) {
  const std::string file = fmt::format("{}.{}.jsonl", t.name, kind);
  if (!o.keep_outputs.empty()) return (fs::path(o.keep_outputs) / file).string();
  return (fs::temp_directory_path() / fmt::format("trellis-study-swift-{}-{}", ::getpid(), file)).string();
}

// One generation of a task's prompts under `config`; false when interrupted.
bool generate_once(Session& s, const Config& config, runtime::GenerateOptions g, const Task& t, const std::string& out,
                   runtime::GenerateReport& rep) {
  g.prompts = t.path;
  g.out = out;
  g_stop = false;
  g.stop = &g_stop;
  std::signal(SIGINT, on_study_stop);
  std::signal(SIGTERM, on_study_stop);
  rep = runtime::generate(s.world(), config, g);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  return !rep.interrupted;
}

// A run's failures and notes, at most a few, as "plain run: ..." / "SWIFT run: ..." (the
// engine's own "swift: " prefix dropped: the run already says it).
void add_notes(runtime::SwiftTaskResult& r, const runtime::RunSummary& sum, const char* which) {
  constexpr std::size_t kShown = 5;
  std::size_t shown = 0;
  for (const auto& f : sum.failures)
    if (shown++ < kShown) r.notes.push_back(fmt::format("{}: failed: {}", which, f));
  for (std::string_view n : sum.notes) {
    if (n.rfind("swift: ", 0) == 0) n.remove_prefix(7);
    if (shown++ < kShown) r.notes.push_back(fmt::format("{}: {}", which, n));
  }
  if (shown > kShown) r.notes.push_back(fmt::format("{}: ... and {} more notes", which, shown - kShown));
}

// Rank 0: the task's row from the two summaries and the two --out files.
runtime::SwiftTaskResult task_result(const Task& t, const runtime::RunSummary& plain, const runtime::RunSummary& swift,
                                     const std::string& plain_out, const std::string& swift_out) {
  runtime::SwiftTaskResult r;
  r.task = t.name;
  r.prompts = t.path;
  r.requests = plain.requests;
  r.plain_tokens = plain.generated_tokens;
  r.swift_tokens = swift.generated_tokens;
  r.plain_wall_s = plain.wall_s;
  r.swift_wall_s = swift.wall_s;
  r.plain_tokens_per_s = plain.throughput;
  r.swift_tokens_per_s = swift.throughput;
  if (swift.swift && (swift.swift->verify_passes > 0 || swift.swift->opt_steps > 0)) r.swift = swift.swift;
  std::ifstream a(plain_out), b(swift_out);
  if (!a || !b) throw_error(ErrorCode::kIo, "study swift: cannot read the outputs {} and {}", plain_out, swift_out);
  r.outputs = runtime::compare_outputs(a, b, fmt::format("task {}", t.name));
  add_notes(r, plain, "plain run");
  add_notes(r, swift, "SWIFT run");
  return r;
}

std::string study_title(const Session& s, const SwiftStudyOptions& o) {
  const auto& c = s.config;
  const auto& g = o.gen;
  return fmt::format("trellis study swift: {}, pp={} tp={}, device {}, chat {}{}; SWIFT γ={} r={:g} ε={:g} N_D={} "
                     "max steps {} target matchness {:g} min speedup {:g}",
                     g.model_dir.empty() ? "preset " + g.preset + " (synthetic)" : fs::path(g.model_dir).filename().string(),
                     g.pp, g.tp,
                     c.get_string("run.device"), g.chat ? "on" : "off",
                     g.max_tokens > 0 ? fmt::format(", max tokens {}", g.max_tokens) : std::string(),
                     c.get_int("swift.gamma"), c.get_double("swift.skip_ratio"), c.get_double("swift.epsilon"),
                     c.get_int("swift.max_draft"), c.get_int("swift.max_steps"), c.get_double("swift.target_matchness"),
                     c.get_double("swift.min_speedup"));
}

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream f(path);
  if (!f || !(f << text)) throw_error(ErrorCode::kIo, "{} {}: cannot write", flag, path);
}

int run_study_swift(Session& s, SwiftStudyOptions& o) {
  if (!check_layout(s, o.gen.pp, o.gen.tp, "study swift")) return 1;
  if (int rc = apply_flag_settings(s, {{"run.device", "--device", o.device}}); rc != 0) return rc;
  std::vector<Task> tasks;
  try {
    tasks = agree_on_tasks(s, o);
  } catch (const Error& e) {  // the same usage error on every rank: one message, exit 2 everywhere
    if (s.is_root()) spdlog::error("{}", e.what());
    return 2;
  }
  Config plain_cfg = s.config, swift_cfg = s.config;
  plain_cfg.set("run.swift", "false", SettingSource::kFlag, "study swift (plain run)");
  // The same kernel arithmetic in both runs: SWIFT turns batch-invariant matmuls on, so the
  // plain baseline has them too (its prefill would otherwise round differently).
  plain_cfg.set("kernels.batch_invariant", "true", SettingSource::kFlag, "study swift (plain run)");
  swift_cfg.set("run.swift", "true", SettingSource::kFlag, "study swift (SWIFT run)");
  o.gen.progress = false;
  runtime::SwiftStudy study;
  study.title = study_title(s, o);
  Progress bar("study swift", static_cast<int>(2 * tasks.size()), s.is_root() && !o.json);
  for (const auto& t : tasks) {
    const std::string plain_out = out_path(o, t, "plain"), swift_out = out_path(o, t, "swift");
    runtime::GenerateReport plain, swift;
    bar.step(fmt::format("{}: plain decoding", t.name));
    bool ok = generate_once(s, plain_cfg, o.gen, t, plain_out, plain);
    if (ok) bar.step(fmt::format("{}: SWIFT", t.name));
    ok = ok && generate_once(s, swift_cfg, o.gen, t, swift_out, swift);
    if (!ok) {
      if (s.is_root()) spdlog::warn("study swift: interrupted during task {}; every rank stopped cleanly", t.name);
      return 130;
    }
    if (s.is_root()) {
      study.tasks.push_back(task_result(t, plain.summary, swift.summary, plain_out, swift_out));
      if (o.keep_outputs.empty()) {
        std::error_code ec;
        fs::remove(plain_out, ec);
        fs::remove(swift_out, ec);
      }
    }
  }
  bar.done();
  if (!s.is_root()) return 0;
  if (!o.csv.empty()) write_file(o.csv, runtime::format_swift_csv(study), "--csv");
  if (!o.svg.empty()) write_file(o.svg, runtime::format_swift_svg(study), "--svg");
  if (o.json)
    std::cout << versioned_json(nlohmann::json::parse(runtime::format_swift_json(study))) << "\n";
  else
    std::cout << runtime::format_swift_table(study);
  if (!study.all_identical()) {
    for (const auto& t : study.tasks)
      if (!t.outputs.identical())
        spdlog::error("study swift: task {}: greedy outputs of plain and SWIFT decoding are NOT identical ({} of {} "
                      "requests differ; first: {})", t.task, t.outputs.differing,
                      t.outputs.requests + t.outputs.unmatched, t.outputs.first.empty() ? "nothing compared" : t.outputs.first);
    return 1;
  }
  return 0;
}

}  // namespace

Action define_study_swift(CLI::App& sub) {
  auto o = std::make_shared<SwiftStudyOptions>();
  auto& g = o->gen;
  sub.add_option("--model", g.model_dir, "Checkpoint: a directory (config.json + safetensors) or a .gguf file");
  sub.add_option("--preset", g.preset, "Without --model: a synthetic model generated in memory (see make-model)")
      ->capture_default_str();
  sub.add_option("--seed", g.seed, "Seed of the synthetic model's weights")->capture_default_str();
  add_layout_flags(sub, g.pp, g.tp);
  add_device_flag(sub, o->device);
  sub.add_option("--tasks", o->tasks,
                 "Prompts files (JSONL, as trellis run --prompts reads them), comma-separated; a task is named by its "
                 "file's stem")
      ->capture_default_str();
  sub.add_option("--chat", o->chat,
                 "Text prompts through the model's chat template: on, off, or auto (on when the model has one)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  sub.add_option("--max-tokens", g.max_tokens, "New tokens at most for every request (overrides the prompts' own)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--keep-outputs", o->keep_outputs,
                 "Keep both runs' outputs in this folder (TASK.plain.jsonl, TASK.swift.jsonl) to compare by hand");
  sub.add_option("--csv", o->csv, "Write the table as CSV here (rank 0)");
  sub.add_option("--svg", o->svg, "Write the matchness and speedup over time per task (the paper's Figure 6) here");
  sub.add_flag("--json", o->json, "Print JSON instead of the table");
  return [o](Session& s) { return run_study_swift(s, *o); };
}

}  // namespace trellis::launchers
