// The mpirun lines and hostfiles of a pick (launch.hpp).
#include "trellis/sim/launch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

#include "trellis/sim/units.hpp"

namespace trellis::sim {

std::string shell_quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,/:@%") ==
                        std::string::npos)
    return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

Launch launch_commands(const PlanRequest& r, const Candidate& c, const std::vector<std::string>& hosts,
                       const std::string& checkpoint) {
  Launch out;
  out.model = checkpoint.empty() ? std::string("\"$TRELLIS_MODEL\"") : shell_quote(checkpoint);
  const int ranks = c.layout.p * c.layout.t, dph = r.cluster.devices_per_host;
  const bool gpu = r.cluster.device.kind == DeviceKind::kGpu;
  std::string flags = fmt::format("--pp {} --tp {}", c.layout.p, c.layout.t);
  if (c.layout.variant != Variant::kStandard) flags += fmt::format(" --variant {}", to_string(c.layout.variant));
  flags += fmt::format(" --max-seqs {}", c.batch);
  if (c.layout.prefill_chunk > 0) flags += fmt::format(" --prefill-chunk {}", c.layout.prefill_chunk);
  if (c.layout.head_aware_split && c.layout.p > 1) flags += " --layer-split auto";
  const std::string swift = r.swift ? " --swift" : "";
  std::map<int, int> on_host;  // replicas started so far per first host (ports)
  for (int i = 0; i < c.replicas; ++i) {
    Launch::Replica rep;
    const int first = i * ranks;
    int lo_dev = dph, hi_dev = -1;
    for (int rank = first; rank < first + ranks;) {
      const int h = rank / dph, local = rank % dph;
      const int take = std::min(dph - local, first + ranks - rank);
      const std::string name = h < static_cast<int>(hosts.size()) ? hosts[static_cast<std::size_t>(h)]
                                                                   : fmt::format("host{}", h);
      rep.hostfile += fmt::format("{} slots={}", name, take);
      if (gpu && (local > 0 || take < dph)) rep.hostfile += fmt::format("  # GPUs {}-{}", local, local + take - 1);
      rep.hostfile += "\n";
      lo_dev = std::min(lo_dev, local);
      hi_dev = std::max(hi_dev, local + take - 1);
      rank += take;
    }
    // Inside one host it shares: name its GPUs.
    if (gpu && ranks < dph && first / dph == (first + ranks - 1) / dph)
      for (int g = lo_dev; g <= hi_dev; ++g) {
        if (!rep.devices.empty()) rep.devices += ',';
        rep.devices += std::to_string(g);
      }
    rep.port = 8000 + on_host[first / dph]++;
    const std::string env = rep.devices.empty() ? std::string() : " -x CUDA_VISIBLE_DEVICES=" + rep.devices;
    const std::string mpirun = fmt::format("mpirun -np {} --hostfile hosts.{}{} trellis", ranks, i, env);
    rep.serve = fmt::format("{} serve --model {} {} --port {}", mpirun, out.model, flags, rep.port);
    rep.run = fmt::format("{} run --model {} {}{} --workload n={},in={},out={}", mpirun, out.model, flags, swift,
                          c.batch, r.work.prompt_len, r.work.gen_len);
    out.replicas.push_back(std::move(rep));
  }
  if (checkpoint.empty())
    out.notes.push_back(fmt::format("TRELLIS_MODEL: a checkpoint of {} (a directory with config.json and safetensors, "
                                    "or a .gguf)",
                                    r.model.name));
  if (c.replicas > 1)
    out.notes.push_back(fmt::format("{} replicas: one mpirun each (hosts.0 .. hosts.{}), clients spread over their "
                                    "ports by a load balancer",
                                    c.replicas, c.replicas - 1));
  if (gpu && c.replicas > 1 && (ranks < dph ? dph % ranks != 0 : ranks % dph != 0))
    out.notes.push_back("a replica shares a host with the next one: give each mpirun its GPUs (the hostfile "
                        "comments say which), e.g. with a rankfile");
  if (c.layout.microbatches != c.layout.p)
    out.notes.push_back(fmt::format("the plan assumes m={} decode microbatches; trellis runs p={} microbatch groups",
                                    c.layout.microbatches, c.layout.p));
  const int wave = c.prediction.prefill_microbatches;
  if (c.layout.prefill_chunk == 0 && wave > 0 && wave != c.layout.p)
    out.notes.push_back(fmt::format("the plan prefills the batch's prompts in {} microbatches; trellis prefills "
                                    "them in its p={} groups, up to run.max_iteration_tokens per iteration",
                                    wave, c.layout.p));
  if (c.needs_trained_model)
    out.notes.push_back(fmt::format("--variant {} needs a checkpoint trained as {} ({} is {}): with this one the "
                                    "outputs differ from the model's",
                                    to_string(c.layout.variant), to_string(c.layout.variant), r.model.name,
                                    to_string(r.model.trained_variant)));
  if (c.layout.ep > 1)
    out.notes.push_back(fmt::format("ep={}: the routed experts of each stage are spread over the {} ranks of that stage "
                                    "in {} neighbouring replicas, which run in lock step; trellis run and serve have "
                                    "no expert parallelism (nor experts): this is a prediction for an engine that "
                                    "has both",
                                    c.layout.ep, c.layout.ep, c.layout.ep / c.layout.t));
  if (r.swift)
    out.notes.push_back("the TPOT assumes SWIFT self-speculative decoding, estimated by Eq. (6), not measured: "
                        "the run line drafts with --swift (serve takes --swift too; greedy requests "
                        "only)");
  if (c.precision == Precision::kFp8)
    out.notes.push_back("fp8 is predicted for FP8 (e4m3) weights and KV cache on FP8 tensor cores; trellis run and "
                        "serve compute in the checkpoint's own format");
  return out;
}

std::string sbatch_script(const PlanRequest& r, const Candidate& c, const std::string& checkpoint,
                          const std::string& command_line, int cores_per_host) {
  const int ranks = c.layout.p * c.layout.t;
  const int per_host = std::max(1, std::min(r.cluster.devices_per_host, ranks));
  const int nodes = (ranks + per_host - 1) / per_host;
  const bool gpu = r.cluster.device.kind == DeviceKind::kGpu;
  const int cpus_per_task = cores_per_host > 0 ? std::max(1, cores_per_host / std::max(1, r.cluster.devices_per_host)) : 0;
  // A catalog name, or the checkpoint directory's name: what Slurm lists the job as.
  std::string name = checkpoint.empty() ? r.model.name : std::filesystem::path(checkpoint).filename().string();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_') ch = '-';
  const auto& p = c.prediction;
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# trellis plan's pick for {} on {}:\n", checkpoint.empty() ? r.model.name : checkpoint,
                   r.cluster.description);
  s += fmt::format("#   {} replica(s) x pp {} x tp {}, variant {}, batch {} per replica, {} microbatch(es);\n", c.replicas,
                   c.layout.p, c.layout.t, to_string(c.layout.variant), c.batch, c.layout.microbatches);
  s += fmt::format("#   predicted {:.0f} tokens/s in all, TPOT {:.2f} ms, TTFT {:.1f} ms, {:.1f} GiB per {}.\n",
                   c.total_tokens_per_s, p.tpot_s * 1e3, p.ttft_s * 1e3, p.memory.total() / kGiB,
                   gpu ? "GPU" : "rank");
  s += fmt::format("# Written by: {}\n", command_line);
  s += "# Submit: sbatch THIS_FILE";
  s += checkpoint.empty() ? fmt::format(" with TRELLIS_MODEL=<{}'s checkpoint: a directory with config.json and "
                                        "safetensors, or a .gguf>",
                                        r.model.name)
                          : " (TRELLIS_MODEL=... to load another checkpoint)";
  s += "; TRELLIS=... picks the binary. docs/launch.md\n";
  s += fmt::format("#SBATCH --job-name=trellis-{}-{}\n", name, fmt::format("{}x{}x{}", c.replicas, c.layout.p, c.layout.t));
  s += fmt::format("#SBATCH --nodes={}\n", nodes);
  if (ranks % per_host != 0) s += fmt::format("#SBATCH --ntasks={}\n", ranks);
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", per_host);
  if (gpu) s += "#SBATCH --gpus-per-task=1\n";
  if (cpus_per_task > 0) s += fmt::format("#SBATCH --cpus-per-task={}\n", cpus_per_task);
  if (c.replicas > 1) {
    s += fmt::format("# One array task per data-parallel replica ({}); give each its own prompts (--prompts).\n",
                     c.replicas);
    s += fmt::format("#SBATCH --array=0-{}\n", c.replicas - 1);
  }
  s += "#SBATCH --output=trellis-%j.out\n";
  s += "set -euo pipefail\n";
  s += "TRELLIS=${TRELLIS:-trellis}\n";
  s += fmt::format("MODEL=${{TRELLIS_MODEL:-{}}}\n", shell_quote(checkpoint));
  s += fmt::format("[ -n \"$MODEL\" ] && [ -e \"$MODEL\" ] || {{ echo \"set TRELLIS_MODEL to {}'s checkpoint "
                   "(directory with config.json + safetensors, or a .gguf); got '$MODEL'\" >&2; exit 2; }}\n",
                   name);
  s += "# srun starts the tasks on the nodes Slurm gave; PMIx (--mpi=pmix) gives each its MPI rank.\n";
  s += fmt::format("srun --mpi=pmix \"$TRELLIS\" run --model \"$MODEL\" --pp {} --tp {}", c.layout.p, c.layout.t);
  if (c.layout.variant != Variant::kStandard) s += fmt::format(" --variant {}", to_string(c.layout.variant));
  s += fmt::format(" --max-seqs {}", c.batch);
  if (c.layout.prefill_chunk > 0) s += fmt::format(" --prefill-chunk {}", c.layout.prefill_chunk);
  if (c.layout.head_aware_split && c.layout.p > 1) s += " --layer-split auto";
  if (r.swift) s += " --swift";
  s += fmt::format(" \\\n  --workload n={},in={},out={} --out \"trellis-$SLURM_JOB_ID.jsonl\"\n", c.batch,
                   r.work.prompt_len, r.work.gen_len);
  return s;
}

}  // namespace trellis::sim
