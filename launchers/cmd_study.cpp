// `trellis study variants`: every communication-reducing model variant over a set of batch
// sizes on tensor-parallel groups (t x pp = world size), timed side by side, printed as
// Ladder Residual's Table 2/6 and written as CSV and an SVG chart (runtime/study). Every rank
// builds the same synthetic weights (--preset) or reads the same checkpoint (--model) and
// holds its 1/t shard; the TP group is the fastest the transport offers for the ranks'
// links (make_group: shm in a host, ring across hosts).
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/runtime/engine/device.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/progress.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/runtime/study/variant_study.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/selection.hpp"

namespace trellis::launchers {
namespace {

struct StudyOptions {
  std::string model, preset;
  std::string weights = "bf16";
  int tp = 0, pp = 1;
  std::string batches = "1,4,16,64";
  int prompt_len = 32, gen_len = 16, repeats = 3, warmup = 1;
  std::string variants = "standard,parallel,ladder,desync2,desync4,lp,nocomm";
  std::string ladder_layers, lp_layers;
  bool no_nvlink = false, json = false, wake_control = false;
  int wake_interval_us = 1000;
  std::string csv, svg;
  std::string transport;  // --transport; empty: setting comm.transport
};

std::vector<int> parse_batches(const std::string& text) {
  std::vector<int> out;
  for (const auto& t : split(text, ',')) {
    auto v = parse_int(trim(t), "--batch");
    if (v < 1) throw_error(ErrorCode::kInvalidArgument, "--batch: every size must be >= 1 (got {})", v);
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) throw_error(ErrorCode::kInvalidArgument, "--batch: no batch sizes given");
  return out;
}

// --no-nvlink: the setting transport's link selection reads (NVLink pairs become PCIe) and the
// environment NCCL needs (NCCL_P2P_DISABLE=1), set before any group is made. Only launchers/
// touches the environment. CPU groups (shm, ring) have no NVLink path, so on a CPU build it
// changes nothing measurable; the log says so.
void apply_no_nvlink(Session& s, bool flag) {
  if (flag) s.config.set("comm.no_nvlink", "true", SettingSource::kFlag, "--no-nvlink");
  auto policy = transport::SelectionPolicy::from_config(s.config);
  for (const auto& [k, v] : transport::environment_for(policy)) ::setenv(k.c_str(), v.c_str(), 1);
  if (policy.no_nvlink && s.is_root())
    spdlog::info("--no-nvlink: link selection without NVLink ({}); NCCL_P2P_DISABLE=1 for NCCL. "
                 "This study's CPU groups have no NVLink path, so it only matters on GPU builds.",
                 policy.describe());
}

std::unique_ptr<runtime::CheckpointReader> open_model(const StudyOptions& o, runtime::ModelConfig& cfg, std::string& name) {
  if (!o.model.empty() && !o.preset.empty())
    throw_error(ErrorCode::kInvalidArgument, "give --model or --preset, not both");
  if (!o.model.empty()) {
    auto reader = runtime::open_checkpoint(o.model);
    auto text = reader->config_json();
    if (!text) throw_error(ErrorCode::kNotFound, "{}: no config.json", reader->describe());
    cfg = runtime::parse_model_config(*text, reader->describe() + "/config.json");
    name = o.model;
    return reader;
  }
  const std::string preset = o.preset.empty() ? "small" : o.preset;
  cfg = runtime::model_preset(preset);
  name = "preset " + preset + " (synthetic, seed 1)";
  return runtime::make_synthetic_reader(cfg, o.weights == "f32" ? "F32" : "BF16", 1);
}

// "ladder@MODE[:US]": ladder with its all-reduces driven one way, as its own row, so that ways
// of driving are compared in one interleaved run. MODE: thread (background progress thread
// only), coop (the kernels' progress hook only), both, none (only the waits); US: the
// cooperative interval in microseconds (default: comm.progress_cooperative_us).
transport::ProgressOptions drive_mode(std::string mode, transport::ProgressOptions base) {
  if (auto colon = mode.find(':'); colon != std::string::npos) {
    const auto us = parse_int(mode.substr(colon + 1), "--variants ladder@MODE:US");
    if (us < 0) throw_error(ErrorCode::kInvalidArgument, "--variants: ladder@{}: the interval must be >= 0", mode);
    base.cooperative_interval = std::chrono::microseconds(us);
    mode.resize(colon);
  }
  if (mode != "thread" && mode != "coop" && mode != "both" && mode != "none")
    throw_error(ErrorCode::kInvalidArgument, "--variants: ladder@{}: unknown mode (valid: thread, coop, both, none)", mode);
  base.enabled = mode == "thread" || mode == "both";
  base.cooperative = mode == "coop" || mode == "both";
  return base;
}

std::vector<runtime::VariantSpec> parse_variants(const StudyOptions& o, const runtime::ModelConfig& cfg,
                                                 const transport::ProgressOptions& progress,
                                                 std::vector<runtime::StudyRun::PerSpec>& per_spec) {
  std::vector<runtime::VariantSpec> out;
  per_spec.clear();
  for (const auto& t : split(o.variants, ',')) {
    const std::string label(trim(t));
    const auto at = label.find('@');
    const std::string name = label.substr(0, at);
    if (at != std::string::npos && name != "ladder")
      throw_error(ErrorCode::kInvalidArgument, "--variants: '{}': only ladder takes a progress mode (ladder@MODE)", label);
    const std::string& layers = name == "ladder" ? o.ladder_layers : name == "lp" ? o.lp_layers : std::string();
    auto spec = runtime::parse_variant_spec(name, layers, cfg.num_layers);
    runtime::validate_variant(spec, cfg, o.tp);
    out.push_back(spec);
    runtime::StudyRun::PerSpec ps;
    if (at != std::string::npos) {
      ps.label = label;
      ps.progress = drive_mode(label.substr(at + 1), progress);
    }
    per_spec.push_back(ps);
  }
  // Speedup and bound share need standard and nocomm over the whole model: always run them.
  auto has = [&](runtime::Variant v) {
    for (const auto& s : out)
      if (s.kind == v && s.range_first == 0 && s.range_last == cfg.num_layers) return true;
    return false;
  };
  if (!has(runtime::Variant::kStandard)) {
    out.insert(out.begin(), runtime::VariantSpec{runtime::Variant::kStandard, 0, cfg.num_layers});
    per_spec.insert(per_spec.begin(), runtime::StudyRun::PerSpec{});
  }
  if (!has(runtime::Variant::kNoComm)) {
    out.push_back(runtime::VariantSpec{runtime::Variant::kNoComm, 0, cfg.num_layers});
    per_spec.push_back(runtime::StudyRun::PerSpec{});
  }
  return out;
}

int run_study(Session& s, StudyOptions o) {
  if (o.pp < 1) throw_error(ErrorCode::kInvalidArgument, "study variants: --pp must be >= 1 (got {})", o.pp);
  if (o.tp == 0) o.tp = s.size() / o.pp;
  if (!s.require_world(s.size() == o.tp * o.pp,
                       fmt::format("study variants: the world has {} ranks but --tp {} x --pp {} needs {}; "
                                   "launch with mpirun -np {}", s.size(), o.tp, o.pp, o.tp * o.pp, o.tp * o.pp)))
    return 1;
  if (!o.transport.empty()) s.config.set("comm.transport", o.transport, SettingSource::kFlag, "--transport");
  apply_no_nvlink(s, o.no_nvlink);
  const auto batches = parse_batches(o.batches);
  runtime::ModelConfig cfg;
  std::string model_name;
  auto reader = open_model(o, cfg, model_name);
  const auto progress = transport::ProgressOptions::from_config(s.config);
  std::vector<runtime::StudyRun::PerSpec> per_spec;
  const auto specs = parse_variants(o, cfg, progress, per_spec);
  const auto place = runtime::StagePlace::of(s.rank(), o.tp, o.pp, cfg.num_layers);

  kernels::Context ctx = runtime::cpu_context(s.config);
  // One TP group per stage (world ranks stage * tp ... stage * tp + tp - 1); make_group is
  // collective over the world, so every rank makes every stage's group in order.
  std::unique_ptr<transport::Group> group;
  std::string tp_links = "none";  // what the TP group's all-reduce runs over, for the title
  if (s.size() == 1) {
    group = transport::make_single_group(0);
  } else {
    const auto hosts = transport::host_map(s.world(), Deadline::after(s.config.get_duration("comm.connect_timeout_ms")));
    const auto policy = transport::SelectionPolicy::from_config(s.config);
    for (int st = 0; st < o.pp; ++st) {
      std::vector<int> members;
      bool one_host = true;
      for (int i = 0; i < o.tp; ++i) {
        members.push_back(st * o.tp + i);
        one_host = one_host && hosts[static_cast<std::size_t>(members.back())] == hosts[static_cast<std::size_t>(members[0])];
      }
      // --transport also steers the TP all-reduce, as in trellis run and eval ppl: the
      // group's link class is shared memory in one host, the network across hosts.
      auto choice = transport::choose_backend(one_host ? topology::LinkClass::kSharedMemory : topology::LinkClass::kTcp,
                                              false, policy);
      auto go = transport::follow_transport(transport::GroupOptions::from_config(s.config), choice);
      auto g = transport::make_group(s.world(), members, go, s.config, hosts);
      if (st == place.stage) {
        group = std::move(g);
        tp_links = go.algorithm == transport::Algorithm::kMpi ? std::string("MPI")
                   : one_host && (go.algorithm == transport::Algorithm::kAuto || go.algorithm == transport::Algorithm::kShm)
                       ? std::string("shared memory")
                       : fmt::format("{} links", transport::to_string(go.cross_host));
      }
    }
  }
  runtime::LoadOptions lo;
  lo.first_layer = place.first_layer;
  lo.last_layer = place.last_layer;
  lo.max_slots = *std::max_element(batches.begin(), batches.end());
  lo.max_seq_len = o.prompt_len + o.gen_len;
  lo.window_bytes = s.config.get_size("comm.coll_shm_window");
  lo.weight_dtype = o.weights == "f32" ? runtime::ElemType::kF32 : runtime::ElemType::kBF16;
  runtime::LlamaModel model(*reader, cfg, *group, ctx, lo);

  runtime::StudyRun run;
  run.place = place;
  run.prompt_len = o.prompt_len;
  run.gen_len = o.gen_len;
  run.repeats = o.repeats;
  run.warmup = o.warmup;
  run.deadline = s.config.get_duration("comm.deadline_ms");
  run.reader = reader.get();
  run.load = lo;
  run.progress = progress;
  run.per_spec = per_spec;
  run.wake_control = o.wake_control;
  run.wake_interval = std::chrono::microseconds(o.wake_interval_us);
  std::vector<runtime::StudyPoint> points;
  Progress bar("study", static_cast<int>(batches.size()), s.is_root() && !o.json);
  for (int b : batches) {
    bar.step(fmt::format("batch {}, {} variants interleaved", b, specs.size()));
    // Variants interleaved repeat by repeat (measure_interleaved): shared cores come in phases.
    for (auto& p : runtime::measure_interleaved(model, specs, b, run, s.world())) {
      if (s.is_root())
        spdlog::info("batch {} {}: prefill {:.3f} ms (compute thread CPU {:.3f} ms; {:.0f} background / {:.0f} "
                     "cooperative tests; {:.0f}% of ladder waits found the all-reduce done), decode {:.3f} ms ({:.0f}% "
                     "done)", b, p.variant, 1e3 * p.prefill_s, 1e3 * p.prefill_thread_cpu_s, p.prefill_background_tests,
                     p.prefill_cooperative_tests, 100 * p.prefill_hidden_waits, 1e3 * p.decode_s, 100 * p.decode_hidden_waits);
      points.push_back(std::move(p));
    }
  }
  bar.done();
  runtime::derive_study(points);
  if (!s.is_root()) return 0;

  const std::string title =
      fmt::format("trellis study variants: {}, tp={} (all-reduce: {}; links: {}{}), pp={}, {} weights, {} kernel threads per rank, "
                  "ladder progress thread {}{}{}", model_name, o.tp, group->describe(), tp_links,
                  s.config.get_bool("comm.no_nvlink") ? ", --no-nvlink" : "", o.pp, o.weights, ctx.threads(),
                  run.progress.enabled ? fmt::format("on ({} us)", run.progress.interval.count()) : std::string("off"),
                  o.wake_control ? fmt::format(", wake control ({} us) on every variant", o.wake_interval_us) : std::string(),
                  run.progress.cooperative
                      ? fmt::format(", cooperative progress in the kernels ({} us)", run.progress.cooperative_interval.count())
                      : std::string(", no cooperative progress"));
  if (!o.csv.empty()) std::ofstream(o.csv) << runtime::format_study_csv(points);
  if (!o.svg.empty()) std::ofstream(o.svg) << runtime::format_study_svg(points, title);
  if (o.json) {
    nlohmann::json j = {{"title", title}, {"tp", o.tp}, {"pp", o.pp}, {"group", group->describe()}, {"points", nlohmann::json::array()}};
    for (const auto& p : points)
      j["points"].push_back({{"variant", p.variant}, {"layers", p.layers}, {"batch", p.batch}, {"prefill_ms", 1e3 * p.prefill_s},
                             {"decode_ms", 1e3 * p.decode_s}, {"tokens_per_s", p.tokens_per_s}, {"speedup_pct", p.speedup_pct},
                             {"prefill_bound_share", p.prefill_bound_share}, {"decode_bound_share", p.decode_bound_share},
                             {"all_reduces_decode", p.all_reduces_decode}, {"exact", p.exact},
                             {"prefill_background_tests", p.prefill_background_tests},
                             {"prefill_cooperative_tests", p.prefill_cooperative_tests},
                             {"prefill_thread_cpu_ms", 1e3 * p.prefill_thread_cpu_s},
                             {"prefill_hidden_waits", p.prefill_hidden_waits},
                             {"decode_hidden_waits", p.decode_hidden_waits},
                             {"note", p.exact ? "" : runtime::kNoCommLabel}});
    std::cout << versioned_json(j) << "\n";  // NaN becomes null
  } else {
    std::cout << runtime::format_study_tables(points, title);
  }
  return 0;
}

}  // namespace

Action define_study_variants(CLI::App& sub) {
  auto o = std::make_shared<StudyOptions>();
  sub.add_option("--model", o->model, "Checkpoint directory or file (same on every rank)");
  sub.add_option("--preset", o->preset, "Synthetic model preset instead of --model (default: small)");
  sub.add_option("--weights", o->weights, "Weight type in memory (and of a preset's synthetic weights): bf16 or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  sub.add_option("--tp", o->tp, "Tensor-parallel ranks per stage (default: world size / pp)");
  sub.add_option("--pp", o->pp, "Pipeline stages (world = tp x pp; rank = stage x tp + TP rank)")->capture_default_str();
  sub.add_option("--batch", o->batches, "Batch sizes, comma-separated")->capture_default_str();
  sub.add_option("--prompt-len", o->prompt_len, "Prompt tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--gen-len", o->gen_len, "Decode steps")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--repeats", o->repeats, "Timed repeats per point (median)")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--warmup", o->warmup, "Untimed repeats before them")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub.add_option("--variants", o->variants,
                 "Variants, comma-separated (standard and nocomm are always added); ladder@thread, ladder@coop, "
                 "ladder@both, ladder@none: ladder with its all-reduces driven by the progress thread, the kernels' "
                 "progress hook, both or neither, each its own row (coop:US, both:US: cooperative interval)")
      ->capture_default_str();
  sub.add_option("--ladder-layers", o->ladder_layers, "Layers A-B (inclusive) ladder applies to (default: all)");
  sub.add_option("--lp-layers", o->lp_layers, "Layers A-B (inclusive) lp pairs up (default: all)");
  sub.add_option("--transport", o->transport,
                 "Link backend override, NAME or CLASS=NAME,... (setting comm.transport); it steers the TP all-reduce "
                 "as in trellis run: tcp or ucx -> the ring over those links, shm -> the shm group, mpi -> MPI");
  sub.add_flag("--no-nvlink", o->no_nvlink, "Interconnect study without NVLink (comm.no_nvlink + NCCL_P2P_DISABLE=1; GPU builds)");
  sub.add_flag("--wake-control", o->wake_control,
               "Run every variant beside an idle thread that wakes every --wake-interval-us (a control for the OS "
               "scheduler favouring processes with a waking thread, such as ladder's progress thread, when cores are "
               "shared with other work)");
  sub.add_option("--wake-interval-us", o->wake_interval_us, "Wake interval of --wake-control's idle thread")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--csv", o->csv, "Write the results as CSV here (rank 0)");
  sub.add_option("--svg", o->svg, "Write the grouped bar chart here (rank 0)");
  sub.add_flag("--json", o->json, "Print JSON instead of tables");
  return [o](Session& s) { return run_study(s, *o); };
}

}  // namespace trellis::launchers
