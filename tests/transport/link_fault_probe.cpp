// A small MPI program for the fault tests (link_fault_*.sh): every rank connects to every
// other rank over one backend and exchanges 4 KiB with each peer per round. One rank can
// kill itself with SIGKILL mid-exchange (--die-rank/--die-after) or stop talking
// (--mute-rank: alive, silent, like a host behind a downed link). Each surviving rank
// writes OUT/rank<R>.txt: "fail <seconds> <message>" when a wait failed (the message must
// name the peer), or "ok" when every round completed; it exits 3 on failure. After connect
// it writes OUT/rank<R>.started, so a script knows when to break a link.
//
// Usage: link_fault_probe BACKEND DEADLINE_MS OUT_DIR [--die-rank R --die-after N]
//        [--mute-rank R --mute-after N] [--rounds N] [--round-ms MS (pause per round)]
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/link.hpp"

using namespace trellis;
using namespace trellis::transport;

namespace {

struct Options {
  std::string backend, out;
  long deadline_ms = 3000;
  int die_rank = -1, die_after = 0, mute_rank = -1, mute_after = 0, rounds = 200, round_ms = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s BACKEND DEADLINE_MS OUT_DIR [--die-rank R --die-after N] [--mute-rank R --mute-after N] [--rounds N]\n", argv[0]);
    std::exit(2);
  }
  o.backend = argv[1];
  o.deadline_ms = std::stol(argv[2]);
  o.out = argv[3];
  for (int i = 4; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::stoi(argv[i + 1]);
    if (k == "--die-rank") o.die_rank = v;
    else if (k == "--die-after") o.die_after = v;
    else if (k == "--mute-rank") o.mute_rank = v;
    else if (k == "--mute-after") o.mute_after = v;
    else if (k == "--rounds") o.rounds = v;
    else if (k == "--round-ms") o.round_ms = v;
  }
  return o;
}

void report(const Options& o, int rank, const std::string& line) {
  std::ofstream(o.out + "/rank" + std::to_string(rank) + ".txt") << line << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  auto world = make_mpi_bootstrap();
  const int me = world->rank();
  Config config;
  config.set("comm.deadline_ms", std::to_string(o.deadline_ms), SettingSource::kFlag, "probe");
  std::vector<int> peers;
  for (int r = 0; r < world->size(); ++r)
    if (r != me) peers.push_back(r);
  std::unique_ptr<Transport> t;
  try {
    t = connect(parse_backend(o.backend), *world, peers, config);
  } catch (const Error& e) {
    report(o, me, std::string("setup ") + e.what());
    std::fprintf(stderr, "rank %d: setup failed: %s\n", me, e.what());
    return 4;
  }
  std::ofstream(o.out + "/rank" + std::to_string(me) + ".started") << "connected\n";
  std::vector<std::vector<std::byte>> in(peers.size(), std::vector<std::byte>(4096)), out = in;
  for (int round = 0; round < o.rounds; ++round) {
    if (o.round_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.round_ms));
    if (me == o.die_rank && round == o.die_after) raise(SIGKILL);
    if (me == o.mute_rank && round == o.mute_after) {
      // Alive but silent: wait out the others' deadline, then leave quietly.
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * o.deadline_ms));
      report(o, me, "muted");
      std::_Exit(0);
    }
    // Every operation of the round is posted and waited for even after one failed: a
    // survivor that skipped its sends to the other survivors (posting to the dead rank can
    // throw before they are posted) or vanished at once would make the next survivor see
    // *this* rank's silence or closed connection first and report it instead of the dead
    // one (a race the test must not depend on; CI saw both).
    std::vector<RequestPtr> reqs;
    auto start = Clock::now();
    std::string error;
    double failed_after = 0;
    auto note = [&](const Error& e) {
      if (!error.empty()) return;
      error = e.what();
      failed_after = std::chrono::duration<double>(Clock::now() - start).count();
    };
    for (std::size_t i = 0; i < peers.size(); ++i) try {
        reqs.push_back(t->link(peers[i]).irecv(in[i], 1));
      } catch (const Error& e) {
        note(e);
      }
    for (std::size_t i = 0; i < peers.size(); ++i) try {
        reqs.push_back(t->link(peers[i]).isend(out[i], 1));
      } catch (const Error& e) {
        note(e);
      }
    auto deadline = Deadline::after_ms(o.deadline_ms);
    for (auto& r : reqs) try {
        r->wait(error.empty() ? deadline : Deadline::after_ms(500));
      } catch (const Error& e) {
        note(e);
      }
    if (!error.empty()) {
      std::fprintf(stderr, "rank %d: round %d failed after %.2f s: %s\n", me, round, failed_after, error.c_str());
      report(o, me, "fail " + std::to_string(failed_after) + " " + error);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      reqs.clear();
      t.reset();
      // Leave without MPI_Finalize: a peer is gone and finalize could wait on it.
      std::_Exit(3);
    }
  }
  report(o, me, "ok");
  t.reset();
  world->barrier(Deadline::after_ms(o.deadline_ms));
  return 0;
}
