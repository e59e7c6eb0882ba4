#include "trellis/core/error.hpp"

namespace trellis {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kCorruptInput: return "corrupt input";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerFailed: return "peer failed";
    case ErrorCode::kLinkFailed: return "link failed";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string_view to_string(ErrorScope scope) {
  switch (scope) {
    case ErrorScope::kRequest: return "request";
    case ErrorScope::kLink: return "link";
    case ErrorScope::kRank: return "rank";
    case ErrorScope::kJob: return "job";
  }
  return "unknown";
}

}  // namespace trellis
