#!/usr/bin/env bash
# `trellis topo` from the command line: files, synthetic specs, placement, --no-nvlink,
# JSON, and every kind of bad input (exit 1 with a message naming what was wrong).
# Usage: topo_cli.sh PATH/TO/trellis [MPIEXEC FLAGS...]   (with MPIEXEC: the mpirun cases)
set -u
T="$1"; shift
MPI=("$@")
PY=/usr/bin/python3
TOPOS="${TRELLIS_SHARED:-}/topologies"
DGX="$TOPOS/hwloc-nvidia-dgx2.xml"
H100="hosts=2,gpus=8,gpu=H100-SXM,nvlink=all,nics=8x400g-ib"
fails=0
check() {  # check NAME EXPECTED_RC EXPECTED_TEXT -- CMD...
  local name=$1 want_rc=$2 want_text=$3; shift 4
  local out rc
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ]; then echo "FAIL $name: exit $rc, wanted $want_rc"; echo "$out" | tail -20; fails=$((fails+1)); return; fi
  if [ -n "$want_text" ] && ! grep -qF -- "$want_text" <<<"$out"; then
    echo "FAIL $name: output lacks '$want_text'"; echo "$out" | tail -20; fails=$((fails+1)); return; fi
  echo "ok   $name"
}

if [ ${#MPI[@]} -gt 0 ]; then
  check "mpirun: 2 ranks, one host"     0 "ranks: 0@"                -- "${MPI[@]}" -np 2 "$T" topo --no-nvml
  check "mpirun: placement of 2 ranks"  0 "stage boundaries"         -- "${MPI[@]}" -np 2 "$T" topo --pp 2 --tp 1
  check "mpirun: wrong grid, one error" 1 "must equal the ranks available: 2 discovered rank(s)" \
                                                                      -- "${MPI[@]}" -np 2 "$T" topo --pp 2 --tp 2
  json=$(timeout 120 "${MPI[@]}" -np 2 "$T" topo --tp 2 --json 2>/dev/null)
  if "$PY" -c 'import json,sys; j=json.loads(sys.argv[1]); assert len(j["topology"]["ranks"])==2 and len(j["topology"]["hosts"])==1 and j["placement"]["tp_groups"][0]["link_class"]=="shm"' "$json"; then
    echo "ok   mpirun: --json has both ranks on one host"; else echo "FAIL mpirun --json"; fails=$((fails+1)); fi
  echo "$fails failed"; [ "$fails" = 0 ]; exit
fi

check "help shows the synthetic grammar" 0 "nics=NxRATE-KIND"         -- "$T" topo --help
check "live discovery of this host"      0 "device matrix of host"    -- "$T" topo
check "live, CPU ranks planned"          0 "stage boundaries"         -- "$T" topo --cpu-ranks-per-host 2 --pp 2 --ranks cpu
check "synthetic 2x8 H100 p=2 t=8"       0 "nvlink 450.0 GB/s"        -- "$T" topo --synthetic "$H100" --pp 2 --tp 8
check "synthetic p=4 t=4 boundary rdma"  0 "1 -> 2: rdma 50.0 GB/s"   -- "$T" topo --synthetic "$H100" --pp 4 --tp 4
check "--no-nvlink shows the difference" 0 "TP group of stage 0: nvlink -> pcie" \
                                                                      -- "$T" topo --synthetic "$H100" --pp 2 --tp 8 --no-nvlink
check "--tp alone derives --pp"          0 "p=2 x t=8"                -- "$T" topo --synthetic "$H100" --tp 8
check "bad spec points at the token"     1 "'gpus=x'"                 -- "$T" topo --synthetic "hosts=2,gpus=x"
check "grid that does not fit"           1 "must equal the ranks available" -- "$T" topo --synthetic "$H100" --pp 4 --tp 8
check "heads not divisible by t"         1 "attention heads (30) must be divisible by t=8" \
                                                                      -- "$T" topo --synthetic "$H100" --pp 2 --tp 8 --heads 30
check "kv heads not divisible by t"      1 "KV heads (4) must be divisible by t=8" \
                                                                      -- "$T" topo --synthetic "$H100" --pp 2 --tp 8 --kv-heads 4
check "layers < p"                       1 "layers (2) must be >= p=4" -- "$T" topo --synthetic "$H100" --pp 4 --tp 4 --layers 2
check "missing file named"               1 "/no/such/file.xml"        -- "$T" topo --topo-file /no/such/file.xml
check "file and spec exclude each other" 1 "exclude each other"       -- "$T" topo --topo-file x.xml --synthetic hosts=1
bad=$(mktemp); echo "<topology version=\"2.0\"><object type=" > "$bad"
check "corrupt file named"               1 "$bad"                     -- "$T" topo --topo-file "$bad"
rm -f "$bad"
# A mutation of a real export, found by fuzz/topology_fuzz.cpp, on which hwloc 2.9 itself
# segfaults inside hwloc_topology_load: an error naming the file, not a crash (rc 139).
crash="$(dirname "$0")/data/hwloc-crashes-hwloc-2.9.xml"
check "file that crashes hwloc named"    1 "topology file '$crash'" -- "$T" topo --topo-file "$crash"
if "$T" topo --synthetic "$H100" --pp 2 --tp 8 --json | "$PY" -c 'import json,sys; j=json.load(sys.stdin); assert len(j["topology"]["hosts"])==2 and j["placement"]["boundaries"][0]["link_class"]=="rdma"'; then
  echo "ok   --json parses"; else echo "FAIL --json"; fails=$((fails+1)); fi
if [ -f "$DGX" ]; then
  check "DGX-2 matrix: NVSwitch"         0 "NVS6"                     -- "$T" topo --topo-file "$DGX"
  check "DGX-2 p=2 t=8 on NVLink"        0 "0 -> 1: nvlink"           -- "$T" topo --topo-file "$DGX" --pp 2 --tp 8
  check "DGX-2 --no-nvlink matrix"       0 "(NVLink treated as absent)" -- "$T" topo --topo-file "$DGX" --no-nvlink
  check "2xDGX-2: two hosts"             0 "2 host(s), 32 GPU(s)"     -- "$T" topo --topo-file "2x$DGX"
  check "two files: two hosts"           0 "2 host(s)"                -- "$T" topo --topo-file "$DGX" --topo-file "$TOPOS/hwloc-lassen-4v100-4mlx5.xml"
else
  echo "skip DGX-2 cases: $DGX not found"
fi
echo "$fails failed"
[ "$fails" = 0 ]
