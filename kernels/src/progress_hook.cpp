// The per-thread progress hook (progress_hook.hpp).
#include "trellis/kernels/progress_hook.hpp"

namespace trellis::kernels {

namespace detail {
constinit thread_local ProgressHook tls_progress_hook;
}

ProgressHook set_progress_hook(ProgressHook hook) noexcept {
  ProgressHook previous = detail::tls_progress_hook;
  detail::tls_progress_hook = hook;
  return previous;
}

}  // namespace trellis::kernels
