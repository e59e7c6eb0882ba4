#include "src/links/tcp/tcp_wire.hpp"

#include <fmt/format.h>

#include <cstring>

namespace trellis::transport::links::tcp {
namespace {

constexpr char kHelloMagic[8] = {'T', 'R', 'L', 'S', 'H', 'E', 'L', 'O'};

void put32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint32_t get32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

bool tokens_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::array<std::byte, kHelloBytes> encode_hello(const Hello& h) {
  std::array<std::byte, kHelloBytes> out{};
  std::memcpy(out.data(), kHelloMagic, 8);
  put32(out.data() + 8, h.version);
  put32(out.data() + 12, h.from_rank);
  put32(out.data() + 16, h.to_rank);
  std::memcpy(out.data() + 20, h.token.data(), std::min(h.token.size(), kTokenChars));
  return out;
}

std::optional<std::string> check_hello(std::span<const std::byte, kHelloBytes> bytes, const std::string& token,
                                       int my_rank, int world_size, Hello& out) {
  if (std::memcmp(bytes.data(), kHelloMagic, 8) != 0) return "not a trellis tcp link (bad greeting)";
  out.version = get32(bytes.data() + 8);
  out.from_rank = get32(bytes.data() + 12);
  out.to_rank = get32(bytes.data() + 16);
  out.token.assign(reinterpret_cast<const char*>(bytes.data() + 20), kTokenChars);
  if (out.version != kVersion) return fmt::format("protocol version {} (this build speaks {})", out.version, kVersion);
  if (!tokens_equal(out.token, token)) return "wrong job token (a peer from another job, or not a peer)";
  if (out.from_rank >= static_cast<std::uint32_t>(world_size))
    return fmt::format("claims to be rank {} in a world of {}", out.from_rank, world_size);
  if (out.to_rank != static_cast<std::uint32_t>(my_rank))
    return fmt::format("addressed to rank {}, this is rank {}", out.to_rank, my_rank);
  return std::nullopt;
}

std::array<std::byte, kFrameHeaderBytes> encode_frame_header(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderBytes> out{};
  put32(out.data(), kFrameMagic);
  put32(out.data() + 4, h.tag);
  put64(out.data() + 8, h.length);
  return out;
}

std::optional<std::string> check_frame_header(std::span<const std::byte, kFrameHeaderBytes> bytes,
                                              std::uint64_t max_frame, FrameHeader& out) {
  std::uint32_t magic = get32(bytes.data());
  if (magic != kFrameMagic) return fmt::format("malformed frame (magic 0x{:08x}, expected 0x{:08x})", magic, kFrameMagic);
  out.tag = get32(bytes.data() + 4);
  out.length = get64(bytes.data() + 8);
  if (out.length > max_frame)
    return fmt::format("oversized frame: {} bytes announced, comm.tcp.max_frame is {}", out.length, max_frame);
  return std::nullopt;
}

}  // namespace trellis::transport::links::tcp
