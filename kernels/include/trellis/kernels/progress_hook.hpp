// A per-thread progress hook that long-running ops call between blocks of their work.
//
// Why: communication that overlaps compute (Ladder Residual's asynchronous all-reduce)
// progresses only when someone tests it. On a machine whose cores all run compute, a
// background progress thread gets a core only when the scheduler preempts a GEMM for it
// (slice boundaries, milliseconds apart), so each step of an all-reduce starts late. MPI
// libraries on CPUs solve this by letting the compute loop itself make progress calls; this
// hook is that entry point. The kernels layer knows nothing about what the hook does.
//
// Contract: set_progress_hook() installs fn(arg) for the calling thread only (thread_local),
// so worker threads of a kernels::ThreadPool never call it and a hook that is not
// thread-safe is only ever run by the thread that installed it. Ops call poll_progress()
// every few tens of microseconds of work (the packed GEMM after each 12-row register block of
// a 256 x 512 weight block, the GEMV after each 64 weight rows, attention after each head or
// sequence); with no hook installed it costs one thread-local load and a branch. The hook
// must be cheap when it has nothing to do (rate-limit inside it) and must not call kernels
// ops on the same Context (ops are not re-entrant). It must not throw: ops do not expect
// exceptions from it (an exception would abandon the op mid-way).
#pragma once

#include <cstdint>

namespace trellis::kernels {

using ProgressFn = void (*)(void* arg) noexcept;

struct ProgressHook {
  ProgressFn fn = nullptr;
  void* arg = nullptr;
};

namespace detail {
// constinit: no dynamic initialisation, so an access is a plain TLS load (no init wrapper,
// which UBSan saw as a null reference when the variable is defined in another unit).
extern thread_local constinit ProgressHook tls_progress_hook;
}

// Calls the calling thread's hook, if any.
inline void poll_progress() noexcept {
  const ProgressHook& h = detail::tls_progress_hook;
  if (h.fn != nullptr) h.fn(h.arg);
}

// The calling thread's hook; {} when none is installed.
inline ProgressHook progress_hook() noexcept { return detail::tls_progress_hook; }

// Installs `hook` for the calling thread and returns the previous one.
ProgressHook set_progress_hook(ProgressHook hook) noexcept;

// RAII: installs a hook for the calling thread for its lifetime, then restores the previous
// one. Create and destroy it on the same thread.
class ScopedProgressHook {
 public:
  ScopedProgressHook(ProgressFn fn, void* arg) noexcept : previous_(set_progress_hook({fn, arg})) {}
  ~ScopedProgressHook() { set_progress_hook(previous_); }
  ScopedProgressHook(const ScopedProgressHook&) = delete;
  ScopedProgressHook& operator=(const ScopedProgressHook&) = delete;

 private:
  ProgressHook previous_;
};

}  // namespace trellis::kernels
