// Links: point-to-point data paths between this rank and its peers, one backend per link.
//
// A Transport is one backend's instance on this rank (a UCP worker, a shared-memory
// segment set, a set of TCP connections, an MPI communicator, an NCCL communicator); it
// hands out a Link per connected peer. Links are non-blocking: isend/irecv return a Request
// whose wait() takes a deadline. Messages on the same link and tag are delivered in order.
// A receive's buffer must be at least as large as the matching send; the received byte
// count is Request::bytes().
//
// Capabilities advertise only what the backend really does (UCX's rule): a backend that
// cannot read GPU memory says so, and callers must not hand it device pointers.
//
// Backends: shm (same host, CPU memory), ucx (UCP tag API, RDMA where the NIC has it),
// tcp (Boost.Asio, token-checked), mpi (fallback), nccl (GPU buffers; CUDA builds only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/config.hpp"
#include "trellis/transport/request.hpp"

namespace trellis::transport {

class Bootstrap;

enum class Backend { kShm, kUcx, kTcp, kMpi, kNccl };
std::string_view to_string(Backend b);
// Parses "shm", "ucx", "tcp", "mpi", "nccl"; throws kInvalidArgument listing the valid names.
Backend parse_backend(std::string_view name);
// Backends compiled into this build (nccl only in CUDA builds), in enum order.
std::vector<Backend> built_backends();

struct Capabilities {
  bool device_memory = false;  // may be given GPU pointers
  bool same_host_only = false;
  bool rma = false;            // one-sided puts into registered remote buffers
  std::size_t max_message = 0; // largest single message (0: unlimited)
};

class Link {
 public:
  virtual ~Link() = default;
  virtual int peer() const = 0;
  virtual Backend backend() const = 0;
  // Non-blocking. `data` must stay valid (and, for receives, untouched) until completion.
  virtual RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) = 0;
  virtual RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) = 0;
};

// A buffer registered once with a transport and reused by many operations (preallocated
// stage-streaming and collective buffers). Operations whose span lies inside a registered
// buffer use the registration: UCX maps the memory once (ucp_mem_map) and hands the handle
// to every operation, so protocols that need registered memory (RDMA, cma) skip
// per-operation registration. Backends that need none (shm, tcp, mpi, nccl) keep only the
// span. Unregistered when destroyed; it must outlive the operations on it, and the
// Transport must outlive it.
class Registration {
 public:
  virtual ~Registration() = default;
  virtual std::span<std::byte> data() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Registers `data` (see Registration). The default keeps the span only.
  virtual std::unique_ptr<Registration> register_buffer(std::span<std::byte> data);
  virtual Backend backend() const = 0;
  virtual Capabilities capabilities() const = 0;
  // The link to `peer` (a world rank among those connected); throws kInvalidArgument
  // for a peer this transport was not connected to.
  virtual Link& link(int peer) = 0;
  // Drives progress of every outstanding request (for backends that need it).
  virtual void progress() = 0;
  // One line for logs: the backend and what it runs over ("ucx over tcp,posix; 3 peers").
  virtual std::string describe() const { return std::string(to_string(backend())); }
};

// Connects this rank to `peers` (world ranks) with `backend`. Collective over the world:
// every rank calls it with the same backend, each with its own peer list (symmetric: if A
// lists B, B lists A). Addresses travel through the bootstrap; waits are bounded by the
// settings comm.connect_timeout_ms and comm.deadline_ms from `config`.
// Backend-specific settings: comm.shm.ring_bytes, comm.tcp.address, comm.tcp.max_frame
// (see transport/README.md); UCX reads its own UCX_* environment variables. Throws
// kUnsupported for a backend not built here (nccl without CUDA) or not usable with this
// world (mpi without an MPI bootstrap).
// The Transport must outlive every Request it handed out. Threading: one thread at a
// time per Transport (its links and requests included).
// The poll policy of blocking waits from the settings comm.wait_spins, comm.wait_yields and
// comm.wait_sleep_us (defaults: PollPolicy{}).
PollPolicy wait_policy(const Config& config);

std::unique_ptr<Transport> connect(Backend backend, Bootstrap& world, const std::vector<int>& peers,
                                   const Config& config);

}  // namespace trellis::transport
