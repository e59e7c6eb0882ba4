// The stage hand-off: its setting, the plan per boundary, and the CUDA IPC protocol over the
// host link (stage_handoff.hpp). The CUDA calls are behind cuda_handoff.hpp.
//
// The sender copies straight into the receiver's own hidden state (the buffer its forward and
// its CUDA graphs read), so a hand-off is one copy. Why that is race-free. Host order of the
// calls (-> is "happens before on the host", through a message or program order):
//  * write then read: the sender enqueues its copy of n and records "filled" -> sends
//    ready(n) -> the receiver gets it -> enqueues "wait filled" and then its forward of n. A
//    stream wait captures the event's latest record at the time of the call, and the next
//    record of "filled" (for n + 1) needs credit(n), which the receiver sends only in its next
//    receive, after that wait was enqueued; so the forward waits for exactly the copy of n.
//  * use then overwrite: everything the receiver does with hand-off n (its forward, the LM
//    head, its own send onward) is enqueued before its next receive, which first records
//    "consumed" and then sends credit(n) -> the sender, before its copy of n + 1, waits for
//    credit(n) and enqueues "wait consumed", capturing that record: the next record (for
//    n + 1) needs ready(n + 1), sent after that wait was enqueued. So the copy of n + 1
//    starts after the receiver's last use of n ended.
// With stream values (comm.handoff_signal) the GPU ordering needs no host order at all: the
// sender's stream waits for consumed >= n (written by the receiver's stream behind its last use
// of hand-off n - 1) before its copy of n and writes filled = n + 1 behind it; the receiver's
// stream waits for filled >= n + 1 before its forward. The counters only grow, so a wait can
// neither see an older mark nor miss a newer one. The host messages below stay the same: they
// bound how far the host runs ahead and give every wait its deadline.
// The host blocks only for credit(n - 1) before hand-off n (the receiver's host has reached
// its next receive; its GPU may still be busy) and for ready(n) before the receiver's
// forward, each with a deadline. An earlier version copied into two separate slots and from
// there into the hidden state: two copies and two event waits per hand-off (1.8-1.9x a
// cudaMemcpy under MPS, docs/benchmarks.md).
// Shutdown: the receiver's finish() records "consumed" and sends the last credit; the sender
// waits for it and its stream, closes the IPC handles, then sends "end" (a ready signal with
// kEnd); the receiver destroys its events only after that.
// On a failure each side releases what it holds at once (RAII) and the job ends.
#include "trellis/runtime/engine/stage_handoff.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "cuda_handoff.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/engine.hpp"

namespace trellis::runtime {
namespace {

using detail::kIpcExportBytes;

// Tags on the neighbours' link (the engine's own are 0x100-0x400, streams 0x10000 up).
constexpr std::uint32_t kTagSetup = 0x500;   // receiver -> sender: destination and events exported
constexpr std::uint32_t kTagAck = 0x501;     // sender -> receiver: opened, or why not
constexpr std::uint32_t kTagReady = 0x502;   // sender -> receiver: hand-off n is on its way
constexpr std::uint32_t kTagCredit = 0x503;  // receiver -> sender: everything using hand-off n is enqueued
constexpr std::uint64_t kEnd = ~std::uint64_t{0};
constexpr std::uint32_t kMagic = 0x54484f33;  // "THO3": the signal in the header (THO2 had events only)
constexpr std::size_t kMaxReason = 1024;
constexpr std::size_t kHeader = 4 + 4 + 8 + 4 + 4;  // magic, ok, destination bytes, signal, reason length

// Set-up messages: header, then (setup only) the handles, then the reason when not ok.
std::vector<std::byte> pack(bool ok, std::uint64_t dst_bytes, std::uint32_t signal, std::span<const std::byte> handles,
                            const std::string& reason) {
  const std::string r = reason.substr(0, kMaxReason);
  std::vector<std::byte> out(kHeader + handles.size() + r.size());
  const std::uint32_t magic = kMagic, okv = ok ? 1 : 0, rlen = static_cast<std::uint32_t>(r.size());
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &okv, 4);
  std::memcpy(out.data() + 8, &dst_bytes, 8);
  std::memcpy(out.data() + 16, &signal, 4);
  std::memcpy(out.data() + 20, &rlen, 4);
  if (!handles.empty()) std::memcpy(out.data() + kHeader, handles.data(), handles.size());
  if (!r.empty()) std::memcpy(out.data() + kHeader + handles.size(), r.data(), r.size());
  return out;
}

struct Unpacked {
  bool ok = false;
  std::uint64_t dst_bytes = 0;
  std::uint32_t signal = 0;
  std::span<const std::byte> handles;
  std::string reason;
};
Unpacked unpack(std::span<const std::byte> in, std::size_t handle_bytes, const std::string& what) {
  std::uint32_t magic = 0, okv = 0, rlen = 0;
  Unpacked u;
  if (in.size() >= kHeader) {
    std::memcpy(&magic, in.data(), 4);
    std::memcpy(&okv, in.data() + 4, 4);
    std::memcpy(&u.dst_bytes, in.data() + 8, 8);
    std::memcpy(&u.signal, in.data() + 16, 4);
    std::memcpy(&rlen, in.data() + 20, 4);
  }
  const std::size_t hb = okv ? handle_bytes : 0;
  if (magic != kMagic || in.size() != kHeader + hb + rlen)
    throw_error(ErrorCode::kCorruptInput, "{}: malformed message of {} bytes", what, in.size());
  u.ok = okv != 0;
  u.handles = in.subspan(kHeader, hb);
  u.reason.assign(reinterpret_cast<const char*>(in.data() + kHeader + hb), rlen);
  return u;
}

// Both sides of a boundary share this: the link, who is who, and the waits.
struct Side {
  transport::Link* link = nullptr;
  int rank = 0, gpu = 0;
  std::string required;  // non-empty: a failed set-up throws, naming the setting that asked for it
  HandoffWait wait_fn;
  std::string name;  // "CUDA IPC hand-off to rank 3 over shm"

  void wait(transport::Request& r, Deadline deadline, const std::string& what) const {
    const std::string full = fmt::format("rank {}: {}: {}", rank, name, what);
    if (wait_fn) return wait_fn(r, deadline, full);
    try {
      r.wait(deadline);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{}: {}", full, e.what()), e.scope());
    }
  }
  // The set-up failed on either side: both learn it from the exchange, so both fall back
  // (auto) or both refuse (cuda-ipc).
  bool failed(const std::string& why, std::string* why_out) const {
    if (!required.empty())
      throw_error(ErrorCode::kUnsupported, "rank {}: {}: {} cannot be set up: {}", rank, required, name, why);
    if (why_out) *why_out = why;
    return true;
  }
};

Side make_side(transport::Link* link, int rank, int gpu, bool required, HandoffSignal signal, HandoffWait wait,
               const char* dir) {
  if (!link) throw_error(ErrorCode::kInternal, "CUDA IPC hand-off: no link");
  std::string by = required ? "comm.stage_handoff=cuda-ipc" : "";
  if (signal != HandoffSignal::kAuto)
    by += fmt::format("{}comm.handoff_signal={}", by.empty() ? "" : ", ", to_string(signal));
  return Side{link, rank, gpu, std::move(by), std::move(wait),
              fmt::format("CUDA IPC hand-off {} rank {} over {}", dir, link->peer(), transport::to_string(link->backend()))};
}

}  // namespace

namespace detail {
IpcDevice& ipc_device() {
  static IpcDevice device;
  return device;
}
}  // namespace detail

StageHandoff parse_stage_handoff(std::string_view name, std::string_view what) {
  if (name == "auto") return StageHandoff::kAuto;
  if (name == "host") return StageHandoff::kHost;
  if (name == "cuda-ipc") return StageHandoff::kCudaIpc;
  throw_error(ErrorCode::kInvalidArgument, "{}: unknown stage hand-off '{}' (valid: auto, host, cuda-ipc)", what, name);
}

std::string_view to_string(StageHandoff h) {
  switch (h) {
    case StageHandoff::kAuto: return "auto";
    case StageHandoff::kHost: return "host";
    case StageHandoff::kCudaIpc: return "cuda-ipc";
  }
  return "?";
}

HandoffSignal parse_handoff_signal(std::string_view name, std::string_view what) {
  if (name == "auto") return HandoffSignal::kAuto;
  if (name == "event") return HandoffSignal::kEvent;
  if (name == "stream-value") return HandoffSignal::kStreamValue;
  throw_error(ErrorCode::kInvalidArgument, "{}: unknown hand-off signal '{}' (valid: auto, event, stream-value)", what,
              name);
}

std::string_view to_string(HandoffSignal s) {
  switch (s) {
    case HandoffSignal::kAuto: return "auto";
    case HandoffSignal::kEvent: return "event";
    case HandoffSignal::kStreamValue: return "stream-value";
  }
  return "?";
}

namespace detail {
const char* to_string(IpcSignal s) { return s == IpcSignal::kStreamValue ? "stream-value" : "event"; }
}  // namespace detail

bool cuda_ipc_built() { return detail::cuda_ipc_compiled(); }
std::string cuda_ipc_why_not() { return detail::cuda_ipc_missing(); }

std::string HandoffPlan::describe() const {
  return fmt::format("stage hand-off {} -> {} (rank {} -> rank {}): {} ({})", stage, stage + 1, from, to,
                     cuda_ipc ? "cuda-ipc" : "host", reason);
}

std::vector<HandoffPlan> plan_stage_handoffs(const EngineGrid& grid, StageHandoff mode, bool cuda_stages) {
  std::vector<HandoffPlan> out;
  for (int s = 0; s + 1 < grid.pp; ++s) {
    for (int k = 0; k < grid.tp; ++k) {
      HandoffPlan p;
      p.stage = s;
      p.k = k;
      p.from = grid.rank_at(s, k);
      p.to = grid.rank_at(s + 1, k);
      const int ha = grid.host_of[static_cast<std::size_t>(p.from)], hb = grid.host_of[static_cast<std::size_t>(p.to)];
      std::string why_not;
      if (mode == StageHandoff::kHost)
        why_not = "comm.stage_handoff=host";
      else if (!cuda_ipc_built())
        why_not = cuda_ipc_why_not();
      else if (!cuda_stages)
        why_not = "the stages run on the CPU";
      else if (ha != hb)
        why_not = fmt::format("ranks on different hosts ({} and {}): CUDA IPC needs one host, and the hand-off over "
                              "UCX with CUDA memory is not implemented",
                              ha, hb);
      if (why_not.empty()) {
        p.cuda_ipc = true;
        p.reason = fmt::format("both stages on CUDA GPUs of host {}; comm.stage_handoff={}", ha, to_string(mode));
      } else if (mode == StageHandoff::kCudaIpc) {
        throw_error(ErrorCode::kUnsupported,
                    "comm.stage_handoff=cuda-ipc (--stage-handoff): stage hand-off {} -> {} (rank {} -> rank {}) "
                    "cannot use CUDA IPC: {}",
                    s, s + 1, p.from, p.to, why_not);
      } else {
        p.reason = why_not;
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

void refuse_stage_handoff_early(StageHandoff mode, int pp, std::string_view device) {
  if (mode != StageHandoff::kCudaIpc || pp < 2) return;
  if (!cuda_ipc_built())
    throw_error(ErrorCode::kUnsupported, "comm.stage_handoff=cuda-ipc (--stage-handoff): cannot use CUDA IPC: {}",
                cuda_ipc_why_not());
  if (device == "cpu")
    throw_error(ErrorCode::kUnsupported,
                "comm.stage_handoff=cuda-ipc (--stage-handoff): cannot use CUDA IPC: the stages run on the CPU "
                "(run.device=cpu)");
}

// ---- sender ----

struct CudaIpcSender::Impl {
  Side side;
  detail::IpcSignal signal = detail::IpcSignal::kEvent;
  std::unique_ptr<detail::IpcPeerTarget> peer;
  std::uint64_t sent = 0;
  // Two ready buffers: a send's buffer stays untouched until that send completed.
  std::uint64_t ready_buf[2] = {}, credit_buf = 0, end_buf = kEnd;
  transport::RequestPtr ready_send[2], credit_recv;

  void take_credit(std::uint64_t n, Deadline deadline) {
    if (!credit_recv) return;
    side.wait(*credit_recv, deadline, fmt::format("credit of hand-off {} (the receiver is done with it)", n));
    credit_recv.reset();
    if (credit_buf != n)
      throw_error(ErrorCode::kCorruptInput, "rank {}: {}: credit for hand-off {} where {} was due", side.rank, side.name,
                  credit_buf, n);
  }
};

CudaIpcSender::CudaIpcSender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaIpcSender::~CudaIpcSender() = default;
std::size_t CudaIpcSender::sent() const { return impl_->sent; }
HandoffSignal CudaIpcSender::signal() const {
  return impl_->signal == detail::IpcSignal::kStreamValue ? HandoffSignal::kStreamValue : HandoffSignal::kEvent;
}

std::unique_ptr<CudaIpcSender> CudaIpcSender::connect(const Setup& s, Deadline deadline, std::string* why) {
  auto impl = std::make_unique<Impl>();
  impl->side = make_side(s.link, s.rank, s.gpu, s.required, s.signal, s.wait, "to");
  Side& side = impl->side;
  std::vector<std::byte> buf(kHeader + kIpcExportBytes + kMaxReason);
  auto req = side.link->irecv(buf, kTagSetup);
  side.wait(*req, deadline, "set-up message (the receiver's destination handles)");
  const auto got = unpack(std::span(buf).first(req->bytes()), kIpcExportBytes,
                          fmt::format("rank {}: {}: set-up message", side.rank, side.name));
  std::string failure;
  if (!got.ok) {
    failure = fmt::format("the receiver (rank {}) could not export its destination: {}", side.link->peer(), got.reason);
  } else if (got.dst_bytes < s.bytes) {
    failure = fmt::format("the receiver's destination holds {} bytes, this stage sends up to {}", got.dst_bytes, s.bytes);
  } else if (got.signal != static_cast<std::uint32_t>(detail::IpcSignal::kEvent) &&
             got.signal != static_cast<std::uint32_t>(detail::IpcSignal::kStreamValue)) {
    failure = fmt::format("the receiver asked for an unknown hand-off signal {}", got.signal);
  } else {
    impl->signal = static_cast<detail::IpcSignal>(got.signal);
    std::string why_not;
    if (impl->signal == detail::IpcSignal::kStreamValue && !detail::ipc_device().stream_values(s.gpu, &why_not)) {
      failure = "the receiver signals through stream memory operations and this rank cannot: " + why_not;
    } else if (s.signal != HandoffSignal::kAuto && to_string(s.signal) != detail::to_string(impl->signal)) {
      failure = fmt::format("comm.handoff_signal differs: {} here, {} at the receiver", to_string(s.signal),
                            detail::to_string(impl->signal));
    } else {
      try {
        impl->peer = detail::ipc_device().open_target(s.gpu, got.handles, got.dst_bytes, impl->signal);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
  }
  const auto ack = pack(failure.empty(), got.dst_bytes, got.signal, {}, failure);
  auto sreq = side.link->isend(ack, kTagAck);
  side.wait(*sreq, deadline, "set-up answer");
  if (!failure.empty() && side.failed(failure, why)) return nullptr;
  return std::unique_ptr<CudaIpcSender>(new CudaIpcSender(std::move(impl)));
}

void CudaIpcSender::send(const void* src, std::size_t bytes, void* stream, Deadline deadline) {
  Impl& d = *impl_;
  const std::uint64_t n = d.sent;
  if (n > 0) d.take_credit(n - 1, deadline);
  auto& rs = d.ready_send[n & 1];
  if (rs) {
    d.side.wait(*rs, deadline, fmt::format("ready signal of hand-off {}", n - 2));
    rs.reset();
  }
  d.peer->put(n, src, bytes, stream);
  d.ready_buf[n & 1] = n;
  rs = d.side.link->isend(std::as_bytes(std::span(&d.ready_buf[n & 1], 1)), kTagReady);
  // Posted after the ready signal (off the hand-off's path), taken before the next hand-off
  // (or by finish()); the credit cannot come before the ready signal it answers.
  d.credit_recv = d.side.link->irecv(std::as_writable_bytes(std::span(&d.credit_buf, 1)), kTagCredit);
  ++d.sent;
}

void CudaIpcSender::finish(void* stream, Deadline deadline) {
  Impl& d = *impl_;
  if (!d.peer) return;
  if (d.sent > 0) d.take_credit(d.sent - 1, deadline);  // the receiver's finish() sends it
  for (auto& r : d.ready_send)
    if (r) {
      d.side.wait(*r, deadline, "ready signal");
      r.reset();
    }
  detail::ipc_device().sync(d.side.gpu, stream);  // our copies into the peer's memory have landed
  d.peer.reset();                           // closes the IPC handles before the receiver lets go
  auto req = d.side.link->isend(std::as_bytes(std::span(&d.end_buf, 1)), kTagReady);
  d.side.wait(*req, deadline, "end message");
}

// ---- receiver ----

struct CudaIpcReceiver::Impl {
  Side side;
  detail::IpcSignal signal = detail::IpcSignal::kEvent;
  std::string signal_reason;
  std::unique_ptr<detail::IpcTarget> target;
  std::uint64_t received = 0;
  std::uint64_t ready_buf = 0, credit_buf[2] = {};
  transport::RequestPtr ready_recv, credit_send[2];

  // One ready receive is posted at a time: the next hand-off's, or the end message.
  void post_ready() {
    ready_recv = side.link->irecv(std::as_writable_bytes(std::span(&ready_buf, 1)), kTagReady);
  }
  // Everything using hand-off n is enqueued on `stream`: mark it and let the sender go on.
  void release(std::uint64_t n, void* stream, Deadline deadline) {
    target->consumed(n, stream);
    auto& cs = credit_send[n & 1];
    if (cs) side.wait(*cs, deadline, fmt::format("credit of hand-off {}", n - 2));
    credit_buf[n & 1] = n;
    cs = side.link->isend(std::as_bytes(std::span(&credit_buf[n & 1], 1)), kTagCredit);
  }
};

CudaIpcReceiver::CudaIpcReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaIpcReceiver::~CudaIpcReceiver() = default;
std::size_t CudaIpcReceiver::received() const { return impl_->received; }
HandoffSignal CudaIpcReceiver::signal() const {
  return impl_->signal == detail::IpcSignal::kStreamValue ? HandoffSignal::kStreamValue : HandoffSignal::kEvent;
}
const std::string& CudaIpcReceiver::signal_reason() const { return impl_->signal_reason; }

std::unique_ptr<CudaIpcReceiver> CudaIpcReceiver::connect(const Setup& s, Deadline deadline, std::string* why) {
  auto impl = std::make_unique<Impl>();
  impl->side = make_side(s.link, s.rank, s.gpu, s.required, s.signal, s.wait, "from");
  Side& side = impl->side;
  std::string failure;
  // The signal: the one named, or under auto stream values where this rank can use them (the
  // sender refuses the set-up if it cannot follow).
  std::string why_not;
  const bool values = s.signal != HandoffSignal::kEvent && detail::ipc_device().stream_values(s.gpu, &why_not);
  impl->signal = values ? detail::IpcSignal::kStreamValue : detail::IpcSignal::kEvent;
  if (s.signal == HandoffSignal::kStreamValue && !values)
    failure = "comm.handoff_signal=stream-value: " + why_not;
  impl->signal_reason = s.signal != HandoffSignal::kAuto
                            ? fmt::format("comm.handoff_signal={}", to_string(s.signal))
                            : values ? std::string("comm.handoff_signal=auto: the driver offers stream memory operations")
                                     : "comm.handoff_signal=auto: no stream memory operations (" + why_not + ")";
  std::vector<std::byte> handles;
  if (failure.empty()) {
    try {
      impl->target = detail::ipc_device().make_target(s.gpu, s.dst, s.bytes, impl->signal);
      handles = impl->target->export_handles();
    } catch (const std::exception& e) {
      failure = e.what();
      impl->target.reset();
    }
  }
  const auto msg = pack(failure.empty(), s.bytes, static_cast<std::uint32_t>(impl->signal), handles, failure);
  auto sreq = side.link->isend(msg, kTagSetup);
  side.wait(*sreq, deadline, "set-up message");
  std::vector<std::byte> buf(kHeader + kMaxReason);
  auto req = side.link->irecv(buf, kTagAck);
  side.wait(*req, deadline, "set-up answer (the sender opened the destination)");
  const auto ack = unpack(std::span(buf).first(req->bytes()), 0, fmt::format("rank {}: {}: set-up answer", side.rank,
                                                                               side.name));
  if (failure.empty() && !ack.ok)
    failure = fmt::format("the sender (rank {}) could not open the destination: {}", side.link->peer(), ack.reason);
  if (!failure.empty()) {
    impl->target.reset();  // the sender holds nothing open: it failed or never opened
    if (side.failed(failure, why)) return nullptr;
  }
  impl->post_ready();
  return std::unique_ptr<CudaIpcReceiver>(new CudaIpcReceiver(std::move(impl)));
}

void CudaIpcReceiver::receive(std::size_t bytes, void* stream, Deadline deadline) {
  Impl& d = *impl_;
  const std::uint64_t n = d.received;
  if (bytes > d.target->bytes())
    throw_error(ErrorCode::kInternal, "rank {}: {}: hand-off {} of {} bytes, the destination holds {}", d.side.rank,
                d.side.name, n, bytes, d.target->bytes());
  if (n > 0) d.release(n - 1, stream, deadline);
  d.side.wait(*d.ready_recv, deadline, fmt::format("ready signal of hand-off {}", n));
  d.ready_recv.reset();
  if (d.ready_buf != n)
    throw_error(ErrorCode::kCorruptInput, "rank {}: {}: {} where the ready signal of hand-off {} was due", d.side.rank,
                d.side.name, d.ready_buf == kEnd ? std::string("the end message") : fmt::format("hand-off {}", d.ready_buf),
                n);
  d.target->arrived(n, stream);
  d.post_ready();
  ++d.received;
}

void CudaIpcReceiver::finish(void* stream, Deadline deadline) {
  Impl& d = *impl_;
  if (!d.target) return;
  if (d.received > 0) d.release(d.received - 1, stream, deadline);
  for (auto& cs : d.credit_send)
    if (cs) {
      d.side.wait(*cs, deadline, "credit");
      cs.reset();
    }
  d.side.wait(*d.ready_recv, deadline, "end message (the sender closed its handles)");
  d.ready_recv.reset();
  if (d.ready_buf != kEnd)
    throw_error(ErrorCode::kCorruptInput, "rank {}: {}: hand-off {} after the last one ({} received)", d.side.rank,
                d.side.name, d.ready_buf, d.received);
  detail::ipc_device().sync(d.side.gpu, stream);  // our reads of the destination are done
  d.target.reset();
}

// ---- bench ----

namespace {

constexpr std::uint32_t kBenchTag = 0x7e57u;  // the bench's own messages (never the engine's)

// One signal's hand-offs between the pair: first a ping-pong (rank 0 sends, rank 1 echoes;
// half a round trip per hand-off), then one way (rank 0 sends; rank 1 synchronizes its
// stream and returns the time it saw the bytes land; both clocks are this host's
// CLOCK_MONOTONIC). Returns rank 0's medians; rank 1's are zero.
HandoffTimes run_signal(transport::Link& link, int rank, int rank_in_pair, int gpu, std::size_t bytes, int iters,
                        int warmup, HandoffSignal signal, Deadline deadline) {
  auto out = detail::make_device_scratch(gpu, bytes);
  auto in = detail::make_device_scratch(gpu, bytes);
  std::vector<std::byte> pattern(bytes), back(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    pattern[i] = static_cast<std::byte>((i * 131 + 17 + static_cast<std::size_t>(signal)) & 0xff);
  out->upload(pattern);
  CudaIpcSender::Setup ss{&link, rank, gpu, bytes, true, {}, signal};
  CudaIpcReceiver::Setup rs{&link, rank, gpu, bytes, true, {}, in->data(), signal};
  std::unique_ptr<CudaIpcSender> tx;
  std::unique_ptr<CudaIpcReceiver> rx;
  // Rank 0 of the pair sends first, so the two set-ups pair up in the same order on both.
  if (rank_in_pair == 0) {
    tx = CudaIpcSender::connect(ss, deadline, nullptr);
    rx = CudaIpcReceiver::connect(rs, deadline, nullptr);
  } else {
    rx = CudaIpcReceiver::connect(rs, deadline, nullptr);
    tx = CudaIpcSender::connect(ss, deadline, nullptr);
  }
  void* stream = out->stream();
  std::vector<double> trips, one_way;
  for (int it = -warmup; it < iters; ++it) {
    if (rank_in_pair == 0) {
      const auto t0 = now_seconds();
      tx->send(out->data(), bytes, stream, deadline);
      rx->receive(bytes, stream, deadline);
      detail::sync_stream(gpu, stream);
      if (it >= 0) trips.push_back(now_seconds() - t0);
    } else {
      // Echo: the copy back is ordered after the copy in on the same stream.
      rx->receive(bytes, stream, deadline);
      tx->send(in->data(), bytes, stream, deadline);
    }
  }
  double landed = 0;
  for (int it = -warmup; it < iters; ++it) {
    if (rank_in_pair == 0) {
      // Let the receiver's credit for the previous hand-off arrive and its host reach its
      // next receive, as in a pipeline whose next stage waits for work.
      const auto settle = now_seconds() + 50e-6;
      while (now_seconds() < settle) {
      }
      const auto t0 = now_seconds();
      tx->send(out->data(), bytes, stream, deadline);
      link.irecv(std::as_writable_bytes(std::span(&landed, 1)), kBenchTag)->wait(deadline);
      if (it >= 0) one_way.push_back(landed - t0);
    } else {
      rx->receive(bytes, stream, deadline);
      detail::sync_stream(gpu, stream);
      landed = now_seconds();
      link.isend(std::as_bytes(std::span(&landed, 1)), kBenchTag)->wait(deadline);
    }
  }
  if (rank_in_pair == 0) {
    tx->finish(stream, deadline);
    rx->finish(stream, deadline);
  } else {
    rx->finish(stream, deadline);
    tx->finish(stream, deadline);
  }
  HandoffTimes t;
  in->download(back);
  t.verified = back == pattern;
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  t.half_round_trip_s = median(trips) / 2;
  t.one_way_s = median(one_way);
  return t;
}

}  // namespace

HandoffBench bench_cuda_handoff(transport::Link& link, int rank, int rank_in_pair, int gpu, std::size_t bytes,
                                int iters, int warmup, Deadline deadline) {
  if (!cuda_ipc_built())
    throw_error(ErrorCode::kUnsupported, "bench handoff: cannot use CUDA IPC: {}", cuda_ipc_why_not());
  HandoffBench b;
  // Stream values only where both ranks can use them (the peer says so first).
  std::string why_not;
  const bool here = detail::ipc_device().stream_values(gpu, &why_not);
  std::byte mine{static_cast<unsigned char>(here ? 1 : 0)}, theirs{0};
  auto r = link.irecv({&theirs, 1}, kBenchTag);
  link.isend({&mine, 1}, kBenchTag)->wait(deadline);
  r->wait(deadline);
  b.event = run_signal(link, rank, rank_in_pair, gpu, bytes, iters, warmup, HandoffSignal::kEvent, deadline);
  if (here && theirs == std::byte{1})
    b.stream_value = run_signal(link, rank, rank_in_pair, gpu, bytes, iters, warmup, HandoffSignal::kStreamValue,
                                deadline);
  else
    b.stream_value_missing = here ? "the other rank cannot use stream memory operations" : why_not;
  b.verified = b.event.verified && (!b.stream_value_missing.empty() || b.stream_value.verified);
  // The baseline copies run on rank 0 alone, after rank 1 said it is done with the GPU: two
  // processes issuing work to one GPU at once are time-sliced by it (no MPS), which made the
  // first measurement of a 16 KB device-to-device copy 274 us (docs/gpu-runs/2026-11-27-h200-10).
  std::byte token{1};
  if (rank_in_pair == 0) {
    link.irecv({&token, 1}, kBenchTag)->wait(deadline);
    const auto copies = detail::time_device_copies(gpu, bytes, iters, warmup);
    b.memcpy_s = copies.d2d_s;
    b.host_copy_s = copies.via_host_s;
  } else {
    link.isend({&token, 1}, kBenchTag)->wait(deadline);
  }
  return b;
}

}  // namespace trellis::runtime
