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
constexpr std::uint32_t kMagic = 0x54484f32;  // "THO2": one destination (THO1 had two slots)
constexpr std::size_t kMaxReason = 1024;
constexpr std::size_t kHeader = 4 + 4 + 8 + 4;  // magic, ok, destination bytes, reason length

// Set-up messages: header, then (setup only) the handles, then the reason when not ok.
std::vector<std::byte> pack(bool ok, std::uint64_t dst_bytes, std::span<const std::byte> handles,
                            const std::string& reason) {
  const std::string r = reason.substr(0, kMaxReason);
  std::vector<std::byte> out(kHeader + handles.size() + r.size());
  const std::uint32_t magic = kMagic, okv = ok ? 1 : 0, rlen = static_cast<std::uint32_t>(r.size());
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &okv, 4);
  std::memcpy(out.data() + 8, &dst_bytes, 8);
  std::memcpy(out.data() + 16, &rlen, 4);
  if (!handles.empty()) std::memcpy(out.data() + kHeader, handles.data(), handles.size());
  if (!r.empty()) std::memcpy(out.data() + kHeader + handles.size(), r.data(), r.size());
  return out;
}

struct Unpacked {
  bool ok = false;
  std::uint64_t dst_bytes = 0;
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
    std::memcpy(&rlen, in.data() + 16, 4);
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
  bool required = false;
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
    if (required)
      throw_error(ErrorCode::kUnsupported, "rank {}: comm.stage_handoff=cuda-ipc: {} cannot be set up: {}", rank, name,
                  why);
    if (why_out) *why_out = why;
    return true;
  }
};

Side make_side(transport::Link* link, int rank, int gpu, bool required, HandoffWait wait, const char* dir) {
  if (!link) throw_error(ErrorCode::kInternal, "CUDA IPC hand-off: no link");
  return Side{link, rank, gpu, required, std::move(wait),
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

std::unique_ptr<CudaIpcSender> CudaIpcSender::connect(const Setup& s, Deadline deadline, std::string* why) {
  auto impl = std::make_unique<Impl>();
  impl->side = make_side(s.link, s.rank, s.gpu, s.required, s.wait, "to");
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
  } else {
    try {
      impl->peer = detail::ipc_device().open_target(s.gpu, got.handles, got.dst_bytes);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  const auto ack = pack(failure.empty(), got.dst_bytes, {}, failure);
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
  d.peer->put(n == 0, src, bytes, stream);
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
    target->consumed(stream);
    auto& cs = credit_send[n & 1];
    if (cs) side.wait(*cs, deadline, fmt::format("credit of hand-off {}", n - 2));
    credit_buf[n & 1] = n;
    cs = side.link->isend(std::as_bytes(std::span(&credit_buf[n & 1], 1)), kTagCredit);
  }
};

CudaIpcReceiver::CudaIpcReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaIpcReceiver::~CudaIpcReceiver() = default;
std::size_t CudaIpcReceiver::received() const { return impl_->received; }

std::unique_ptr<CudaIpcReceiver> CudaIpcReceiver::connect(const Setup& s, Deadline deadline, std::string* why) {
  auto impl = std::make_unique<Impl>();
  impl->side = make_side(s.link, s.rank, s.gpu, s.required, s.wait, "from");
  Side& side = impl->side;
  std::string failure;
  std::vector<std::byte> handles;
  try {
    impl->target = detail::ipc_device().make_target(s.gpu, s.dst, s.bytes);
    handles = impl->target->export_handles();
  } catch (const std::exception& e) {
    failure = e.what();
    impl->target.reset();
  }
  const auto msg = pack(failure.empty(), s.bytes, handles, failure);
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
  d.target->arrived(stream);
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

HandoffBench bench_cuda_handoff(transport::Link& link, int rank, int rank_in_pair, int gpu, std::size_t bytes,
                                int iters, int warmup, Deadline deadline) {
  if (!cuda_ipc_built())
    throw_error(ErrorCode::kUnsupported, "bench handoff: cannot use CUDA IPC: {}", cuda_ipc_why_not());
  auto out = detail::make_device_scratch(gpu, bytes);
  auto in = detail::make_device_scratch(gpu, bytes);
  std::vector<std::byte> pattern(bytes), back(bytes);
  for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<std::byte>((i * 131 + 17) & 0xff);
  out->upload(pattern);
  CudaIpcSender::Setup ss{&link, rank, gpu, bytes, true, {}};
  CudaIpcReceiver::Setup rs{&link, rank, gpu, bytes, true, {}, in->data()};
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
  std::vector<double> trips;
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
  if (rank_in_pair == 0) {
    tx->finish(stream, deadline);
    rx->finish(stream, deadline);
  } else {
    rx->finish(stream, deadline);
    tx->finish(stream, deadline);
  }
  HandoffBench b;
  in->download(back);
  b.verified = back == pattern;
  std::sort(trips.begin(), trips.end());
  if (!trips.empty()) b.handoff_s = trips[trips.size() / 2] / 2;
  // The baseline copies run on rank 0 alone, after rank 1 said it is done with the GPU: two
  // processes issuing work to one GPU at once are time-sliced by it (no MPS), which made the
  // first measurement of a 16 KB device-to-device copy 274 us (docs/gpu-runs/2026-11-27-h200-10).
  std::byte token{1};
  constexpr std::uint32_t kIdleTag = 0x7e57u;
  if (rank_in_pair == 0) {
    link.irecv({&token, 1}, kIdleTag)->wait(deadline);
    const auto copies = detail::time_device_copies(gpu, bytes, iters, warmup);
    b.memcpy_s = copies.d2d_s;
    b.host_copy_s = copies.via_host_s;
  } else {
    link.isend({&token, 1}, kIdleTag)->wait(deadline);
  }
  return b;
}

}  // namespace trellis::runtime
