// A tensor-parallel Group over NCCL, for data in GPU memory.
//
// The model's all-reduce of a GPU stage goes through this group when every member has a GPU
// of its own (NCCL refuses two ranks of one communicator on one GPU). Its operations take
// device pointers on the member's GPU and are *enqueued* on the CUDA stream the group was
// made with (the model's compute stream), so they are ordered with the kernels around them
// and the host does not wait for them: all_reduce returns once NCCL has enqueued the
// collective. all_reduce_async runs on the group's own stream after an event on the compute
// stream, so a Ladder-Residual all-reduce of block i overlaps block i+1's kernels; its
// request completes (test() true) as soon as the compute stream has been made to wait for
// it: whatever the caller enqueues next on the compute stream sees the sum. barrier() and
// broadcast()/all_gather() of host memory are not offered (they throw kUnsupported naming
// the call): the engine keeps its host group for host data.
//
// Failure (issue 18 item 4): the communicator is non-blocking, so its set-up and every
// enqueue are polled against `deadline`; a watchdog thread checks the oldest collective in
// flight and NCCL's asynchronous error every few milliseconds. A collective that has not
// finished `deadline` after it was enqueued (a member that died or stopped calling), or an
// asynchronous NCCL error, aborts the communicator (which frees the kernels waiting in it, so
// the GPU stream and the host waiting on it move on) and the next call on the group throws
// kPeerFailed naming the group's ranks, the operation and NCCL's reason.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::transport {

class Bootstrap;

// Whether this build has NCCL (CUDA builds); when false make_nccl_group throws kUnsupported.
bool nccl_group_built();

// Builds the NCCL communicator of `members` (world ranks, in group order). Collective over
// the world like make_group: every world rank calls it with the same members in the same
// order; the first member makes NCCL's unique id and the world's bootstrap broadcasts it
// (no file, no extra socket); ranks not in `members` get nullptr. `gpu` is this rank's CUDA
// device, `cuda_stream` the cudaStream_t its collectives are ordered on. `p2p_disable` sets
// NCCL_P2P_DISABLE=1 before the communicator is made (--no-nvlink: NCCL then goes through
// host memory or the network instead of NVLink/PCIe peer access). Throws kTimeout when the
// members do not all join within `deadline`, kUnsupported in a build without NCCL.
std::unique_ptr<Group> make_nccl_group(Bootstrap& world, const std::vector<int>& members, int gpu, void* cuda_stream,
                                       Millis deadline, bool p2p_disable = false);

// Why a set of ranks cannot share one NCCL communicator, or "" when they can: members on one
// host must have different GPUs. `hosts[r]`/`gpus[r]` are world rank r's host index and GPU.
std::string nccl_group_obstacle(const std::vector<int>& members, const std::vector<int>& hosts,
                                const std::vector<int>& gpus);

}  // namespace trellis::transport
