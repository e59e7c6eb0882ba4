#!/usr/bin/env bash
# 2 emulated hosts x 2 ranks: live discovery must group the ranks by host (hostname plus
# boot id: the namespaces share one kernel, so only the hostname tells them apart) and the
# placement must keep each TP group on one host, crossing hosts only between stages.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$HERE/../multihost/lib.sh" ] || { echo "SKIPPED: tests/multihost/lib.sh is absent"; exit 77; }
source "$HERE/../multihost/lib.sh"
[ -x "$CLUSTER" ] || mh_skip "scripts/cluster is absent"
T=$1
PY=/usr/bin/python3
cluster_start 2
out=$(cluster_mpirun -np 4 "$T" topo --pp 2 --tp 2 2>&1); rc=$?
echo "$out"
[ $rc = 0 ] || { echo "FAIL: trellis topo exited $rc"; exit 1; }
json=$(cluster_mpirun -np 4 "$T" topo --pp 2 --tp 2 --json 2>/dev/null); rc=$?
[ $rc = 0 ] || { echo "FAIL: trellis topo --json exited $rc"; exit 1; }
"$PY" - "$json" <<'PYEOF' || exit 1
import json, sys
j = json.loads(sys.argv[1])
t, p = j["topology"], j["placement"]
names = [h["name"] for h in t["hosts"]]
assert sorted(names) == ["th0", "th1"], f"expected hosts th0, th1; got {names}"
ranks = t["ranks"]
assert len(ranks) == 4, f"expected 4 ranks, got {len(ranks)}"
per_host = {}
for r in ranks:
    per_host.setdefault(names[r["host"]], []).append(r["rank"])
assert all(len(v) == 2 for v in per_host.values()), f"ranks not 2 per host: {per_host}"
assert len({h["boot_id"] for h in t["hosts"]}) == 1, "namespaces share one kernel, so one boot id"
for r in p["ranks"]:
    assert r["host"] == ranks[r["rank"]]["host"], f"rank {r['rank']} placed off its own host"
for s in range(p["pp"]):
    hosts = {r["host"] for r in p["ranks"] if r["stage"] == s}
    assert len(hosts) == 1, f"TP group of stage {s} spans hosts {hosts}"
    assert p["tp_groups"][s]["link_class"] == "shm", p["tp_groups"][s]
assert p["boundaries"][0]["link_class"] == "tcp", p["boundaries"]
print("discovery:", per_host, "; stages:",
      [[r["rank"] for r in p["ranks"] if r["stage"] == s] for s in range(p["pp"])])
PYEOF
echo "PASS"
