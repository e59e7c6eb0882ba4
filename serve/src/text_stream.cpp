#include "trellis/serve/text_stream.hpp"

#include <algorithm>

namespace trellis::serve {

std::size_t utf8_complete_prefix(std::string_view s) {
  // Only the last three bytes can belong to an unfinished character (four-byte maximum).
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= std::min<std::size_t>(n, 4); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    std::size_t need = 0;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    // ASCII or a byte that never starts a valid character: nothing to wait for.
    if (need == 0) return n;
    return back < need ? n - back : n;
  }
  return n;  // only continuation bytes at the end: they cannot be completed
}

TextStream::TextStream(const TextCodec& codec, std::vector<std::string> stops) : codec_(codec) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::push(std::span<const std::int32_t> ids) {
  if (stopped_ || ids.empty()) return {};
  return push_bytes(codec_.decode(ids));
}

std::string TextStream::push_bytes(std::string_view bytes) {
  if (stopped_) return {};
  // Everything already released was checked against the stop strings with its tail held
  // back, so a match can only start inside pending_ (after appending the new bytes).
  pending_.append(bytes);
  std::size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = release(first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  std::size_t hold = 0;
  for (const auto& s : stops_) {
    const std::size_t max = std::min(s.size() - 1, pending_.size());
    for (std::size_t k = max; k > hold; --k)
      if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  }
  const std::size_t cut = utf8_complete_prefix(std::string_view(pending_).substr(0, pending_.size() - hold));
  return release(cut);
}

std::string TextStream::finish() {
  if (stopped_) return {};
  return release(pending_.size());
}

std::string TextStream::release(std::size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  text_ += out;
  return out;
}

}  // namespace trellis::serve
