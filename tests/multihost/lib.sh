# Shared by multihost test scripts: `source tests/multihost/lib.sh` then `cluster_start N [RATE]`.
# Exits 77 (CTest "skipped") with a reason when the emulated cluster cannot run here, and
# tears the cluster down when the script exits, whatever happened.
MH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER="$MH_ROOT/scripts/cluster"

mh_skip() { echo "SKIPPED: $*"; exit 77; }

cluster_start() {
  local n=$1 rate=${2:-}
  [ "$(id -u)" = 0 ] || mh_skip "multihost tests need root to create network namespaces"
  command -v ip >/dev/null || mh_skip "iproute2 (ip) is not installed"
  command -v unshare >/dev/null || mh_skip "unshare (util-linux) is not installed"
  ip netns add trellis-probe 2>/dev/null || mh_skip "this kernel/container does not allow network namespaces"
  ip netns del trellis-probe
  trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT
  if [ -n "$rate" ]; then "$CLUSTER" up "$n" --rate "$rate"; else "$CLUSTER" up "$n"; fi
}

# cluster_mpirun ARGS... : mpirun across the emulated hosts, bounded in time.
cluster_mpirun() { timeout "${MH_TIMEOUT:-240}" "$CLUSTER" mpirun "$@"; }
