// `trellis serve`: the PP x TP engine behind an OpenAI-compatible HTTP server on rank 0.
// Every rank sets the job up as `trellis run` does (runtime/engine/job.hpp); rank 0 then runs
// the HTTP server (serve/) and the engine's scheduler takes requests from a LiveQueue until a
// signal drains and stops it. See docs/serve.md.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <thread>

#include "commands.hpp"
#include "layout_flags.hpp"
#include "trellis/runtime/engine/job.hpp"
#include "trellis/runtime/engine/live.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"
#include "trellis/serve/server.hpp"

namespace trellis::launchers {
namespace {

struct ServeOptions {
  runtime::GenerateOptions gen;
  std::string host, api_key, model_name;
  // Flags that stand for settings, as given (empty: not given); Config::set checks them.
  std::string port, max_seqs, max_context, kv_budget, prefill_chunk, device;
  bool swift = false, no_cuda_graphs = false;
  std::string stage_handoff;  // --stage-handoff (setting comm.stage_handoff)
  std::string layer_split;    // --layer-split (setting run.layer_split)
};

std::atomic<bool> g_serve_stop{false};
extern "C" void on_serve_signal(int) { g_serve_stop.store(true); }

int apply_flags(Session& s, const ServeOptions& o) {
  return apply_flag_settings(s, {{"serve.host", "--host", o.host},
                                 {"serve.port", "--port", o.port},
                                 {"serve.api_key", "--api-key", o.api_key},
                                 {"run.max_seqs", "--max-seqs", o.max_seqs},
                                 {"run.max_context", "--max-context", o.max_context},
                                 {"run.kv_budget", "--kv-budget", o.kv_budget},
                                 {"run.prefill_chunk", "--prefill-chunk", o.prefill_chunk},
                                 {"run.device", "--device", o.device},
                                 {"run.swift", "--swift", o.swift ? std::string("true") : std::string()},
                                 {"run.cuda_graphs", "--no-cuda-graphs", o.no_cuda_graphs ? std::string("false") : std::string()},
                                 {"comm.stage_handoff", "--stage-handoff", o.stage_handoff},
                                 {"run.layer_split", "--layer-split", o.layer_split}});
}

serve::ServerOptions server_options(const Config& c, const ServeOptions& o) {
  serve::ServerOptions so;
  so.host = c.get_string("serve.host");
  const auto port = c.get_int("serve.port");
  if (port < 0 || port > 65535)
    throw_error(ErrorCode::kInvalidArgument, "serve.port (--port) must be in 0..65535, got {}", port);
  so.port = static_cast<int>(port);
  so.api_key = c.get_string("serve.api_key");
  so.model_name = o.model_name;
  if (so.model_name.empty())
    so.model_name = o.gen.model_dir.empty() ? "trellis-" + o.gen.preset
                                            : std::filesystem::path(o.gen.model_dir).stem().string();
  so.max_body_bytes = static_cast<std::size_t>(c.get_size("serve.max_body_bytes"));
  so.max_connections = static_cast<int>(c.get_int("serve.max_connections"));
  so.header_timeout = c.get_duration("serve.header_timeout_ms");
  so.body_timeout = c.get_duration("serve.body_timeout_ms");
  so.idle_timeout = c.get_duration("serve.idle_timeout_ms");
  so.queue_wait = c.get_duration("serve.queue_wait_ms");
  so.default_max_tokens = static_cast<int>(c.get_int("serve.default_max_tokens"));
  if (so.max_connections < 1 || so.default_max_tokens < 1)
    throw_error(ErrorCode::kInvalidArgument, "serve.max_connections ({}) and serve.default_max_tokens ({}) must be >= 1",
                so.max_connections, so.default_max_tokens);
  return so;
}

// Rank 0, on SIGTERM/SIGINT/SIGUSR1: refuse new work, let running requests finish for up to
// serve.drain_ms, then cancel what is left and let the engine stop every rank.
void drain_on_signal(runtime::LiveQueue& queue, serve::Server& server, Millis drain, const std::atomic<bool>& done) {
  while (!done.load()) {
    if (g_serve_stop.load()) {
      spdlog::info("serve: signal received: no new requests; draining for up to {} ms", drain.count());
      server.stop_accepting();
      queue.begin_drain();
      const auto until = Deadline::after(drain);
      for (;;) {
        auto st = queue.stats();
        if (st.running + st.waiting == 0 || st.failed || done.load()) break;
        if (until.expired()) {
          spdlog::warn("serve: drain deadline passed: cancelling {} running and {} waiting requests", st.running,
                       st.waiting);
          break;
        }
        std::this_thread::sleep_for(Millis(20));
      }
      queue.shutdown("the server is shutting down");
      return;
    }
    std::this_thread::sleep_for(Millis(50));
  }
}

int run_serve(Session& s, ServeOptions& o) {
  auto& g = o.gen;
  if (!check_layout(s, g.pp, g.tp, "serve")) return 1;
  if (int rc = apply_flags(s, o); rc != 0) return rc;
  const auto so = server_options(s.config, o);  // every rank: a bad flag fails everywhere alike
  // Signals first: a SIGTERM during the (long) load must not kill a rank half-way; it is
  // acted on once serving starts. Only rank 0 acts; the others stop when its stop message
  // arrives.
  g_serve_stop = false;
  std::signal(SIGINT, on_serve_signal);
  std::signal(SIGTERM, on_serve_signal);
  // Open MPI's mpirun turns SIGTERM/SIGINT into a job kill (forwarded, then SIGKILL about a
  // second later, before a drain can finish) but forwards SIGUSR1 as it is: under mpirun,
  // `kill -USR1 <mpirun pid>` is the graceful stop (docs/serve.md).
  std::signal(SIGUSR1, on_serve_signal);
  const auto handoff = runtime::parse_stage_handoff(s.config.get_string("comm.stage_handoff"),
                                                    "comm.stage_handoff (--stage-handoff)");
  runtime::refuse_stage_handoff_early(handoff, g.pp, s.config.get_string("run.device"));  // before loading
  const auto signal = runtime::parse_handoff_signal(s.config.get_string("comm.handoff_signal"), "comm.handoff_signal");
  auto job = runtime::prepare_job(s.world(), s.config, g);
  auto& eo = job->eo;
  eo.serving = true;
  eo.stage_handoff = handoff;
  eo.handoff_signal = signal;
  const Deadline setup = Deadline::after(s.config.get_duration("comm.connect_timeout_ms") * 3);
  std::optional<runtime::Tokenizer> tokenizer;
  std::unique_ptr<serve::TextCodec> codec;
  std::unique_ptr<runtime::LiveQueue> queue;
  std::unique_ptr<serve::Server> server;
  std::string failure;
  if (s.is_root()) {
    try {
      if (!g.model_dir.empty()) tokenizer = runtime::Tokenizer::for_model(g.model_dir);
      codec = tokenizer ? serve::make_tokenizer_codec(*tokenizer)
                        : serve::make_byte_codec(static_cast<int>(job->cfg.vocab_size));
      if (!tokenizer)
        spdlog::warn("serve: {} has no tokenizer trellis reads: text is encoded byte by byte (ids 0-255)",
                     g.model_dir.empty() ? "a synthetic model" : g.model_dir);
      runtime::LiveQueue::Limits lim;
      lim.max_waiting = static_cast<int>(s.config.get_int("serve.max_waiting"));
      queue = std::make_unique<runtime::LiveQueue>(lim);
      server = std::make_unique<serve::Server>(so, *queue, *codec);
      server->start();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // A server that cannot start (port taken, bad key file) ends every rank with its reason.
  if (s.world().any(!failure.empty(), setup)) {
    if (s.is_root()) spdlog::error("serve: {}", failure);
    return 1;
  }
  if (s.is_root()) {
    eo.live = queue.get();
    spdlog::info("serve: pp={} tp={} model '{}' on http://{}:{} (KV budget {} positions/rank, context {}); "
                 "ready once every rank has loaded",
                 g.pp, g.tp, so.model_name, so.host, server->port(), eo.scheduler.kv_budget_tokens,
                 eo.scheduler.max_context);
  }
  s.world().barrier(setup);
  std::atomic<bool> done{false};
  std::thread drainer;
  if (s.is_root())
    drainer = std::thread(drain_on_signal, std::ref(*queue), std::ref(*server), s.config.get_duration("serve.drain_ms"),
                          std::cref(done));
  auto finish = [&] {
    done = true;
    if (drainer.joinable()) drainer.join();
    if (server) server->stop();
  };
  try {
    runtime::run_engine(s.rank(), job->grid, *job->links, *job->stage, {}, eo, *job->tracer);
  } catch (...) {
    finish();
    throw;
  }
  finish();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  if (s.is_root()) {
    auto st = queue->stats();
    spdlog::info("serve: stopped after {} requests ({} finished, {} cancelled, {} rejected), {} tokens generated",
                 st.submitted, st.finished, st.cancelled, st.rejected, st.generated_tokens);
  }
  return 0;
}

}  // namespace

Action define_serve(CLI::App& sub) {
  auto o = std::make_shared<ServeOptions>();
  auto& g = o->gen;
  sub.add_option("--model", g.model_dir, "Checkpoint: a .gguf file (with its tokenizer and chat template) or a directory");
  sub.add_option("--preset", g.preset, "Without --model: a synthetic model generated in memory (byte-level text)")
      ->capture_default_str();
  sub.add_option("--preset-dtype", g.preset_dtype,
                 "The preset's weight dtype: f32 (kept in f32), bf16 or f16, as a checkpoint stored so would load")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  sub.add_option("--model-name", o->model_name, "The model id clients name (default: the file's stem)");
  add_variant_flags(sub, g.variant, g.variant_layers);
  add_layout_flags(sub, g.pp, g.tp);
  add_device_flag(sub, o->device);
  sub.add_option("--host", o->host, "Bind address (setting serve.host, default 127.0.0.1: this machine only)");
  sub.add_option("--port", o->port, "TCP port (setting serve.port, default 8000; 0: any free port)");
  sub.add_option("--api-key", o->api_key,
                 "Require 'Authorization: Bearer KEY' on every route but /health (setting serve.api_key; the "
                 "environment variable TRELLIS_API_KEY keeps it out of the process list)");
  sub.add_option("--max-seqs", o->max_seqs, "Sequences generating at once over all microbatches (run.max_seqs)");
  sub.add_option("--max-context", o->max_context, "Longest sequence, prompt + output (run.max_context)");
  sub.add_flag("--no-cuda-graphs", o->no_cuda_graphs,
               "Ablation: launch every op of a GPU decode step instead of replaying it as a CUDA graph "
               "(setting run.cuda_graphs)");
  sub.add_option("--stage-handoff", o->stage_handoff,
                 "Stage hand-off of the hidden state: auto (CUDA IPC between GPU stages of one host), host, cuda-ipc "
                 "(setting comm.stage_handoff)");
  sub.add_option("--layer-split", o->layer_split,
                 "Decoder layers per pipeline stage: even (default), auto (the last stage takes fewer, to make up "
                 "for the LM head it also runs), or one count per stage such as 22,8 (setting run.layer_split)");
  sub.add_flag("--swift", o->swift,
               "SWIFT self-speculative decoding for greedy requests (settings swift.*; docs/swift.md)");
  sub.add_option("--prefill-chunk", o->prefill_chunk,
                 "Prompt tokens prefilled per iteration, beside the others' decode steps (0: whole prompts; "
                 "run.prefill_chunk)");
  sub.add_option("--kv-budget", o->kv_budget, "KV-cache memory per rank, e.g. 256MiB (run.kv_budget)");
  sub.add_option("--seed", g.seed, "Seed of the synthetic model's weights")->capture_default_str();
  sub.add_flag("--pin-cores", g.pin_cores, "Bind each rank to the cores its placement gave it");
  return [o](Session& s) { return run_serve(s, *o); };
}

}  // namespace trellis::launchers
