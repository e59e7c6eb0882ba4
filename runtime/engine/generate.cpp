// `trellis run` below the launcher: a prepared job (job.hpp), the workload, the engine, then
// the summary, output file and trace.
#include "trellis/runtime/engine/generate.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/engine/job.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"
#include "trellis/runtime/workload/workload.hpp"

namespace trellis::runtime {
namespace {

// Runs `fn` on rank 0; an error there becomes the same kInvalidArgument on every rank.
template <typename Fn>
void on_root_agreed(transport::Bootstrap& world, Deadline dl, Fn&& fn) {
  std::string err;
  if (world.rank() == 0) {
    try {
      fn();
    } catch (const Error& e) {
      err = e.what();
    }
  }
  std::vector<std::byte> b(err.size());
  if (!err.empty()) std::memcpy(b.data(), err.data(), err.size());
  world.broadcast(b, 0, dl);
  if (!b.empty())
    throw Error(ErrorCode::kInvalidArgument, std::string(reinterpret_cast<const char*>(b.data()), b.size()));
}

// Rank 0 reads the workload; a bad file becomes the same error on every rank.
std::vector<Request> load_workload(transport::Bootstrap& world, const GenerateOptions& o, int vocab, Deadline dl,
                                   std::string& source, std::optional<Tokenizer>& tokenizer) {
  Workload w;
  on_root_agreed(world, dl, [&] {
    // Text prompts through the model's own tokenizer (GGUF), else the byte tokenizer.
    if (!o.prompts.empty() || !o.prompt.empty()) tokenizer = Tokenizer::for_model(o.model_dir);
    const TextOptions text{tokenizer ? &*tokenizer : nullptr, o.chat};
    if (!o.prompts.empty()) {
      w = read_prompts(o.prompts, vocab, text);
    } else if (!o.prompt.empty()) {
      // One prompt from the command line, as the one-line prompts file it stands for.
      std::istringstream line(nlohmann::json({{"id", "prompt"}, {"text", o.prompt}}).dump());
      w = parse_prompts(line, "--prompt", vocab, text);
    } else {
      w = make_synthetic(parse_synthetic_spec(o.workload, "--workload"), vocab);
    }
    if (o.max_tokens > 0)
      for (auto& r : w.requests) r.sampling.max_tokens = o.max_tokens;
  });
  source = w.source;
  return std::move(w.requests);
}

// `--out`: one JSON line per request. Lines are written and flushed as requests end (on
// rank 0's scheduler thread, EngineOptions::on_finished), so what finished survives a rank
// that dies later; a run that completes rewrites the file in request order, which runs at
// different layouts compare line by line. A write that fails is reported once and the run
// goes on (the answers are still in the summary).
class OutWriter {
 public:
  OutWriter(std::string path, TextOptions text) : path_(std::move(path)), text_(text), f_(path_) {
    if (!f_) throw_error(ErrorCode::kIo, "--out {}: cannot be written", path_);
  }
  void write(const Request& q, const RequestResult& r) {
    if (!f_) return;
    f_ << line(q, r) << "\n" << std::flush;
    if (f_) {
      written_.fetch_add(1);
      whole_bytes_ = f_.tellp();
    } else {
      spdlog::error("--out {}: writing failed; the remaining answers are not written", path_);
    }
  }
  // After a complete run: the same lines, in request order, replacing the file at once.
  // Not after a failed write (a full disk): the file keeps what was written, and a rewrite
  // could only fail too. A rewrite that fails leaves the file as it was and no .tmp behind:
  // the run completed, so it is reported, not thrown (the fault suite found a full disk
  // turning a finished run into a failed one).
  void rewrite_in_order(const std::vector<Request>& reqs, const std::vector<RequestResult>& res) {
    const bool stream_failed = !f_;
    f_.close();
    if (!std::filesystem::is_regular_file(path_)) return;  // a pipe, /dev/stdout: as written
    if (stream_failed) {
      // The failed write may have left part of a line: cut the file back to its whole lines.
      std::error_code ec;
      if (whole_bytes_ >= 0) std::filesystem::resize_file(path_, static_cast<std::uintmax_t>(whole_bytes_), ec);
      spdlog::error("--out {}: holds the {} answers written before writing failed, in the order they finished",
                    path_, written_.load());
      return;
    }
    const std::string tmp = path_ + ".tmp";
    bool ok = false;
    {
      std::ofstream f(tmp);
      for (const auto& r : res) f << line(reqs[static_cast<std::size_t>(r.id)], r) << "\n";
      ok = static_cast<bool>(f.flush());
    }
    if (ok && std::rename(tmp.c_str(), path_.c_str()) == 0) {
      written_ = res.size();
      return;
    }
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    spdlog::error("--out {}: could not be rewritten in request order ({}): it keeps its {} answers in the order "
                  "they finished", path_, ok ? std::strerror(errno) : "writing " + tmp + " failed", written_.load());
  }
  std::size_t written() const { return written_.load(); }

 private:
  std::string line(const Request& q, const RequestResult& r) const {
    nlohmann::json j = {{"id", q.name},
                        {"status", r.status == RequestStatus::kFinished ? "ok" : "failed"},
                        {"reason", r.reason},
                        {"tokens", r.output}};
    if (q.from_text) j["text"] = decode_text(r.output, text_);
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string path_;
  TextOptions text_;
  std::ofstream f_;
  std::atomic<std::size_t> written_{0};
  std::streamoff whole_bytes_ = 0;  // end of the last whole line written (scheduler thread only)
};

struct PackedShares {
  double busy, comm, wait, wall;
};

}  // namespace

GenerateReport generate(transport::Bootstrap& world, const Config& config, const GenerateOptions& o) {
  const Deadline setup = Deadline::after(config.get_duration("comm.connect_timeout_ms") * 3);
  const StageHandoff handoff = parse_stage_handoff(config.get_string("comm.stage_handoff"),
                                                   "comm.stage_handoff (--stage-handoff)");
  refuse_stage_handoff_early(handoff, o.pp, config.get_string("run.device"));  // before loading
  const HandoffSignal signal = parse_handoff_signal(config.get_string("comm.handoff_signal"), "comm.handoff_signal");
  auto job = prepare_job(world, config, o);
  auto& eo = job->eo;
  eo.stop = o.stop;
  eo.stage_handoff = handoff;
  eo.handoff_signal = signal;
  const auto& grid = job->grid;
  const auto& topo = job->topo;
  const auto& cfg = job->cfg;
  const int me = job->me;
  auto& tracer = *job->tracer;
  StartupTimes startup = job->startup;
  std::string source;
  std::optional<Tokenizer> tokenizer;  // rank 0: decodes text outputs
  auto requests = load_workload(world, o, static_cast<int>(cfg.vocab_size), setup, source, tokenizer);
  const TextOptions text{tokenizer ? &*tokenizer : nullptr, o.chat};
  std::unique_ptr<OutWriter> out;
  if (!o.out.empty()) {
    on_root_agreed(world, setup, [&] { out = std::make_unique<OutWriter>(o.out, text); });
    if (out) eo.on_finished = [&out](const Request& q, const RequestResult& r) { out->write(q, r); };
  }
  if (me == 0)
    spdlog::info("trellis run: pp={} tp={} model {} ({} layers, hidden {}), {} requests, KV budget {} positions/rank",
                 o.pp, o.tp, o.model_dir.empty() ? fmt::format("preset {} ({})", o.preset, o.preset_dtype) : o.model_dir, cfg.num_layers, cfg.hidden_size,
                 requests.size(), eo.scheduler.kv_budget_tokens);
  world.barrier(setup);
  EngineResult result;
  try {
    result = run_engine(me, grid, *job->links, *job->stage, requests, eo, tracer);
  } catch (...) {
    if (out)
      spdlog::error("--out {}: {} of {} requests were written before the run failed", o.out, out->written(),
                    requests.size());
    throw;
  }
  // Gather the shares and the traces on rank 0.
  auto post = Deadline::after(eo.deadline);
  startup.connect_s = world.max(startup.connect_s, post);
  startup.load_s = world.max(startup.load_s, post);
  startup.warmup_s = world.max(startup.warmup_s, post);
  startup.warmup_prefill_s = world.max(startup.warmup_prefill_s, post);
  double wall = world.max(me == 0 ? result.wall_s : 0.0, post);
  auto sh = rank_shares(tracer, wall);
  PackedShares ps{sh.busy_s, sh.comm_s, sh.wait_s, sh.wall_s};
  std::vector<std::byte> psb(sizeof ps);
  std::memcpy(psb.data(), &ps, sizeof ps);
  auto all_shares = world.allgather(psb, post);
  std::vector<std::vector<std::byte>> all_events;
  if (!o.trace.empty()) all_events = world.allgather(pack_events(tracer.events()), post);
  GenerateReport rep;
  rep.interrupted = world.any(result.interrupted, post);
  if (me != 0) return rep;
  auto& s = rep.summary;
  s.layout = fmt::format("pp={} tp={} ({} ranks on {} host{})", o.pp, o.tp, world.size(), topo.hosts.size(),
                         topo.hosts.size() == 1 ? "" : "s");
  s.workload = source;
  s.techniques = fmt::format("cpu-sampler {} · tsem {} · sat {}", o.cpu_sampler ? "on" : "off", o.tsem ? "on" : "off",
                             o.sat ? "on" : "off");
  if (eo.scheduler.prefill_chunk > 0) s.techniques += fmt::format(" · prefill chunk {}", eo.scheduler.prefill_chunk);
  s.wall_s = result.wall_s;
  s.startup = startup;
  summarize_requests(s, requests, result.results, result.start_s);
  s.notes = result.notes;
  s.swift = result.swift;
  if (eo.scheduler.swift.enabled) s.techniques += " · swift";
  std::vector<RankLabel> labels;
  for (int r = 0; r < world.size(); ++r) {
    PackedShares p;
    std::memcpy(&p, all_shares[static_cast<std::size_t>(r)].data(), sizeof p);
    RankShares rs{r, grid.stage_of(r), grid.tp_of(r), topo.hosts[static_cast<std::size_t>(grid.host_of[static_cast<std::size_t>(r)])].name,
                  p.busy, p.comm, p.wait, p.wall};
    s.ranks.push_back(rs);
    labels.push_back({r, rs.stage, rs.tp, rs.host});
  }
  if (!o.trace.empty()) {
    std::vector<std::vector<TraceEvent>> evs;
    for (auto& b : all_events) evs.push_back(unpack_events(b));
    write_chrome_trace(o.trace, labels, evs);
    s.trace_path = o.trace;
  }
  if (out) {
    out->rewrite_in_order(requests, result.results);
    rep.out_written = out->written();
  }
  for (const auto& r : result.results)
    if (requests[static_cast<std::size_t>(r.id)].from_text) rep.texts.push_back(decode_text(r.output, text));
  return rep;
}

}  // namespace trellis::runtime
