// The tcp link's wire checks, without sockets: every malformed greeting and frame header is
// rejected with a reason, and good ones round-trip.
#include <gtest/gtest.h>

#include "src/links/tcp/tcp_wire.hpp"

namespace trellis::transport::links::tcp {
namespace {

const std::string kToken = "0123456789abcdef0123456789abcdef";

TEST(TcpWire, HelloRoundTrips) {
  auto bytes = encode_hello({kVersion, 3, 1, kToken});
  Hello h;
  EXPECT_EQ(check_hello(bytes, kToken, 1, 4, h), std::nullopt);
  EXPECT_EQ(h.from_rank, 3u);
  EXPECT_EQ(h.to_rank, 1u);
}

TEST(TcpWire, HelloRejections) {
  Hello h;
  auto wrong_token = encode_hello({kVersion, 3, 1, std::string(32, 'x')});
  EXPECT_NE(check_hello(wrong_token, kToken, 1, 4, h).value_or("").find("token"), std::string::npos);
  auto wrong_rank = encode_hello({kVersion, 3, 2, kToken});
  EXPECT_NE(check_hello(wrong_rank, kToken, 1, 4, h).value_or("").find("addressed to rank 2"), std::string::npos);
  auto out_of_world = encode_hello({kVersion, 9, 1, kToken});
  EXPECT_NE(check_hello(out_of_world, kToken, 1, 4, h).value_or("").find("rank 9"), std::string::npos);
  auto old = encode_hello({kVersion + 1, 3, 1, kToken});
  EXPECT_NE(check_hello(old, kToken, 1, 4, h).value_or("").find("version"), std::string::npos);
  auto junk = wrong_token;
  junk[0] = std::byte{0};
  EXPECT_NE(check_hello(junk, kToken, 1, 4, h).value_or("").find("greeting"), std::string::npos);
}

TEST(TcpWire, FrameHeaderBounds) {
  FrameHeader h;
  EXPECT_EQ(check_frame_header(encode_frame_header({7, 1024}), 1024, h), std::nullopt);
  EXPECT_EQ(h.tag, 7u);
  EXPECT_EQ(h.length, 1024u);
  EXPECT_NE(check_frame_header(encode_frame_header({7, 1025}), 1024, h).value_or("").find("oversized"),
            std::string::npos);
  EXPECT_NE(check_frame_header(encode_frame_header({7, ~0ull}), 1024, h).value_or("").find("oversized"),
            std::string::npos);
  auto bad = encode_frame_header({7, 10});
  bad[1] = std::byte{0};
  EXPECT_NE(check_frame_header(bad, 1024, h).value_or("").find("malformed"), std::string::npos);
}

TEST(TcpWire, TokenComparison) {
  EXPECT_TRUE(tokens_equal(kToken, kToken));
  EXPECT_FALSE(tokens_equal(kToken, kToken.substr(1)));
  std::string other = kToken;
  other.back() = 'z';
  EXPECT_FALSE(tokens_equal(kToken, other));
}

}  // namespace
}  // namespace trellis::transport::links::tcp
