// The stage hand-off: its setting, the plan per boundary, and the CUDA IPC protocol over the
// host link (stage_handoff.hpp). The CUDA calls are behind cuda_handoff.hpp.
//
// Why the two slots are race-free. Slot s carries the hand-offs n with n % 2 == s. Host
// order of the calls (-> is "happens before on the host", through a message or program order):
//  * write then read: the sender enqueues its copy into s and records filled[s] for n ->
//    sends ready(n) -> the receiver gets it -> enqueues "wait filled[s]" and its read of s.
//    A stream wait captures the event's latest record at the time of the call, and the next
//    record of filled[s] (for n + 2) needs credit(n), which the receiver sends only after
//    that wait is enqueued; so the read waits for exactly the copy of n.
//  * read then overwrite: the receiver enqueues its read of s for n and records consumed[s]
//    behind it -> sends credit(n) -> the sender, before its copy for n + 2, waits for
//    credit(n) and enqueues "wait consumed[s]", which captures the record for n: the next
//    record of consumed[s] (for n + 2) needs ready(n + 2), sent after that wait was enqueued.
//    So the copy of n + 2 starts after the read of n ended.
// The host blocks only for credit(n - 2) before hand-off n (two in flight) and for ready(n)
// before the receiver's read, each with a deadline.
// Shutdown: the sender waits for its last credits and its stream, closes the IPC handles,
// then sends "end" (a ready signal with kEnd); the receiver frees its slots only after that.
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
using detail::kIpcSlots;

// Tags on the neighbours' link (the engine's own are 0x100-0x400, streams 0x10000 up).
constexpr std::uint32_t kTagSetup = 0x500;   // receiver -> sender: slots and events exported
constexpr std::uint32_t kTagAck = 0x501;     // sender -> receiver: opened, or why not
constexpr std::uint32_t kTagReady = 0x502;   // sender -> receiver: hand-off n is in its slot
constexpr std::uint32_t kTagCredit = 0x503;  // receiver -> sender: hand-off n has been read
constexpr std::uint64_t kEnd = ~std::uint64_t{0};
constexpr std::uint32_t kMagic = 0x54484f31;  // "THO1"
constexpr std::size_t kMaxReason = 1024;
constexpr std::size_t kHeader = 4 + 4 + 8 + 4;  // magic, ok, slot bytes, reason length

// Set-up messages: header, then (setup only) the handles, then the reason when not ok.
std::vector<std::byte> pack(bool ok, std::uint64_t slot_bytes, std::span<const std::byte> handles,
                            const std::string& reason) {
  const std::string r = reason.substr(0, kMaxReason);
  std::vector<std::byte> out(kHeader + handles.size() + r.size());
  const std::uint32_t magic = kMagic, okv = ok ? 1 : 0, rlen = static_cast<std::uint32_t>(r.size());
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &okv, 4);
  std::memcpy(out.data() + 8, &slot_bytes, 8);
  std::memcpy(out.data() + 16, &rlen, 4);
  if (!handles.empty()) std::memcpy(out.data() + kHeader, handles.data(), handles.size());
  if (!r.empty()) std::memcpy(out.data() + kHeader + handles.size(), r.data(), r.size());
  return out;
}

struct Unpacked {
  bool ok = false;
  std::uint64_t slot_bytes = 0;
  std::span<const std::byte> handles;
  std::string reason;
};
Unpacked unpack(std::span<const std::byte> in, std::size_t handle_bytes, const std::string& what) {
  std::uint32_t magic = 0, okv = 0, rlen = 0;
  Unpacked u;
  if (in.size() >= kHeader) {
    std::memcpy(&magic, in.data(), 4);
    std::memcpy(&okv, in.data() + 4, 4);
    std::memcpy(&u.slot_bytes, in.data() + 8, 8);
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
  std::unique_ptr<detail::IpcPeerSlots> peer;
  std::uint64_t sent = 0;
  std::uint64_t ready_buf[kIpcSlots] = {}, credit_buf[kIpcSlots] = {}, end_buf = kEnd;
  transport::RequestPtr ready_send[kIpcSlots], credit_recv[kIpcSlots];

  void take_credit(int slot, std::uint64_t n, Deadline deadline) {
    auto& r = credit_recv[slot];
    if (!r) return;
    side.wait(*r, deadline, fmt::format("credit of hand-off {} (the receiver read its slot)", n));
    r.reset();
    if (credit_buf[slot] != n)
      throw_error(ErrorCode::kCorruptInput, "rank {}: {}: credit for hand-off {} where {} was due", side.rank, side.name,
                  credit_buf[slot], n);
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
  side.wait(*req, deadline, "set-up message (the receiver's slot handles)");
  const auto got = unpack(std::span(buf).first(req->bytes()), kIpcExportBytes,
                          fmt::format("rank {}: {}: set-up message", side.rank, side.name));
  std::string failure;
  if (!got.ok) {
    failure = fmt::format("the receiver (rank {}) could not export its slots: {}", side.link->peer(), got.reason);
  } else if (got.slot_bytes < s.bytes) {
    failure = fmt::format("the receiver's slots hold {} bytes, this stage sends up to {}", got.slot_bytes, s.bytes);
  } else {
    try {
      impl->peer = detail::open_ipc_slots(s.gpu, got.handles, got.slot_bytes);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  const auto ack = pack(failure.empty(), got.slot_bytes, {}, failure);
  auto sreq = side.link->isend(ack, kTagAck);
  side.wait(*sreq, deadline, "set-up answer");
  if (!failure.empty() && side.failed(failure, why)) return nullptr;
  return std::unique_ptr<CudaIpcSender>(new CudaIpcSender(std::move(impl)));
}

void CudaIpcSender::send(const void* src, std::size_t bytes, void* stream, Deadline deadline) {
  Impl& d = *impl_;
  const std::uint64_t n = d.sent;
  const int slot = static_cast<int>(n % kIpcSlots);
  if (n >= kIpcSlots) d.take_credit(slot, n - kIpcSlots, deadline);
  // Posted now, taken two hand-offs later (or by finish()).
  d.credit_recv[slot] = d.side.link->irecv(std::as_writable_bytes(std::span(&d.credit_buf[slot], 1)), kTagCredit);
  if (d.ready_send[slot]) {
    d.side.wait(*d.ready_send[slot], deadline, fmt::format("ready signal of hand-off {}", n - kIpcSlots));
    d.ready_send[slot].reset();
  }
  d.peer->put(slot, n >= kIpcSlots, src, bytes, stream);
  d.ready_buf[slot] = n;
  d.ready_send[slot] = d.side.link->isend(std::as_bytes(std::span(&d.ready_buf[slot], 1)), kTagReady);
  ++d.sent;
}

void CudaIpcSender::finish(void* stream, Deadline deadline) {
  Impl& d = *impl_;
  if (!d.peer) return;
  for (std::uint64_t n = d.sent >= kIpcSlots ? d.sent - kIpcSlots : 0; n < d.sent; ++n)
    d.take_credit(static_cast<int>(n % kIpcSlots), n, deadline);
  for (int i = 0; i < kIpcSlots; ++i)
    if (d.ready_send[i]) {
      d.side.wait(*d.ready_send[i], deadline, "ready signal");
      d.ready_send[i].reset();
    }
  detail::sync_stream(d.side.gpu, stream);  // our copies into the peer's slots have landed
  d.peer.reset();                           // closes the IPC handles before the receiver frees
  auto req = d.side.link->isend(std::as_bytes(std::span(&d.end_buf, 1)), kTagReady);
  d.side.wait(*req, deadline, "end message");
}

// ---- receiver ----

struct CudaIpcReceiver::Impl {
  Side side;
  std::unique_ptr<detail::IpcSlots> slots;
  std::uint64_t received = 0;
  std::uint64_t ready_buf = 0, credit_buf[kIpcSlots] = {};
  transport::RequestPtr ready_recv, credit_send[kIpcSlots];

  // One ready receive is posted at a time: the next hand-off's, or the end message.
  void post_ready() {
    ready_recv = side.link->irecv(std::as_writable_bytes(std::span(&ready_buf, 1)), kTagReady);
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
    impl->slots = detail::make_ipc_slots(s.gpu, std::max<std::size_t>(s.bytes, 1));
    handles = impl->slots->export_handles();
  } catch (const std::exception& e) {
    failure = e.what();
    impl->slots.reset();
  }
  const auto msg = pack(failure.empty(), s.bytes, handles, failure);
  auto sreq = side.link->isend(msg, kTagSetup);
  side.wait(*sreq, deadline, "set-up message");
  std::vector<std::byte> buf(kHeader + kMaxReason);
  auto req = side.link->irecv(buf, kTagAck);
  side.wait(*req, deadline, "set-up answer (the sender opened the slots)");
  const auto ack = unpack(std::span(buf).first(req->bytes()), 0, fmt::format("rank {}: {}: set-up answer", side.rank,
                                                                               side.name));
  if (failure.empty() && !ack.ok)
    failure = fmt::format("the sender (rank {}) could not open the slots: {}", side.link->peer(), ack.reason);
  if (!failure.empty()) {
    impl->slots.reset();  // the sender holds nothing open: it failed or never opened
    if (side.failed(failure, why)) return nullptr;
  }
  impl->post_ready();
  return std::unique_ptr<CudaIpcReceiver>(new CudaIpcReceiver(std::move(impl)));
}

void CudaIpcReceiver::receive(void* dst, std::size_t bytes, void* stream, Deadline deadline) {
  Impl& d = *impl_;
  const std::uint64_t n = d.received;
  const int slot = static_cast<int>(n % kIpcSlots);
  if (bytes > d.slots->slot_bytes())
    throw_error(ErrorCode::kInternal, "rank {}: {}: hand-off {} of {} bytes, the slots hold {}", d.side.rank,
                d.side.name, n, bytes, d.slots->slot_bytes());
  d.side.wait(*d.ready_recv, deadline, fmt::format("ready signal of hand-off {}", n));
  d.ready_recv.reset();
  if (d.ready_buf != n)
    throw_error(ErrorCode::kCorruptInput, "rank {}: {}: {} where the ready signal of hand-off {} was due", d.side.rank,
                d.side.name, d.ready_buf == kEnd ? std::string("the end message") : fmt::format("hand-off {}", d.ready_buf),
                n);
  d.slots->take(slot, dst, bytes, stream);
  if (d.credit_send[slot]) d.side.wait(*d.credit_send[slot], deadline, fmt::format("credit of hand-off {}", n - kIpcSlots));
  d.credit_buf[slot] = n;
  d.credit_send[slot] = d.side.link->isend(std::as_bytes(std::span(&d.credit_buf[slot], 1)), kTagCredit);
  d.post_ready();
  ++d.received;
}

void CudaIpcReceiver::finish(void* stream, Deadline deadline) {
  Impl& d = *impl_;
  if (!d.slots) return;
  for (int i = 0; i < kIpcSlots; ++i)
    if (d.credit_send[i]) {
      d.side.wait(*d.credit_send[i], deadline, "credit");
      d.credit_send[i].reset();
    }
  d.side.wait(*d.ready_recv, deadline, "end message (the sender closed its handles)");
  d.ready_recv.reset();
  if (d.ready_buf != kEnd)
    throw_error(ErrorCode::kCorruptInput, "rank {}: {}: hand-off {} after the last one ({} received)", d.side.rank,
                d.side.name, d.ready_buf, d.received);
  detail::sync_stream(d.side.gpu, stream);  // our reads of the slots are done
  d.slots.reset();
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
  CudaIpcReceiver::Setup rs{&link, rank, gpu, bytes, true, {}};
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
      rx->receive(in->data(), bytes, stream, deadline);
      detail::sync_stream(gpu, stream);
      if (it >= 0) trips.push_back(now_seconds() - t0);
    } else {
      // Echo: the copy back is ordered after the copy in on the same stream.
      rx->receive(in->data(), bytes, stream, deadline);
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
