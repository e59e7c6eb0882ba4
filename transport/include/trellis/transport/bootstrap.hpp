// Bootstrap: how ranks find each other. MPI launches the job and provides rank, size and a
// few collectives used to exchange addresses and agree on decisions; it is also the
// fallback data link. Everything above depends on this small interface, not on MPI, so
// single-rank runs and unit tests need no mpirun (the MSCCL++ Bootstrap idea).
//
// Threading: one thread at a time per Bootstrap. Every call takes a Deadline and throws
// trellis::Error{kTimeout} naming the operation and the peer when it passes, so a dead
// peer turns into an error instead of a hang.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/clock.hpp"

namespace trellis::transport {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This process's hostname as the OS reports it (the UTS namespace's, on the emulated
  // cluster). Hosts are told apart by topology/ with the boot id as well.
  virtual const std::string& hostname() const = 0;
  virtual bool is_mpi() const = 0;

  virtual void barrier(Deadline deadline) = 0;
  // Every rank contributes a byte string (sizes may differ); every rank gets all of them,
  // indexed by rank.
  virtual std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine,
                                                        Deadline deadline) = 0;
  // `data` on `root` is copied to every rank (resized there).
  virtual void broadcast(std::vector<std::byte>& data, int root, Deadline deadline) = 0;
  // Logical OR / MAX over ranks; used to agree that everybody may proceed.
  virtual bool any(bool mine, Deadline deadline) = 0;
  virtual double max(double mine, Deadline deadline) = 0;

  // Point-to-point on the bootstrap link (MPI). Blocking with a deadline; the receive
  // size must match the send size exactly, else kCorruptInput names the peer.
  virtual void send(int peer, int tag, std::span<const std::byte> data, Deadline deadline) = 0;
  virtual void recv(int peer, int tag, std::span<std::byte> data, Deadline deadline) = 0;
  // Both at once (avoids the deadlock of two blocking sends).
  virtual void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                        int tag, Deadline deadline) = 0;

  // Start-up liveness (MPI only; a no-op elsewhere): from now on every rank and rank 0 trade a
  // small heartbeat several times per `silence` on a thread of their own, and a world
  // collective that is still waiting fails once a rank it has heard from before has been
  // silent for `silence`: rank 0 names the silent ranks, the others name rank 0 (after a
  // grace, so that rank 0 speaks first). Without it, a link cut or a hung rank during
  // start-up was found only by the collective's own deadline (20 s), naming nobody when every
  // rank had already arrived. Call again to change `silence`; needs MPI_THREAD_MULTIPLE.
  virtual void watch_liveness(std::chrono::milliseconds silence) { (void)silence; }
  // After watch_liveness: the ranks this one hears from (rank 0: every rank; the others: rank
  // 0) that were heard from before and have now been silent for longer than `silence` (the
  // others: plus a 1.5 s grace), with how long. Any thread may call it. Empty without
  // heartbeats.
  struct SilentRank {
    int rank;
    double seconds;
  };
  virtual std::vector<SilentRank> silent_ranks() const { return {}; }

  // Ends the whole job now: MPI_Abort under mpirun. Used by a rank that failed and must
  // take its peers down with it; the launcher logs which rank and why before calling it.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// A world of one rank, no MPI.
std::unique_ptr<Bootstrap> make_local_bootstrap();
// Initialises MPI (MPI_THREAD_MULTIPLE when available) and finalises it on destruction.
// Only one may exist per process.
std::unique_ptr<Bootstrap> make_mpi_bootstrap();

// Convenience over allgather for strings.
std::vector<std::string> allgather_strings(Bootstrap& world, const std::string& mine,
                                           Deadline deadline);

// Library version string of the MPI implementation ("Open MPI v4.1.4, ...").
std::string mpi_library_version();

}  // namespace trellis::transport
