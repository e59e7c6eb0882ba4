// Stage streaming: structure-aware and baseline (see stream.hpp for the protocol).
#include "trellis/transport/stream.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "trellis/core/error.hpp"
#include "trellis/core/poll.hpp"

namespace trellis::transport {

std::string_view to_string(StreamMode m) {
  switch (m) {
    case StreamMode::kBaseline: return "baseline";
    case StreamMode::kBaselineEager: return "baseline-eager";
    case StreamMode::kStructureAware: break;
  }
  return "aware";
}

StreamMode parse_stream_mode(std::string_view name) {
  if (name == "aware") return StreamMode::kStructureAware;
  if (name == "baseline") return StreamMode::kBaseline;
  if (name == "baseline-eager") return StreamMode::kBaselineEager;
  throw_error(ErrorCode::kInvalidArgument, "stream mode '{}' is not one of aware, baseline, baseline-eager", name);
}

namespace {

constexpr std::uint32_t kMagic = 0x54535452;  // "RTST"
constexpr std::size_t kMaxControl = 64 << 10;

std::uint32_t data_tag(std::uint32_t base, int bank, std::size_t i) {
  return base + 2 + static_cast<std::uint32_t>(bank) * kMaxStreamTensors + static_cast<std::uint32_t>(i);
}

// Baseline: the receiver's zero-byte "posted, send it" for the next message.
std::uint32_t ready_tag(std::uint32_t base) { return base + 2 + 2 * kMaxStreamTensors; }

bool is_baseline(StreamMode m) { return m != StreamMode::kStructureAware; }

class Writer {
 public:
  template <typename T>
  void put(T v) {
    auto at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<std::uint16_t>(s.size()));
    auto at = out.size();
    out.resize(at + s.size());
    std::memcpy(out.data() + at, s.data(), s.size());
  }
  std::vector<std::byte> out;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, int peer) : in_(in), peer_(peer) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    auto n = get<std::uint16_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return s;
  }

 private:
  void need(std::size_t n) {
    if (at_ + n > in_.size())
      throw_error(ErrorCode::kCorruptInput, "stream metadata from rank {} is truncated ({} bytes)", peer_, in_.size());
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  int peer_;
};

// Header fields (iteration, bank or rows) followed by the schema.
std::vector<std::byte> encode(std::uint64_t a, std::uint64_t b, const StreamSchema& s) {
  Writer w;
  w.put(kMagic);
  w.put(a);
  w.put(b);
  w.put(static_cast<std::uint32_t>(s.tensors.size()));
  for (const auto& t : s.tensors) {
    w.put(t.name);
    w.put(t.dtype);
    w.put(static_cast<std::uint64_t>(t.row_bytes));
  }
  return std::move(w.out);
}

StreamSchema decode(std::span<const std::byte> in, int peer, std::uint64_t& a, std::uint64_t& b) {
  Reader r(in, peer);
  if (r.get<std::uint32_t>() != kMagic)
    throw_error(ErrorCode::kCorruptInput, "stream metadata from rank {} has a bad magic number", peer);
  a = r.get<std::uint64_t>();
  b = r.get<std::uint64_t>();
  auto n = r.get<std::uint32_t>();
  if (n > kMaxStreamTensors)
    throw_error(ErrorCode::kCorruptInput, "stream metadata from rank {} lists {} tensors (at most {})", peer, n,
                kMaxStreamTensors);
  StreamSchema s;
  for (std::uint32_t i = 0; i < n; ++i) {
    TensorSpec t;
    t.name = r.get_string();
    t.dtype = r.get_string();
    t.row_bytes = r.get<std::uint64_t>();
    s.tensors.push_back(std::move(t));
  }
  return s;
}

StreamSchema schema_of(std::span<const TensorRef> tensors) {
  if (tensors.size() > kMaxStreamTensors)
    throw_error(ErrorCode::kInvalidArgument, "a stream carries at most {} tensors, got {}", kMaxStreamTensors,
                tensors.size());
  StreamSchema s;
  for (const auto& t : tensors) s.tensors.push_back(t.spec);
  return s;
}

// The requests of one sent iteration, and the metadata buffers they read from.
// What a sent iteration is, formatted only for errors (not once per iteration).
struct SendInfo {
  std::uint64_t iteration = 0;
  int peer = 0;
  StreamMode mode = StreamMode::kStructureAware;
  std::string format() const {
    return fmt::format("stage stream iteration {} to rank {} ({})", iteration, peer, to_string(mode));
  }
};

class BatchRequest final : public Request {
 public:
  BatchRequest(SendInfo what, std::vector<std::vector<std::byte>> keep) : what_(what), keep_(std::move(keep)) {}
  bool test() override {
    for (auto& r : reqs_)
      if (r && !r->test()) return false;
    return true;
  }
  std::size_t bytes() const override {
    std::size_t b = 0;
    for (const auto& r : reqs_) b += r->bytes();
    return b;
  }
  std::string describe() const override {
    for (const auto& r : reqs_)
      if (r) return what_.format() + " (" + r->describe() + ")";
    return what_.format();
  }
  std::vector<RequestPtr> reqs_;
  const std::vector<std::vector<std::byte>>& keep() const { return keep_; }

 private:
  SendInfo what_;
  std::vector<std::vector<std::byte>> keep_;
};

// The baseline's messages in order, each sent only after the receiver's ready for it
// arrived (see stream.hpp); the next ready is awaited as soon as a message left.
class RendezvousRequest final : public Request {
 public:
  struct Message {
    std::span<const std::byte> data;
    std::uint32_t tag = 0;
  };
  RendezvousRequest(Link& link, std::uint32_t ready, SendInfo what, std::vector<std::vector<std::byte>> keep,
                    std::vector<Message> messages)
      : link_(link), ready_tag_(ready), what_(what), keep_(std::move(keep)), messages_(std::move(messages)) {}
  bool test() override {
    while (next_ < messages_.size()) {
      if (!ready_) ready_ = link_.irecv({}, ready_tag_);
      if (!ready_->test()) return false;
      ready_.reset();
      sends_.push_back(link_.isend(messages_[next_].data, messages_[next_].tag));
      ++next_;
    }
    for (auto& r : sends_)
      if (!r->test()) return false;
    return true;
  }
  std::size_t bytes() const override {
    std::size_t b = 0;
    for (const auto& r : sends_) b += r->bytes();
    return b;
  }
  std::string describe() const override {
    if (next_ < messages_.size())
      return fmt::format("{} (waiting for the receiver's ready for message {} of {})", what_.format(), next_ + 1,
                         messages_.size());
    for (const auto& r : sends_)
      if (r) return what_.format() + " (" + r->describe() + ")";
    return what_.format();
  }

 private:
  Link& link_;
  std::uint32_t ready_tag_;
  SendInfo what_;
  std::vector<std::vector<std::byte>> keep_;  // size word and blob the messages point into
  std::vector<Message> messages_;
  std::size_t next_ = 0;
  RequestPtr ready_;
  std::vector<RequestPtr> sends_;
};

}  // namespace

// ---- sender ---------------------------------------------------------------------------

StageSender::StageSender(Link& link, StreamMode mode, std::uint32_t tag_base)
    : link_(link), mode_(mode), tag_base_(tag_base) {}

RequestPtr StageSender::send(std::span<const TensorRef> tensors, std::size_t rows) {
  StreamSchema schema = schema_of(tensors);
  std::vector<std::vector<std::byte>> keep;
  const std::uint64_t iteration = iteration_++;
  if (is_baseline(mode_)) {
    keep.push_back(encode(iteration, rows, schema));
    std::uint64_t size = keep[0].size();
    keep.emplace_back(sizeof(size));
    std::memcpy(keep[1].data(), &size, sizeof(size));
  } else if (!have_schema_ || schema != sent_) {
    if (have_schema_) bank_ ^= 1;
    keep.push_back(encode(iteration, static_cast<std::uint64_t>(bank_), schema));
    sent_ = schema;
    have_schema_ = true;
    ++stats_.schema_exchanges;
  }
  if (mode_ == StreamMode::kBaseline) return send_rendezvous(tensors, rows, iteration, std::move(keep));
  auto req = std::make_unique<BatchRequest>(SendInfo{iteration, link_.peer(), mode_}, std::move(keep));
  const auto& k = req->keep();
  int bank = bank_;
  if (mode_ == StreamMode::kBaselineEager) {
    req->reqs_.push_back(link_.isend(k[1], tag_base_));
    req->reqs_.push_back(link_.isend(k[0], tag_base_ + 1));
    stats_.metadata_bytes += k[0].size() + k[1].size();
    stats_.messages += 2;
    bank = 0;
  } else if (!k.empty()) {
    req->reqs_.push_back(link_.isend(k[0], tag_base_ + 1));
    stats_.metadata_bytes += k[0].size();
    stats_.messages += 1;
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::size_t bytes = rows * tensors[i].spec.row_bytes;
    req->reqs_.push_back(
        link_.isend({static_cast<const std::byte*>(tensors[i].data), bytes}, data_tag(tag_base_, bank, i)));
    stats_.payload_bytes += bytes;
    stats_.messages += 1;
  }
  ++stats_.iterations;
  return req;
}

RequestPtr StageSender::send_rendezvous(std::span<const TensorRef> tensors, std::size_t rows, std::uint64_t iteration,
                                        std::vector<std::vector<std::byte>> keep) {
  // keep = {blob, size word}; the vectors' heap storage does not move with them.
  std::vector<RendezvousRequest::Message> msgs = {{keep[1], tag_base_}, {keep[0], tag_base_ + 1}};
  stats_.metadata_bytes += keep[0].size() + keep[1].size();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::size_t bytes = rows * tensors[i].spec.row_bytes;
    msgs.push_back({{static_cast<const std::byte*>(tensors[i].data), bytes}, data_tag(tag_base_, 0, i)});
    stats_.payload_bytes += bytes;
  }
  stats_.messages += 2 * msgs.size();  // each message and the ready that let it go
  ++stats_.iterations;
  auto req = std::make_unique<RendezvousRequest>(link_, ready_tag(tag_base_), SendInfo{iteration, link_.peer(), mode_},
                                                 std::move(keep), std::move(msgs));
  req->test();  // posts the receive of the first ready
  return req;
}

// ---- receiver -------------------------------------------------------------------------

struct StageReceiver::Slot {
  std::uint64_t iteration = 0;
  std::size_t rows = 0;
  bool posted = false;  // data receives posted under the current schema
  std::vector<std::vector<std::byte>> buffers;
  std::vector<RequestPtr> reqs;
};

StageReceiver::StageReceiver(Link& link, StreamMode mode, std::uint32_t tag_base, int depth)
    : link_(link), mode_(mode), tag_base_(tag_base), depth_(std::max(1, depth)) {
  for (int i = 0; i <= depth_; ++i) slots_.push_back(std::make_unique<Slot>());
  if (mode_ == StreamMode::kStructureAware) {
    control_buf_.resize(kMaxControl);
    control_ = link_.irecv(control_buf_, tag_base_ + 1);
  }
}

StageReceiver::~StageReceiver() = default;

void StageReceiver::post(std::size_t rows) {
  if (posted_ - received_ >= static_cast<std::uint64_t>(depth_))
    throw_error(ErrorCode::kInvalidArgument, "stage stream from rank {}: {} iterations already posted (depth {})",
                link_.peer(), posted_ - received_, depth_);
  Slot& slot = *slots_[posted_ % slots_.size()];
  slot.iteration = posted_++;
  slot.rows = rows;
  slot.reqs.clear();
  slot.posted = false;
  if (mode_ == StreamMode::kStructureAware && have_schema_ && !(next_pending_ && slot.iteration >= next_from_))
    post_data(slot);
}

void StageReceiver::post_data(Slot& slot) {
  slot.reqs.clear();
  const auto n = schema_.tensors.size();
  bool grew = slot.buffers.size() < n;
  slot.buffers.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t need = slot.rows * schema_.tensors[i].row_bytes;
    if (slot.buffers[i].size() < need) {
      // Grow to a power of two of rows, so a slowly growing batch reallocates rarely.
      std::size_t rows = std::bit_ceil(std::max<std::size_t>(slot.rows, 1));
      slot.buffers[i].resize(rows * schema_.tensors[i].row_bytes);
      grew = true;
    }
    slot.reqs.push_back(link_.irecv({slot.buffers[i].data(), need}, data_tag(tag_base_, bank_, i)));
  }
  if (grew) ++stats_.reallocations;
  slot.posted = true;
}

// A schema message arrived: it applies from iteration `from`; iterations before it still
// use the old schema and bank, so the switch waits until they were received.
void StageReceiver::apply_control() {
  if (control_ && control_->test()) {
    std::uint64_t from = 0, bank = 0;
    next_schema_ = decode({control_buf_.data(), control_->bytes()}, link_.peer(), from, bank);
    next_from_ = from;
    next_pending_ = true;
    next_bank_ = static_cast<int>(bank & 1);
    stats_.metadata_bytes += control_->bytes();
    ++stats_.messages;
    ++stats_.schema_exchanges;
    control_ = link_.irecv(control_buf_, tag_base_ + 1);
  }
  if (next_pending_ && received_ >= next_from_) {
    // The views handed out by the last receive() point into the old schema's tensors and
    // stay valid until the next receive(); moving the vector keeps its storage, so park it.
    retired_schema_ = std::move(schema_);
    schema_ = std::move(next_schema_);
    bank_ = next_bank_;
    have_schema_ = true;
    next_pending_ = false;
    for (std::uint64_t it = received_; it < posted_; ++it) post_data(*slots_[it % slots_.size()]);
  }
}

bool StageReceiver::poll_aware(Slot& slot) {
  apply_control();
  if (!slot.posted) return false;
  for (auto& r : slot.reqs)
    if (!r->test()) return false;
  return true;
}

void StageReceiver::finish(Slot& slot) {
  views_.clear();
  for (std::size_t i = 0; i < schema_.tensors.size(); ++i) {
    std::size_t need = slot.rows * schema_.tensors[i].row_bytes;
    std::size_t got = slot.reqs[i]->bytes();
    if (got != need)
      throw_error(ErrorCode::kCorruptInput,
                  "stage stream from rank {}: tensor '{}' of iteration {} has {} bytes, but batch size {} x {} bytes "
                  "per row needs {}",
                  link_.peer(), schema_.tensors[i].name, slot.iteration, got, slot.rows, schema_.tensors[i].row_bytes,
                  need);
    views_.push_back({&schema_.tensors[i], slot.rows, {slot.buffers[i].data(), need}});
    stats_.payload_bytes += need;
    ++stats_.messages;
  }
  slot.reqs.clear();
  slot.posted = false;
  ++received_;
  ++stats_.iterations;
}

const std::vector<TensorView>& StageReceiver::receive(Deadline deadline, const std::atomic<bool>* cancel) {
  if (received_ == posted_)
    throw_error(ErrorCode::kInvalidArgument, "stage stream from rank {}: receive() without a post() of its batch size",
                link_.peer());
  Slot& slot = *slots_[received_ % slots_.size()];
  if (is_baseline(mode_)) return receive_baseline(slot, deadline);
  // The description is formatted only if the wait times out (not once per iteration).
  poll_until([&] {
    if (cancel && cancel->load(std::memory_order_relaxed))
      throw_scoped(ErrorScope::kRank, ErrorCode::kPeerFailed,
                   "stage stream iteration {} from rank {}: given up (this rank already failed)", slot.iteration,
                   link_.peer());
    return poll_aware(slot);
  }, deadline, [&] {
    return fmt::format("stage stream iteration {} from rank {} ({})", slot.iteration, link_.peer(),
                       have_schema_ ? "raw tensors" : "schema");
  });
  finish(slot);
  apply_control();  // a pending schema may apply from the next iteration on
  return views_;
}

// Today's engines: size, then blob, then each tensor into fresh memory, one round at a time
// (kBaseline also tells the sender each receive is posted, see stream.hpp).
RequestPtr StageReceiver::receive_step(std::span<std::byte> buffer, std::uint32_t tag, Deadline deadline) {
  auto r = link_.irecv(buffer, tag);
  RequestPtr ready;
  if (mode_ == StreamMode::kBaseline) {
    ready = link_.isend({}, ready_tag(tag_base_));
    ++stats_.messages;
  }
  r->wait(deadline);
  if (ready) ready->wait(deadline);
  return r;
}

const std::vector<TensorView>& StageReceiver::receive_baseline(Slot& slot, Deadline deadline) {
  std::uint64_t size = 0;
  receive_step({reinterpret_cast<std::byte*>(&size), sizeof(size)}, tag_base_, deadline);
  if (size > kMaxControl)
    throw_error(ErrorCode::kCorruptInput, "stage stream from rank {} announces {} bytes of metadata", link_.peer(), size);
  std::vector<std::byte> blob(size);
  receive_step(blob, tag_base_ + 1, deadline);
  std::uint64_t iteration = 0, rows = 0;
  schema_ = decode(blob, link_.peer(), iteration, rows);
  have_schema_ = true;
  if (rows != slot.rows)
    throw_error(ErrorCode::kCorruptInput, "stage stream from rank {}: iteration {} carries batch size {}, expected {}",
                link_.peer(), iteration, rows, slot.rows);
  stats_.metadata_bytes += sizeof(size) + size;
  stats_.messages += 2;
  slot.buffers.assign(schema_.tensors.size(), {});
  slot.reqs.clear();
  for (std::size_t i = 0; i < schema_.tensors.size(); ++i) {
    slot.buffers[i] = std::vector<std::byte>(rows * schema_.tensors[i].row_bytes);
    ++stats_.reallocations;
    slot.reqs.push_back(receive_step(slot.buffers[i], data_tag(tag_base_, 0, i), deadline));
  }
  finish(slot);
  return views_;
}

}  // namespace trellis::transport
