// Stage streaming between rank pairs (0->1, and 2->3 at 4 ranks) over every link backend
// built: structure-aware steady state carries zero metadata bytes and one message per
// tensor; a new tensor renegotiates exactly once, with receives already posted for the old
// schema; batch growth reallocates locally; the baseline sends size + blob + tensors every
// iteration (each after the receiver's ready; the eager variant without); a wrong batch size and a silent sender are reported, naming the peer.
#include <gtest/gtest.h>

#include <cstring>

#include "harness/mpi_world.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/link.hpp"
#include "trellis/transport/stream.hpp"

namespace trellis::transport {
namespace {

using testing_support::soon;
using testing_support::world;

std::byte pattern(std::uint64_t it, std::size_t tensor, std::size_t i) {
  return static_cast<std::byte>((it * 31 + tensor * 7 + i * 13 + (i >> 8)) & 0xff);
}

class Stream : public testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const int r = world().rank();
    pair_active_ = r < (world().size() / 2) * 2;
    sender_ = r % 2 == 0;
    peer_ = sender_ ? r + 1 : r - 1;
    std::vector<int> peers;
    if (pair_active_) peers.push_back(peer_);
    std::string why;
    try {
      transport_ = connect(GetParam(), world(), peers, config_);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) throw;
      why = e.what();
    }
    if (world().any(!why.empty(), soon())) GTEST_SKIP() << "backend not usable here: " << why;
  }
  void TearDown() override {
    if (transport_) world().barrier(soon());
    transport_.reset();
  }

  // Runs `rows.size()` iterations; tensors(it) gives the specs of iteration it.
  void run(StreamMode mode, const std::vector<std::size_t>& rows,
           const std::function<std::vector<TensorSpec>(std::uint64_t)>& specs, StreamStats& stats, int depth = 2) {
    if (!pair_active_) return;
    Link& link = transport_->link(peer_);
    if (sender_) {
      StageSender tx(link, mode);
      for (std::uint64_t it = 0; it < rows.size(); ++it) {
        auto s = specs(it);
        std::vector<std::vector<std::byte>> data(s.size());
        std::vector<TensorRef> refs;
        for (std::size_t t = 0; t < s.size(); ++t) {
          data[t].resize(rows[it] * s[t].row_bytes);
          for (std::size_t i = 0; i < data[t].size(); ++i) data[t][i] = pattern(it, t, i);
          refs.push_back({s[t], data[t].data()});
        }
        tx.send(refs, rows[it])->wait(soon());
      }
      stats = tx.stats();
      return;
    }
    StageReceiver rx(link, mode, kStreamTagBase, depth);
    std::uint64_t next_post = 0;
    for (std::uint64_t it = 0; it < rows.size(); ++it) {
      while (next_post < rows.size() && next_post < it + static_cast<std::uint64_t>(depth)) rx.post(rows[next_post++]);
      const auto& views = rx.receive(soon());
      auto s = specs(it);
      ASSERT_EQ(views.size(), s.size()) << "iteration " << it;
      for (std::size_t t = 0; t < s.size(); ++t) {
        EXPECT_EQ(*views[t].spec, s[t]);
        ASSERT_EQ(views[t].data.size(), rows[it] * s[t].row_bytes);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < views[t].data.size(); ++i) bad += views[t].data[i] != pattern(it, t, i);
        ASSERT_EQ(bad, 0u) << "iteration " << it << " tensor " << s[t].name;
      }
    }
    stats = rx.stats();
  }

  Config config_;
  std::unique_ptr<Transport> transport_;
  bool pair_active_ = false, sender_ = false;
  int peer_ = 0;
};

std::vector<TensorSpec> hidden_and_residual(std::uint64_t) {
  return {{"hidden", "f32", 4096 * 4}, {"residual", "bf16", 4096 * 2}};
}

TEST_P(Stream, StructureAwareSteadyStateHasNoMetadata) {
  std::vector<std::size_t> rows = {4, 4, 4, 3, 4, 2, 4, 4, 0, 4, 1, 4};
  StreamStats st;
  run(StreamMode::kStructureAware, rows, hidden_and_residual, st);
  if (!pair_active_) return;
  EXPECT_EQ(st.iterations, rows.size());
  EXPECT_EQ(st.schema_exchanges, 1u);
  EXPECT_EQ(st.messages, 1 + 2 * rows.size());  // one schema message, then one per tensor
  EXPECT_GT(st.metadata_bytes, 0u);
  EXPECT_LT(st.metadata_bytes, 200u);  // that one schema message, nothing per iteration
  if (!sender_) {  // first allocation of each buffer set only
    EXPECT_LE(st.reallocations, 3u);
  }
}

TEST_P(Stream, MetadataBytesDoNotGrowAfterTheFirstIteration) {
  if (!pair_active_) return;
  Link& link = transport_->link(peer_);
  std::vector<std::byte> h(8 * 4096 * 4), r(8 * 4096 * 2);
  std::vector<TensorRef> refs = {{{"hidden", "f32", 4096 * 4}, h.data()}, {{"residual", "bf16", 4096 * 2}, r.data()}};
  if (sender_) {
    StageSender tx(link, StreamMode::kStructureAware);
    tx.send(refs, 8)->wait(soon());
    auto first = tx.stats().metadata_bytes;
    for (int i = 0; i < 50; ++i) tx.send(refs, 8)->wait(soon());
    EXPECT_EQ(tx.stats().metadata_bytes, first);
    EXPECT_EQ(tx.stats().messages, 1u + 2 * 51);
  } else {
    StageReceiver rx(link, StreamMode::kStructureAware);
    rx.post(8);
    rx.receive(soon());
    auto first = rx.stats().metadata_bytes;
    for (int i = 0; i < 50; ++i) {
      rx.post(8);
      rx.receive(soon());
    }
    EXPECT_EQ(rx.stats().metadata_bytes, first);
  }
}

// Batch growth past the buffers: the receiver grows locally, no message is exchanged.
TEST_P(Stream, LargerBatchGrowsBuffersWithoutMessages) {
  std::vector<std::size_t> rows = {1, 2, 1, 8, 33, 256, 7, 256, 1};
  StreamStats st;
  run(StreamMode::kStructureAware, rows, hidden_and_residual, st);
  if (!pair_active_) return;
  EXPECT_EQ(st.schema_exchanges, 1u);
  EXPECT_EQ(st.messages, 1 + 2 * rows.size());
  if (!sender_) {
    EXPECT_GT(st.reallocations, 3u);
  }
}

// A new tensor from iteration 6 on, while the receiver has iterations 6 and 7 posted with
// the old schema: one renegotiation, every byte right.
TEST_P(Stream, NewTensorRenegotiatesOnce) {
  std::vector<std::size_t> rows(14, 5);
  auto specs = [](std::uint64_t it) {
    auto s = hidden_and_residual(it);
    if (it >= 6) s.push_back({"positions", "i32", 4});
    return s;
  };
  StreamStats st;
  run(StreamMode::kStructureAware, rows, specs, st, 3);
  if (!pair_active_) return;
  EXPECT_EQ(st.schema_exchanges, 2u);
  EXPECT_EQ(st.messages, 2 + 2 * 6 + 3 * 8);
}

// Size word, blob and two tensors per iteration, each after a zero-byte ready from the
// receiver (both sides count every message they send or receive, so 8 per iteration).
TEST_P(Stream, BaselineSendsMetadataEveryIteration) {
  std::vector<std::size_t> rows = {4, 1, 4, 3, 0, 2};
  StreamStats st;
  run(StreamMode::kBaseline, rows, hidden_and_residual, st);
  if (!pair_active_) return;
  EXPECT_EQ(st.iterations, rows.size());
  EXPECT_EQ(st.messages, 2 * (2 + 2) * rows.size());
  EXPECT_GT(st.metadata_bytes, 40 * rows.size());
}

TEST_P(Stream, EagerBaselineSendsMetadataEveryIterationWithoutReadies) {
  std::vector<std::size_t> rows = {4, 1, 4, 3, 0, 2};
  StreamStats st;
  run(StreamMode::kBaselineEager, rows, hidden_and_residual, st);
  if (!pair_active_) return;
  EXPECT_EQ(st.messages, (2 + 2) * rows.size());
  EXPECT_GT(st.metadata_bytes, 40 * rows.size());
}

TEST(StreamModeNames, RoundTrip) {
  for (auto m : {StreamMode::kStructureAware, StreamMode::kBaseline, StreamMode::kBaselineEager})
    EXPECT_EQ(parse_stream_mode(to_string(m)), m);
  EXPECT_THROW(parse_stream_mode("eager"), Error);
}

TEST_P(Stream, WrongBatchSizeNamesThePeer) {
  if (!pair_active_) return;
  Link& link = transport_->link(peer_);
  std::vector<std::byte> h(4 * 64);
  if (sender_) {
    StageSender tx(link, StreamMode::kStructureAware, kStreamTagBase + 1000);
    tx.send(std::vector<TensorRef>{{{"hidden", "f32", 64}, h.data()}}, 3)->wait(soon());
    return;
  }
  StageReceiver rx(link, StreamMode::kStructureAware, kStreamTagBase + 1000);
  rx.post(4);
  try {
    rx.receive(soon());
    ADD_FAILURE() << "a 3-row tensor was accepted for a batch of 4";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(peer_)), std::string::npos) << e.what();
  }
}

TEST_P(Stream, SilentSenderTimesOut) {
  if (!pair_active_ || sender_) return;
  StageReceiver rx(transport_->link(peer_), StreamMode::kStructureAware, kStreamTagBase + 2000);
  rx.post(1);
  try {
    rx.receive(Deadline::after_ms(200));
    ADD_FAILURE() << "received from a sender that sent nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(peer_)), std::string::npos) << e.what();
  }
}

std::vector<Backend> host_backends() {
  std::vector<Backend> b;
  for (auto x : {Backend::kShm, Backend::kUcx, Backend::kTcp, Backend::kMpi}) b.push_back(x);
  return b;
}

INSTANTIATE_TEST_SUITE_P(Backends, Stream, testing::ValuesIn(host_backends()),
                         [](const testing::TestParamInfo<Backend>& i) { return std::string(to_string(i.param)); });

}  // namespace
}  // namespace trellis::transport
