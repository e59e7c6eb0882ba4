// Group: collective operations over a set of ranks (a TP group, a stage's ranks, the world).
//
// This is the API the model's tensor-parallel layers and the variants call; which algorithm
// runs (shared memory in a host, ring / recursive halving-doubling across hosts,
// hierarchical for groups spanning hosts) is the implementation's choice, made from the
// message size and the links of the group. Every blocking call has a deadline (from
// construction) and names the failing peer on error.
//
// Threading: one thread at a time per Group; asynchronous operations progress when their
// request is tested or waited on (and, where an implementation has one, by a progress
// thread). Operations must be issued in the same order on every member.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trellis/transport/request.hpp"

namespace trellis::transport {

class Bootstrap;

enum class DType { kF32, kBF16 };

class Group {
 public:
  virtual ~Group() = default;

  // This rank's index inside the group, and the group size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // World ranks of the members, in group order.
  virtual const std::vector<int>& members() const = 0;
  // The algorithm family in use, for logs, first word "mpi", "shm", "ring" or "hierarchical";
  // link-based ones name their links: "ring over ucx", "hierarchical (shm in each host, ring
  // over ucx between hosts)".
  virtual std::string describe() const = 0;

  // In-place sum over the group. `data` holds count elements of dtype (bf16 as uint16 bits);
  // bf16 is accumulated in f32 and rounded once.
  virtual void all_reduce(void* data, std::size_t count, DType dtype) = 0;
  // The asynchronous form: returns at once; `data` must stay untouched until the request
  // completes. Used by Ladder Residual to overlap the reduction with the next module.
  virtual RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) = 0;
  // Memory the members reach directly ("registered" memory, like the IPC buffers of vLLM's
  // custom all-reduce or NCCL's user buffer registration): this rank's `bytes` of a region
  // shared by the group, zeroed, valid while the group lives. An all_reduce (or its async
  // form) whose data lies inside it, at the same offset and count on every member, reads the
  // peers' data in place and writes each chunk's sum straight into every member's window,
  // instead of copying in and out through the group's own buffers: half the memory traffic.
  // Collective: every member calls it with the same `bytes`, in the same order as its other
  // operations. A hierarchical group returns its host's shm window (the in-host phase runs in
  // place). Groups without such memory (rings over links, MPI) return an empty span; a group
  // of one returns private memory. all_reduce works on any memory either way.
  virtual std::span<std::byte> allocate_window(std::size_t /*bytes*/) { return {}; }
  // True for a group whose operations take GPU memory and are enqueued on a CUDA stream
  // rather than finished when they return (make_nccl_group, nccl_group.hpp); false for every
  // host-memory group here.
  virtual bool device_memory() const { return false; }

  // `bytes` bytes at `data` on group rank `root` are copied to every member.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Each member contributes `bytes` bytes; `out` receives size()*bytes, in group order.
  virtual void all_gather(const void* in, void* out, std::size_t bytes) = 0;
  virtual void barrier() = 0;
};

// A group backed by MPI collectives (MPI_Iallreduce etc., polled against the deadline);
// the fallback and the reference the faster algorithms are tested against. `members` are
// world ranks; every world rank must call this with the same lists in the same order
// (ranks not in `members` get nullptr). Requires an MPI bootstrap.
std::unique_ptr<Group> make_mpi_group(Bootstrap& world, const std::vector<int>& members,
                                      Millis deadline);

// A group of one rank: every operation is a no-op (a t=1 model needs no MPI).
std::unique_ptr<Group> make_single_group(int world_rank);

std::size_t dtype_size(DType dtype);

}  // namespace trellis::transport
