#!/usr/bin/env bash
# Core binding at start (comm.bind_cores) on and off, alternating, 6 jobs each, under
# mpirun --bind-to none: ucx one-way at 8 B and 4 KiB and ucx_perftest at 4 KiB per job.
# docs/benchmarks.md ("Core binding at start").
#   scripts/bench/bind_cores.sh [TRELLIS]
cd "$(dirname "$0")/../.."
T=${1:-build/release/launchers/trellis}
[ -x "$T" ] || { echo "bind_cores.sh: $T not built" >&2; exit 1; }
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
for i in 1 2 3 4 5 6; do
  for b in true false; do
    out=$(mpirun "${root[@]}" --bind-to none -np 2 "$T" --set comm.bind_cores=$b bench comm --sections p2p --backends ucx,shm --max-size 4KiB --iters 1000 --calibration "${TMPDIR:-/tmp}/bind_cores_cal.json" 2>&1)
    ucx8=$(awk '/^p2p ucx \(/{f=1} f&&/ 8 B/{print $3,$4; exit}' <<<"$out")
    ucx4=$(awk '/^p2p ucx \(/{f=1} f&&/4 KiB/{print $3,$4; exit}' <<<"$out")
    perf4=$(awk '/^p2p ucx_perftest/{f=1} f&&/4 KiB/{print $3,$4; exit}' <<<"$out")
    echo "$i bind=$b load=$(cut -d' ' -f1 /proc/loadavg) ucx8=$ucx8 ucx4k=$ucx4 perftest4k=$perf4"
  done
done
