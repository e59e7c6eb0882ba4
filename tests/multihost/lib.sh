# Shared by multihost test scripts: `source tests/multihost/lib.sh` then `cluster_start N [RATE]`
# (or `cluster_start_slurm N`).
# Exits 77 (CTest "skipped") with a reason when the emulated cluster cannot run here, and
# tears the cluster down when the script exits, whatever happened.
MH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER="$MH_ROOT/scripts/cluster"

mh_skip() { echo "SKIPPED: $*"; exit 77; }

mh_preflight() {
  [ "$(id -u)" = 0 ] || mh_skip "multihost tests need root to create network namespaces"
  command -v ip >/dev/null || mh_skip "iproute2 (ip) is not installed"
  command -v unshare >/dev/null || mh_skip "unshare (util-linux) is not installed"
  ip netns add trellis-probe 2>/dev/null || mh_skip "this kernel/container does not allow network namespaces"
  ip netns del trellis-probe
}

cluster_start() {
  local n=$1 rate=${2:-}
  mh_preflight
  trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT
  if [ -n "$rate" ]; then "$CLUSTER" up "$n" --rate "$rate"; else "$CLUSTER" up "$n"; fi
}

# cluster_start_slurm N: the cluster with Slurm on it (`scripts/cluster up N --slurm`: munged,
# slurmctld on th0, slurmd on every host, all nodes idle) and SLURM_CONF exported. Slurm or
# munge not installed is a failure, not a skip: scripts/setup-deps installs them.
cluster_start_slurm() {
  local n=$1 c
  mh_preflight
  for c in munged slurmctld slurmd srun sbatch sinfo; do
    command -v "$c" >/dev/null || { echo "FAIL: $c is not installed (scripts/setup-deps installs slurm-wlm and munge)"; exit 1; }
  done
  trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT
  "$CLUSTER" up "$n" --slurm || { echo "FAIL: scripts/cluster up $n --slurm"; exit 1; }
  export SLURM_CONF=${TRELLIS_CLUSTER_STATE:-/run/trellis-cluster}/slurm/slurm.conf
}

# cluster_mpirun ARGS... : mpirun across the emulated hosts, bounded in time.
cluster_mpirun() { timeout "${MH_TIMEOUT:-240}" "$CLUSTER" mpirun "$@"; }

# cluster_srun ARGS... : srun on the emulated Slurm cluster, bounded in time (SIGTERM makes
# srun cancel its step; KILL follows 10 s later).
cluster_srun() { timeout -k 10 "${MH_TIMEOUT:-240}" srun "$@"; }
