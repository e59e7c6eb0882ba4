#include "commands.hpp"

#include <array>

namespace trellis::launchers {
namespace {

constexpr std::array kGroups = {
    GroupSpec{"bench", "Measure communication, kernels and models"},
    GroupSpec{"study", "Compare model variants or decoding methods side by side"},
    GroupSpec{"eval", "Evaluate a model's quality (perplexity)"},
};

constexpr std::array kCommands = {
    CommandSpec{"info", "Print versions, transports, devices, settings and (under mpirun) every rank",
                &define_info},
    CommandSpec{"convert",
                "Write a checkpoint (GGUF or safetensors) as a Hugging Face directory: config.json + safetensors, f32 or bf16",
                &define_convert},
    CommandSpec{"make-model", "Write a deterministic synthetic Llama checkpoint (config.json + safetensors) from a preset",
                &define_make_model},
    CommandSpec{"verify-model",
                "Check every tensor of a checkpoint against its SHA-256 manifest (written on first use)",
                &define_verify_model},
    CommandSpec{"model-logits", "(testing) Run a model on given token ids and write its logits (reference checks)",
                &define_model_logits},
    CommandSpec{"bench model",
                "Decode tokens/s at batch 1 against the triad memory-bandwidth limit, beside PyTorch eager",
                &define_bench_model},
    CommandSpec{"run",
                "Generate with a model laid out as --pp stages x --tp ranks (under mpirun); summary, "
                "--out tokens, --trace timeline",
                &define_run},
    CommandSpec{"serve",
                "Serve the model over an OpenAI-compatible HTTP API (completions, chat, streaming, /metrics) "
                "from a --pp x --tp job under mpirun",
                &define_serve},
    CommandSpec{"bench ring",
                "Pass messages around a ring of ranks over MPI and report latency and bandwidth",
                &define_bench_ring},
    CommandSpec{"bench comm",
                "Point-to-point per link backend, all-reduce per algorithm and stage streaming, "
                "beside ucx_perftest, MPI_Allreduce and gloo; writes the planner's calibration file",
                &define_bench_comm},
    CommandSpec{"bench handoff",
                "Stage hand-off through CUDA IPC between two ranks of one host vs a device-to-device cudaMemcpy "
                "of the same bytes (GPU builds; mpirun -np 2)",
                &define_bench_handoff},
    CommandSpec{"bench kernels",
                "Time kernels: prefill GEMM vs OpenBLAS (cpu) or cuBLASLt (cuda), decode GEMV vs memory bandwidth",
                &define_bench_kernels},
    CommandSpec{"topo", "Show hosts, GPUs, NICs and their links (live, hwloc XML or synthetic) and place a PP x TP grid",
                &define_topo},
    CommandSpec{"plan", "Predict throughput, TPOT, TTFT and memory of every PP x TP x variant layout and rank them",
                &define_plan},
    CommandSpec{"study variants",
                "Time every model variant (standard, parallel, ladder, desync, lp, nocomm) over batch sizes "
                "on one TP group: Ladder Residual Table 2/6, CSV, SVG chart",
                &define_study_variants},
    CommandSpec{"study swift",
                "Generate each task's prompts plain and with SWIFT self-speculative decoding: the paper's Table 4 "
                "(M, acceptance, speedup), identical outputs, CSV, Figure 6 SVG",
                &define_study_swift},
    CommandSpec{"eval ppl",
                "Perplexity of a model on a text file under any --pp x --tp layout (llama.cpp's windows: "
                "second half of each --ctx window scored)",
                &define_eval_ppl},
};

}  // namespace

std::span<const CommandSpec> all_commands() { return kCommands; }
std::span<const GroupSpec> all_groups() { return kGroups; }

}  // namespace trellis::launchers
