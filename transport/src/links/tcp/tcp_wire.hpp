// What the tcp link puts on the wire, and the checks every byte from a socket goes
// through before it is trusted. Pure functions, so the rejection of bad input is
// unit-tested without sockets.
//
// Connection set-up: the connecting rank (the higher one) sends a Hello; the accepting
// rank checks magic, version, job token and ranks, and answers with its own Hello, which
// the connector checks the same way. Anything else is dropped and logged.
// Data: each message is one frame: a 16-byte header (magic, tag, length) and the payload.
// A header with a wrong magic or a length above comm.tcp.max_frame drops the connection.
// Integers are little-endian on the wire.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace trellis::transport::links::tcp {

constexpr std::size_t kTokenChars = 32;
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHelloBytes = 8 + 4 + 4 + 4 + kTokenChars;
constexpr std::size_t kFrameHeaderBytes = 16;
constexpr std::uint32_t kFrameMagic = 0x31465254;  // "TRF1"

struct Hello {
  std::uint32_t version = kVersion;
  std::uint32_t from_rank = 0;
  std::uint32_t to_rank = 0;
  std::string token;  // kTokenChars characters
};

std::array<std::byte, kHelloBytes> encode_hello(const Hello& h);
// Checks a received Hello against what this rank expects: nullopt when good, else the
// reason (which the caller logs; the reason never echoes the received token).
// Whether from_rank is a peer this rank expects is the caller's check.
std::optional<std::string> check_hello(std::span<const std::byte, kHelloBytes> bytes, const std::string& token,
                                       int my_rank, int world_size, Hello& out);

struct FrameHeader {
  std::uint32_t tag = 0;
  std::uint64_t length = 0;
};

std::array<std::byte, kFrameHeaderBytes> encode_frame_header(const FrameHeader& h);
std::optional<std::string> check_frame_header(std::span<const std::byte, kFrameHeaderBytes> bytes,
                                              std::uint64_t max_frame, FrameHeader& out);

// Comparison whose time does not depend on where the strings differ.
bool tokens_equal(const std::string& a, const std::string& b);

}  // namespace trellis::transport::links::tcp
