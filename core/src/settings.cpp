// The one table of settings. Add a row here to declare a setting; nothing else declares
// settings. Keep names dotted by layer (log., comm., topo., model., run., plan.).
#include <array>
#include <cstdint>

#include "trellis/core/config.hpp"

namespace trellis {
namespace {

using T = SettingType;
// Bounds shared by the ranges below (SettingSpec::min/max): generous for any real machine or
// job, small enough that a typo fails at start-up instead of exhausting the host.
constexpr std::int64_t kKiB = 1024, kMiB = kKiB << 10, kGiB = kMiB << 10, kTiB = kGiB << 10;
constexpr std::int64_t kSecondUs = 1000000, kHourMs = 3600 * 1000, kDayMs = 24 * kHourMs;
constexpr std::int64_t kMaxThreads = 1024;     // per rank
constexpr std::int64_t kMaxTokens = 1 << 20;   // context, iteration and generation lengths
constexpr std::int64_t kMaxPolls = 1000000000;  // spin/yield counts of a wait
constexpr std::array kSettings = {
    SettingSpec{"log.level", T::kString, "info",
                "Log level: trace, debug, info, warn, error, critical, off", "TRELLIS_LOG_LEVEL"},
    SettingSpec{"log.all_ranks", T::kBool, "false",
                "Let every rank log at log.level (default: non-root ranks log warnings only)",
                "TRELLIS_LOG_ALL_RANKS"},
    SettingSpec{"comm.deadline_ms", T::kDurationMs, "30000",
                "Longest any blocking communication may wait before the rank reports the peer "
                "or link that failed and exits",
                "TRELLIS_DEADLINE_MS",
                1, kDayMs},
    SettingSpec{"comm.connect_timeout_ms", T::kDurationMs, "20000",
                "Longest a rank waits for its peers to connect at start-up",
                "TRELLIS_CONNECT_TIMEOUT_MS",
                1, kDayMs},
    SettingSpec{"comm.transport", T::kString, "auto",
                "Link backend override: 'auto' (policy table), NAME for every link, or "
                "CLASS=NAME[,CLASS=NAME...] per link class (names: shm ucx tcp mpi nccl)",
                "TRELLIS_TRANSPORT"},
    SettingSpec{"comm.allow_mpi_recovery", T::kBool, "false",
                "Start under mpirun --enable-recovery (refused by default: trellis cannot recover a lost rank, and "
                "mpirun then never exits after the survivors name it)",
                "TRELLIS_ALLOW_MPI_RECOVERY"},
    SettingSpec{"comm.bind_cores", T::kBool, "true",
                "Under mpirun/srun: when the launcher left the ranks of a host free to share CPUs (--bind-to "
                "none, socket binding), bind each to an even share of whole cores at start (a CPU each, distinct "
                "cores first, when there are fewer cores than ranks), so the first measurement is not taken with "
                "two ranks on one core; warn naming ranks that must share",
                "TRELLIS_BIND_CORES"},
    SettingSpec{"comm.no_nvlink", T::kBool, "false",
                "Remove NVLink paths from link selection (and set NCCL_P2P_DISABLE=1 for NCCL)",
                "TRELLIS_NO_NVLINK"},
    SettingSpec{"comm.tp_collectives", T::kString, "auto",
                "TP all-reduce of a GPU model: auto (NCCL in GPU memory when every rank of a TP group has its own GPU, "
                "else staged through host memory), nccl (refuse a layout where it cannot), host",
                "TRELLIS_TP_COLLECTIVES"},
    SettingSpec{"comm.shm.ring_bytes", T::kSize, "4MiB",
                "Bytes of each direction's ring in a shared-memory link segment", "TRELLIS_SHM_RING_BYTES",
                64 * kKiB, kGiB},
    SettingSpec{"comm.tcp.address", T::kString, "",
                "Interface name or IP address the tcp link binds to (empty: loopback when every peer is on this "
                "host, else the host's address)",
                "TRELLIS_TCP_ADDRESS"},
    SettingSpec{"comm.tcp.max_frame", T::kSize, "1GiB",
                "Largest tcp frame accepted; a peer announcing more is dropped as malformed",
                "TRELLIS_TCP_MAX_FRAME",
                kKiB, 64 * kGiB},
    SettingSpec{"comm.tcp.hello_timeout_ms", T::kDurationMs, "2000",
                "An incoming tcp connection must authenticate (send its greeting with the job token) within "
                "this, or it is closed; at most 64 unauthenticated connections are held at once",
                "TRELLIS_TCP_HELLO_TIMEOUT_MS",
                1, 10 * 60 * 1000},
    SettingSpec{"comm.coll_algorithm", T::kString, "auto",
                "Collective algorithm for groups: auto (shm in a host, ring across hosts, "
                "hierarchical when both), mpi, shm, ring, hierarchical",
                "TRELLIS_COLL_ALGORITHM"},
    SettingSpec{"comm.coll_backend", T::kString, "ucx",
                "Link backend the ring and hierarchical collectives use between hosts", "TRELLIS_COLL_BACKEND"},
    SettingSpec{"comm.coll_shm_slot_bytes", T::kSize, "256KiB",
                "Bytes per rank per ring slot in a shm collective segment (messages go in pieces of this size)",
                "TRELLIS_COLL_SHM_SLOT_BYTES",
                64, kGiB},
    SettingSpec{"comm.coll_shm_slots", T::kInt, "8",
                "Ring slots per rank in a shm collective segment: pieces in flight at once (at least 2)", "",
                2, 1024},
    SettingSpec{"comm.coll_one_shot_max", T::kSize, "32KiB",
                "shm all-reduce: every rank sums all inputs up to this size, reduce-scatter+all-gather above",
                "",
                0, kGiB},
    SettingSpec{"comm.coll_shm_park", T::kBool, "true",
                "shm collectives: a rank that spun and yielded without its peers moving blocks on a futex "
                "until a peer publishes (false: keeps yielding, then sleeping, as other waits do)",
                ""},
    SettingSpec{"comm.coll_shm_window", T::kSize, "64MiB",
                "Most bytes per rank of shared memory a model registers with its TP group for the partial sums "
                "the TP all-reduce completes (two buffers; trellis run asks for two of its largest forward, "
                "run.max_iteration_tokens rows); in a host the all-reduce then copies nothing in or out. "
                "Larger forwards take the copying path; 0: never register",
                "TRELLIS_COLL_SHM_WINDOW",
                0, 64 * kGiB},
    SettingSpec{"comm.coll_doubling_max", T::kSize, "64KiB",
                "ring all-reduce: recursive doubling up to this size (power-of-two groups), ring above", "",
                0, kGiB},
    SettingSpec{"comm.progress_thread", T::kBool, "true",
                "Drive asynchronous all-reduces (Ladder Residual) on a background thread that sleeps "
                "comm.progress_interval_us between tests, so they move while the next module computes",
                "TRELLIS_PROGRESS_THREAD"},
    SettingSpec{"comm.progress_interval_us", T::kInt, "20",
                "Progress thread: microseconds slept between tests of outstanding requests (0: yield)",
                "TRELLIS_PROGRESS_INTERVAL_US",
                0, kSecondUs},
    SettingSpec{"comm.progress_cooperative", T::kBool, "true",
                "Ladder: the compute thread's kernels also test the in-flight all-reduce between GEMM blocks "
                "(kernels' progress hook), at most every comm.progress_cooperative_us",
                "TRELLIS_PROGRESS_COOPERATIVE"},
    SettingSpec{"comm.progress_cooperative_us", T::kInt, "100",
                "Cooperative progress: least microseconds between two tests from inside the kernels", "",
                0, kSecondUs},
    SettingSpec{"comm.wait_spins", T::kInt, "2000",
                "Blocking communication waits: most polls spent spinning before yielding the core between "
                "polls; a thread spins less while its yields show its core is shared (then ranks hand over sooner)",
                "TRELLIS_WAIT_SPINS",
                0, kMaxPolls},
    SettingSpec{"comm.wait_yields", T::kInt, "20000",
                "Blocking communication waits: polls (from the start) before sleeping between polls", "",
                0, kMaxPolls},
    SettingSpec{"comm.wait_sleep_us", T::kInt, "50",
                "Blocking communication waits: microseconds slept between polls once idle", "",
                0, kSecondUs},
    SettingSpec{"comm.stream_mode", T::kString, "aware",
                "Stage-to-stage streaming: aware (schema once, raw bytes after) or baseline (size, "
                "metadata blob, then each tensor, every iteration)",
                "TRELLIS_STREAM_MODE"},
    SettingSpec{"comm.stage_handoff", T::kString, "auto",
                "Stage hand-off of the hidden state: auto (CUDA IPC between CUDA stages of one host, the host path "
                "elsewhere), host (device -> host, the link, host -> device), cuda-ipc (refused where it cannot be: "
                "a CPU stage, different hosts, a build without CUDA)",
                "TRELLIS_STAGE_HANDOFF"},
    SettingSpec{"run.host_waits", T::kString, "auto",
                "How the engine's threads of a rank wait for each other (scheduling channel, input buffers, logits, "
                "tokens): block (condition variables, short sleeps; cores left to other ranks), spin (poll and "
                "yield for the first ~20 ms of a wait, then block: wake-ups within a microsecond, a busy core per "
                "waiting thread), auto (spin where the stages "
                "run on CUDA GPUs and the rank has 4 or more cores of its own, block otherwise)",
                "TRELLIS_HOST_WAITS"},
    SettingSpec{"comm.handoff_signal", T::kString, "auto",
                "How the GPU streams of a CUDA IPC stage hand-off order their work: auto (stream-value where the "
                "CUDA driver offers stream memory operations, event otherwise), event (interprocess CUDA events), "
                "stream-value (cuStreamWriteValue32/cuStreamWaitValue32 on two words in the receiver's memory); a "
                "named signal that cannot be set up is an error",
                "TRELLIS_HANDOFF_SIGNAL"},
    SettingSpec{"bench.iters", T::kInt, "200", "Timed iterations per point in `trellis bench`",
                "TRELLIS_BENCH_ITERS",
                1, 10000000},
    SettingSpec{"bench.warmup", T::kInt, "20", "Untimed warm-up iterations per point", "",
                0, 10000000},
    SettingSpec{"kernels.threads", T::kInt, "0",
                "Threads for CPU kernels (matmul, attention, ...) per rank; 0 = every CPU the rank may run on (its core binding)",
                "TRELLIS_KERNEL_THREADS",
                0, kMaxThreads},
    SettingSpec{"model.weights_format", T::kString, "dequant",
                "GGUF weights stored block-quantised (Q4_1, Q8_0): dequant (to f32/bf16 at load; exact "
                "stored values, results stable under any layout) or native (kept quantised, multiplied "
                "with 8-bit activations as llama.cpp does: ~5x fewer bytes, ~2x decode speed, but "
                "rounding-sensitive, so t > 1 need not reproduce t = 1 token for token)",
                "TRELLIS_WEIGHTS_FORMAT"},
    SettingSpec{"run.device", T::kString, "auto",
                "Where `trellis run`/`serve` compute: auto (a GPU when every rank sees one, else the CPU), cpu, or "
                "cuda (refused before loading when a rank sees no GPU). Each rank binds to GPU (its index among its "
                "host's ranks) modulo the GPUs it sees (CUDA_VISIBLE_DEVICES applies)",
                "TRELLIS_DEVICE"},
    SettingSpec{"run.max_seqs", T::kInt, "32",
                "Sequences generating at once in `trellis run`, over all p microbatches (each "
                "microbatch holds max_seqs / p)",
                "TRELLIS_RUN_MAX_SEQS",
                1, 4096},
    SettingSpec{"run.max_context", T::kInt, "512",
                "Longest sequence (prompt + generated) `trellis run` accepts; sizes each KV slot",
                "TRELLIS_RUN_MAX_CONTEXT",
                1, kMaxTokens},
    SettingSpec{"run.kv_budget", T::kSize, "1GiB",
                "KV-cache memory each rank may reserve for running sequences; requests wait "
                "when it is full and are rejected when they could never fit",
                "TRELLIS_RUN_KV_BUDGET",
                64 * kKiB, 16 * kTiB},
    SettingSpec{"run.max_iteration_tokens", T::kInt, "4096",
                "Input tokens one iteration may carry (bounds prefill bursts)", "",
                1, kMaxTokens},
    SettingSpec{"run.prefill_chunk", T::kInt, "0",
                "Prompt tokens prefilled per iteration (chunked prefill): a longer prompt is prefilled over "
                "several iterations of its microbatch, each beside the decode steps of the others, so it does "
                "not stall them; 0 prefills a whole prompt at once. At most run.max_iteration_tokens",
                "TRELLIS_RUN_PREFILL_CHUNK",
                0, kMaxTokens},
    SettingSpec{"run.layer_split", T::kString, "even",
                "Decoder layers per pipeline stage: even (the default), auto (the last stage takes fewer "
                "layers to make up for the LM head it also runs every step, weighed in layers by "
                "parameters), or a list such as 22,8 (one count per stage, adding up to the layers)",
                "TRELLIS_RUN_LAYER_SPLIT"},
    SettingSpec{"run.progress_interval_us", T::kInt, "50",
                "trellis run: microseconds the engine's progress thread sleeps between passes over its links",
                "TRELLIS_RUN_PROGRESS_INTERVAL_US",
                0, kSecondUs},
    SettingSpec{"run.progress_idle_us", T::kInt, "1000",
                "trellis run: longest sleep of the engine's progress thread while no send is in flight "
                "(it backs off from run.progress_interval_us and wakes when anything is posted); "
                "set it to run.progress_interval_us for a fixed pace",
                "TRELLIS_RUN_PROGRESS_IDLE_US",
                0, kSecondUs},
    SettingSpec{"run.warmup_tokens", T::kInt, "256",
                "Tokens of the dummy prefill every stage runs at load, before the first request "
                "(then one decode step); 0: no warm-up",
                "TRELLIS_RUN_WARMUP_TOKENS",
                0, kMaxTokens},
    SettingSpec{"serve.host", T::kString, "127.0.0.1",
                "Address `trellis serve` binds (default loopback only; 0.0.0.0 for every interface)",
                "TRELLIS_SERVE_HOST"},
    SettingSpec{"serve.port", T::kInt, "8000", "TCP port of `trellis serve` (0: any free port, logged)",
                "TRELLIS_SERVE_PORT",
                0, 65535},
    SettingSpec{"serve.api_key", T::kString, "",
                "Bearer key every route but /health requires (empty: none); prefer the environment "
                "variable to a flag, which other users can read in the process list",
                "TRELLIS_API_KEY"},
    SettingSpec{"serve.max_waiting", T::kInt, "256",
                "Requests queued beyond the running batch; when full, a request waits up to "
                "serve.queue_wait_ms for room, then gets 429",
                "TRELLIS_SERVE_MAX_WAITING",
                0, 1000000},
    SettingSpec{"serve.queue_wait_ms", T::kDurationMs, "2000",
                "How long a request waits for room in a full queue before the server answers 429", "",
                0, kHourMs},
    SettingSpec{"serve.drain_ms", T::kDurationMs, "30000",
                "On SIGTERM/SIGINT: how long running requests may finish before they are cancelled", "",
                0, kDayMs},
    SettingSpec{"serve.max_body_bytes", T::kSize, "1MiB", "Largest request body accepted (413 above)", "",
                kKiB, kGiB},
    SettingSpec{"serve.max_connections", T::kInt, "64", "Open HTTP connections at most (503 above)", "",
                1, 65536},
    SettingSpec{"serve.header_timeout_ms", T::kDurationMs, "10000",
                "A client must send a request's header within this (slow clients are dropped)", "",
                1, kHourMs},
    SettingSpec{"serve.body_timeout_ms", T::kDurationMs, "30000", "... and its body within this", "",
                1, kHourMs},
    SettingSpec{"serve.idle_timeout_ms", T::kDurationMs, "60000",
                "A keep-alive connection with no request for this long is closed", "",
                1, kDayMs},
    SettingSpec{"serve.default_max_tokens", T::kInt, "256",
                "max_tokens of a request that gives none (capped by the context)", "",
                1, kMaxTokens},
    SettingSpec{"run.sampler_threads", T::kInt, "2",
                "CPU sampler threads on the last stage (SiPipe decoupled sampling)",
                "TRELLIS_RUN_SAMPLER_THREADS",
                1, 256},
    SettingSpec{"run.channel_slot_bytes", T::kSize, "1MiB",
                "Slot size of the in-host scheduling channel (largest scheduling output)", "",
                4 * kKiB, kGiB},
    SettingSpec{"kernels.spin_us", T::kInt, "100",
                "Microseconds an idle kernel worker (and a waiting caller) spins before sleeping: hand-offs "
                "between the short ops of a decode step without a wake-up; 0 sleeps at once (off anyway when "
                "kernels.threads exceeds the CPUs the rank may use)",
                "TRELLIS_KERNELS_SPIN_US", 0, 100000},
    SettingSpec{"kernels.huge_pages", T::kBool, "true",
                "Host weights (and the bandwidth benchmarks' buffers) packed in 2 MiB-aligned memory that the "
                "kernel is asked to back with transparent huge pages (fewer TLB misses while a decode streams "
                "them); false: 4 KiB pages",
                "TRELLIS_KERNELS_HUGE_PAGES", 0, 0},
    SettingSpec{"kernels.graph_one_copy", T::kBool, "true",
                "A CUDA graph's staged inputs (token ids, positions, KV-cache descriptors) reach the GPU in one copy "
                "per launch; false: one copy node per input (the ablation)",
                "TRELLIS_GRAPH_ONE_COPY", 0, 0},
    SettingSpec{"kernels.batch_invariant", T::kBool, "false",
                "Every matmul row computed as if alone (the small-M kernel's order for any batch): outputs "
                "independent of what else is batched, slower long prefills; on whenever run.swift is",
                "TRELLIS_KERNELS_BATCH_INVARIANT", 0, 0},
    // SWIFT self-speculative decoding (docs/swift.md; paper defaults where it gives them).
    SettingSpec{"run.cuda_graphs", T::kBool, "true",
                "GPU stages replay the decode forward as CUDA graphs (a pair per batch size, captured the second time "
                "the size comes; one TP rank, standard wiring); false launches every op (the ablation)",
                "TRELLIS_CUDA_GRAPHS", 0, 0},
    SettingSpec{"run.graph_prefill", T::kBool, "true",
                "With CUDA graphs, a GPU stage fills the next decode step's graph (positions, cache descriptors: "
                "every sequence one token further) while the GPU runs this step, and writes in only the sampled "
                "tokens before launching it; a step that does not come as guessed is filled as usual. false: fill "
                "after the tokens arrive (the ablation)",
                "TRELLIS_GRAPH_PREFILL", 0, 0},
    SettingSpec{"run.swift", T::kBool, "false",
                "SWIFT self-speculative decoding for greedy requests (a prompt's \"swift\" field overrides it)",
                "TRELLIS_RUN_SWIFT", 0, 0},
    SettingSpec{"swift.gamma", T::kInt, "32", "Context window: committed tokens scored per optimisation step", "",
                1, 1024},
    SettingSpec{"swift.bayes_interval", T::kInt, "25",
                "Every this many optimisation steps the candidate comes from Bayesian optimisation (else random)", "",
                1, 1000000},
    SettingSpec{"swift.max_steps", T::kInt, "1000", "Optimisation steps at most", "", 0, 1000000},
    SettingSpec{"swift.patience", T::kInt, "300", "Optimisation stops after this many steps without improvement", "",
                1, 1000000},
    SettingSpec{"swift.target_matchness", T::kDouble, "0.95", "Optimisation stops when matchness reaches this", "",
                0, 1},
    SettingSpec{"swift.skip_ratio", T::kDouble, "0.5", "Share of the 2L sub-layers the draft skips, in (0, 1)", "",
                0, 1},
    SettingSpec{"swift.epsilon", T::kDouble, "0.8",
                "Drafting stops when the draft's top-1 probability is below this", "", 0, 1},
    SettingSpec{"swift.max_draft", T::kInt, "25", "Draft tokens per cycle at most (N_D)", "", 1, 64},
    SettingSpec{"swift.max_tree", T::kInt, "64", "Token-tree nodes verified per sequence at most", "", 2, 512},
    SettingSpec{"swift.reenter_acceptance", T::kDouble, "0.5",
                "Optimisation restarts when the acceptance rate over swift.acceptance_window drafts falls below this",
                "", 0, 1},
    SettingSpec{"swift.acceptance_window", T::kInt, "64", "Draft tokens per acceptance check", "", 1, 1000000},
    SettingSpec{"swift.ratio_tolerance", T::kDouble, "0.7",
                "While optimisation runs, an acceptance window below this lowers swift.skip_ratio by swift.ratio_step "
                "(the paper's footnote 3); 0: r stays fixed", "", 0, 1},
    SettingSpec{"swift.ratio_step", T::kDouble, "0.1", "How much each such check lowers the skip ratio", "", 0, 1},
    SettingSpec{"swift.min_skip_ratio", T::kDouble, "0.1", "The skip ratio is not lowered below this", "", 0, 1},
    SettingSpec{"swift.min_speedup", T::kDouble, "1.0",
                "Drafting is turned off when the measured speedup over swift.speedup_window tokens is below this", "",
                0, 100},
    SettingSpec{"swift.speedup_window", T::kInt, "128", "Generated tokens per speedup check", "", 1, 1000000},
    SettingSpec{"swift.calibration_steps", T::kInt, "4",
                "Plain decode steps timed before drafting starts (the speedup's baseline)", "", 1, 1000},
    SettingSpec{"swift.seed", T::kInt, "1", "Seed of the optimiser's random search", "", 0, 1000000000},
};

}  // namespace

std::span<const SettingSpec> all_settings() { return kSettings; }

}  // namespace trellis
