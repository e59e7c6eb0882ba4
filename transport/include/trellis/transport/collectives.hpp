// Collectives: Group implementations chosen from the message size and the links of a group,
// and the factory that picks one (make_group).
//
// Algorithms (Group::describe() names them):
//  * "shm"  — every member on one host. One shared-memory segment per group holds a ring of
//    K slots per rank (GroupOptions::shm_slots x shm_slot_bytes); a message goes through in
//    pieces of one slot, each piece in three phases that end with a per-rank flag: fill
//    (copy into my slot what the peers need), reduce, drain (read the peers' slots). Small
//    messages are summed by every rank over all slots ("one-shot"); larger ones are
//    reduce-scattered (rank r sums chunk r, in rank order, its own contribution read from
//    its buffer, into its buffer and its slot) and all-gathered from the slots
//    ("two-shot"). The only rule between pieces is that a slot is written again only after
//    every member finished the piece K before, so pieces pipeline: a rank fills piece s+1
//    while its peers still reduce piece s. This is the CPU analogue of vLLM's custom
//    all-reduce: no copies through a transport, all ranks reducing in parallel. Broadcast,
//    all-gather and barrier use the same slots and flags. Data in a registered window
//    (Group::allocate_window) is all-reduced in place instead: rank r sums chunk r of every
//    member's window and writes it into all of them, no copy in or out.
//  * "ring" — members on different hosts, one per host, connected by Links (UCX across
//    hosts by default). Recursive doubling for small messages when the size is a power of
//    two (log2 P steps), the bandwidth-optimal ring (reduce-scatter + all-gather,
//    2(P-1) steps) otherwise.
//  * "hierarchical" — members on several hosts with more than one on some host: shm
//    all-reduce in each host, ring among the host leaders (first member on each host), shm
//    broadcast from the leader.
//  * "mpi" (make_mpi_group) — the fallback and the reference; "single" for one rank.
//
// Numerics: f32 sums are formed in rank order (shm) or in an order that is the same on every
// member (ring, recursive doubling), so every member ends with bit-identical results. bf16
// is widened to f32, accumulated in f32 and rounded once at the end.
//
// Threading and ordering: one thread at a time per Group; members issue the same operations
// in the same order. An asynchronous operation makes progress when its request is tested or
// waited on; a group has at most one operation in flight, so issuing a second one first
// completes the previous one (bounded by the group's deadline). Requests must not outlive
// their Group. Every wait has a deadline; a member that does not arrive in time is named in
// the kTimeout error, and a member whose operation failed or was abandoned marks the shm
// segment so that its peers fail at once with kPeerFailed naming it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/core/config.hpp"
#include "trellis/transport/group.hpp"
#include "trellis/transport/link.hpp"

namespace trellis::transport {

enum class Algorithm { kAuto, kMpi, kShm, kRing, kHierarchical };
std::string_view to_string(Algorithm a);
// Parses "auto", "mpi", "shm", "ring", "hierarchical"; throws kInvalidArgument naming them.
Algorithm parse_algorithm(std::string_view name);

struct GroupOptions {
  Algorithm algorithm = Algorithm::kAuto;
  // Backend of the links between hosts (ring, hierarchical).
  Backend cross_host = Backend::kUcx;
  // Bytes per rank per ring slot in the shm segment: messages go through in pieces of this
  // size (cache-sized, so the ring stays in the caches while the pieces stream through).
  std::size_t shm_slot_bytes = 256u << 10;
  // Ring slots (K >= 2) per rank: up to K pieces are in flight, a rank filling piece s+1
  // while its peers reduce piece s; a slot is reused only after every member finished it.
  std::size_t shm_slots = 8;
  // shm collectives: a waiting rank blocks on a futex in the segment once spinning and
  // yielding did not end its wait, and the peers' next publish wakes it (false: it keeps
  // yielding and then sleeps, like every other wait).
  bool shm_park = true;
  // shm all-reduce: one-shot up to this many bytes, two-shot above.
  std::size_t one_shot_max_bytes = 32u << 10;
  // ring: recursive doubling up to this many bytes (power-of-two groups only), ring above.
  std::size_t doubling_max_bytes = 64u << 10;
  // Longest any single blocking collective may wait.
  Millis deadline{30000};
  // How blocking collectives wait (spin, then yield, then sleep; settings comm.wait_*).
  PollPolicy wait;

  // From the settings comm.coll_algorithm, comm.coll_backend, comm.coll_shm_slot_bytes,
  // comm.coll_shm_slots, comm.coll_shm_park, comm.coll_one_shot_max, comm.coll_doubling_max, comm.deadline_ms and comm.wait_*.
  static GroupOptions from_config(const Config& config);
};

// Host index of every world rank, equal indices meaning "same host". Collective over the
// world; derived from Bootstrap::hostname() (each emulated host has its own UTS name).
std::vector<int> host_map(Bootstrap& world, Deadline deadline);

// Picks and builds the Group for `members` (world ranks, in group order). Collective over
// the world: every world rank calls it with the same members and options, in the same order
// as its other make_*group calls; ranks not in `members` get nullptr. `hosts` is
// host_map()'s answer (computed here when empty). `config` supplies the link settings
// (connect timeouts) for the links the group opens. kAuto: one member -> single; all on one
// host -> shm; one per host -> ring; otherwise hierarchical. An explicit algorithm that
// does not fit the members (shm across hosts) throws kInvalidArgument naming the hosts.
std::unique_ptr<Group> make_group(Bootstrap& world, const std::vector<int>& members,
                                  const GroupOptions& options, const Config& config,
                                  std::vector<int> hosts = {});

// The shm algorithm alone. Collective over the world: every world rank calls it once;
// unlike make_group, ranks may pass different, disjoint member lists (each rank its own
// host's group), and a rank in no group passes an empty list and gets nullptr. All members of
// one list must share /dev/shm.
std::unique_ptr<Group> make_shm_group(Bootstrap& world, const std::vector<int>& members,
                                      const GroupOptions& options);

// The ring/recursive-doubling algorithm over links of `options.cross_host`. Collective over
// the world like make_shm_group (disjoint lists allowed, empty list -> nullptr).
std::unique_ptr<Group> make_ring_group(Bootstrap& world, const std::vector<int>& members,
                                       const GroupOptions& options, const Config& config);

// Open MPI's own blocking MPI_Allreduce on `members` (collective over the world, like
// make_mpi_group): the peer `trellis bench comm` measures in the same run. It has no
// deadline (MPI's blocking call cannot take one), so it is for benchmarks only.
std::unique_ptr<Group> make_mpi_peer_group(Bootstrap& world, const std::vector<int>& members);

}  // namespace trellis::transport
