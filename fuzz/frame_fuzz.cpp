// Fuzz entry for the tcp link's wire checks (fuzz/build frame): every byte a socket hands the
// tcp link passes check_hello (connection set-up) or check_frame_header (each message) before
// it is trusted. The input is cut into a Hello and frame headers, checked against a fixed job
// token, ranks and frame limit. Properties: no crash or sanitizer report; an accepted Hello
// or header encodes back to exactly the bytes received (nothing accepted is reinterpreted),
// an accepted Hello carries the job's token and in-range ranks, and an accepted header's
// length is within the limit.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "src/links/tcp/tcp_wire.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "frame_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tcp = trellis::transport::links::tcp;
  static const std::string kToken(tcp::kTokenChars, 'k');
  constexpr int kRank = 1, kWorld = 4;
  constexpr std::uint64_t kMaxFrame = 1 << 20;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);

  if (size >= tcp::kHelloBytes) {
    std::array<std::byte, tcp::kHelloBytes> in{};
    std::memcpy(in.data(), bytes, in.size());
    tcp::Hello h;
    if (!tcp::check_hello(std::span<const std::byte, tcp::kHelloBytes>(in), kToken, kRank, kWorld, h)) {
      if (h.token != kToken) fail("a Hello with another token was accepted");
      if (h.to_rank != static_cast<std::uint32_t>(kRank) || h.from_rank >= static_cast<std::uint32_t>(kWorld))
        fail("a Hello with ranks outside the job was accepted");
      if (tcp::encode_hello(h) != in) fail("an accepted Hello does not encode back to its bytes");
    }
  }
  // Every 16-byte window is a frame header as it would come off a stream.
  for (std::size_t off = 0; off + tcp::kFrameHeaderBytes <= size; off += tcp::kFrameHeaderBytes) {
    std::array<std::byte, tcp::kFrameHeaderBytes> in{};
    std::memcpy(in.data(), bytes + off, in.size());
    tcp::FrameHeader f;
    if (!tcp::check_frame_header(std::span<const std::byte, tcp::kFrameHeaderBytes>(in), kMaxFrame, f)) {
      if (f.length > kMaxFrame) fail("a frame longer than the limit was accepted");
      if (tcp::encode_frame_header(f) != in) fail("an accepted frame header does not encode back to its bytes");
    }
  }
  const std::string a(reinterpret_cast<const char*>(data), std::min<std::size_t>(size, tcp::kTokenChars));
  if (tcp::tokens_equal(a, kToken) != (a == kToken)) fail("tokens_equal disagrees with ==");
  return 0;
}
