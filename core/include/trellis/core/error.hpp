// trellis::Error — the one exception type that crosses layer boundaries.
//
// An error says what went wrong in words that name the input (file, tensor, flag, rank,
// peer, link) and carries two machine-readable facts:
//  * code:  what kind of failure it is (bad input, timeout, a peer that died, ...);
//  * scope: what it takes down — one request, one link, one rank, or the whole job.
//    A bad prompt fails its request and the server goes on; a dead peer takes the job.
//
// Library code throws; it never calls exit() or abort(). Only launchers/ turns an Error
// into an exit status (2 for usage errors, 1 otherwise).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace trellis {

enum class ErrorCode {
  kInvalidArgument,   // a flag, setting, spec or request field is wrong
  kNotFound,          // a file, tensor, model or name does not exist
  kCorruptInput,      // a file or frame exists but its contents are inconsistent
  kIo,                // the OS refused (open, read, mmap, socket)
  kTimeout,           // a deadline passed
  kPeerFailed,        // another rank died or reported failure
  kLinkFailed,        // a link between two ranks broke
  kUnsupported,       // valid, but not built or not possible here
  kResourceExhausted, // memory, KV cache, buffer capacity
  kInternal,          // a bug in trellis
};

enum class ErrorScope { kRequest, kLink, kRank, kJob };

std::string_view to_string(ErrorCode code);
std::string_view to_string(ErrorScope scope);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, ErrorScope scope = ErrorScope::kJob)
      : std::runtime_error(std::move(message)), code_(code), scope_(scope) {}

  ErrorCode code() const noexcept { return code_; }
  ErrorScope scope() const noexcept { return scope_; }

 private:
  ErrorCode code_;
  ErrorScope scope_;
};

// Formats and throws in one call: throw_error(ErrorCode::kNotFound, "no file {}", path).
template <typename... Args>
[[noreturn]] void throw_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

// Like throw_error, with an explicit scope (for request- or link-level failures).
template <typename... Args>
[[noreturn]] void throw_scoped(ErrorScope scope, ErrorCode code, fmt::format_string<Args...> f,
                               Args&&... args) {
  throw Error(code, fmt::format(f, std::forward<Args>(args)...), scope);
}

}  // namespace trellis
