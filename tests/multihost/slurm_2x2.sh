#!/usr/bin/env bash
# Slurm on the emulated cluster (scripts/cluster up 2 --slurm: munged, slurmctld on th0, a
# slurmd in each host): `srun --mpi=pmix` starts a pp=2 x tp=2 `trellis run` on the 2 nodes
# Slurm gives, 2 tasks each, and its tokens must equal the same job under mpirun; `trellis
# info` reports the srun launch and the hosts, `trellis topo` places the grid on them; srun
# without a PMI is refused with one message; and the sbatch script `trellis plan --sbatch`
# writes for the emulated hosts runs as a batch job whose output equals a single process's.
#   slurm_2x2.sh TRELLIS
set -u
source "$(dirname "$0")/lib.sh"
T=$(readlink -f "$1")
W=$(mktemp -d)
export TRELLIS_KERNEL_THREADS=1 TRELLIS_LOG_LEVEL=warn
MH_TIMEOUT=${MH_TIMEOUT:-60}  # per srun/mpirun: a hang fails here, well inside the CTest timeout
start=$SECONDS
cluster_start_slurm 2
trap '"$CLUSTER" down >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat > "$W/p.jsonl" <<'P'
{"tokens": [1, 5, 9, 200, 17], "sampling": {"greedy": true, "max_tokens": 10}}
{"text": "slurm hosts", "sampling": {"temperature": 0.8, "top_k": 30, "seed": 3, "max_tokens": 12}}
{"tokens": [4, 4, 4], "sampling": {"temperature": 1.2, "seed": 9, "repetition_penalty": 1.3, "max_tokens": 8}}
{"tokens": [11, 12, 13, 14], "sampling": {"seed": 21, "top_p": 0.8, "max_tokens": 9}}
P
JOB=(run --preset small --pp 2 --tp 2 --prompts "$W/p.jsonl" --max-seqs 4)

# 1. srun --mpi=pmix vs mpirun, same 2 x 2 job.
cluster_srun --mpi=pmix -N 2 --ntasks-per-node 2 "$T" "${JOB[@]}" --out "$W/srun.jsonl" > "$W/srun.log" 2>&1 \
  || { cat "$W/srun.log"; fail "srun --mpi=pmix exited $?"; }
grep -q "4 ranks on 2 hosts" "$W/srun.log" || { cat "$W/srun.log"; fail "the srun job did not see 4 ranks on 2 hosts"; }
cluster_mpirun -np 4 "$T" "${JOB[@]}" --out "$W/mpirun.jsonl" > "$W/mpirun.log" 2>&1 \
  || { cat "$W/mpirun.log"; fail "mpirun exited $?"; }
cmp -s "$W/srun.jsonl" "$W/mpirun.jsonl" || { diff "$W/srun.jsonl" "$W/mpirun.jsonl"; fail "srun and mpirun outputs differ"; }
[ "$(wc -l < "$W/srun.jsonl")" = 4 ] || fail "expected 4 answers, got $(wc -l < "$W/srun.jsonl")"
echo "ok: srun --mpi=pmix -N 2 --ntasks-per-node 2, pp=2 tp=2: token-identical to mpirun ($((SECONDS - start)) s)"

# 2. trellis info under srun: the launcher, the Slurm step, one line per rank on its own host.
out=$(cluster_srun --mpi=pmix -N 2 --ntasks-per-node 2 "$T" info 2>&1) || { echo "$out"; fail "info under srun"; }
grep -q "ranks: 4 (under srun --mpi=pmix)" <<<"$out" || { echo "$out"; fail "info: not under srun --mpi=pmix"; }
grep -q "srun --mpi=pmix; Slurm job [0-9]* step 0 on cluster trellis, 2 node(s) th\[0-1\], 4 task(s)" <<<"$out" \
  || { echo "$out"; fail "info: no Slurm job line"; }
for r in "0 th0 0" "1 th0 1" "2 th1 0" "3 th1 1"; do
  set -- $r
  grep -Eq "rank $1 +host $2 +local $3 " <<<"$out" || { echo "$out"; fail "info: rank $1 not on $2 as local rank $3"; }
done
echo "ok: trellis info under srun shows the Slurm step and ranks 0,1@th0 2,3@th1"
# The placement is made on the nodes Slurm gave: stage 0 on th0, stage 1 on th1.
out=$(cluster_srun --mpi=pmix -N 2 --ntasks-per-node 2 "$T" topo --pp 2 --tp 2 --no-ucx 2>&1) || { echo "$out"; fail "topo under srun"; }
for r in "0 0 0 th0" "1 0 1 th0" "2 1 0 th1" "3 1 1 th1"; do
  set -- $r
  grep -Eq "^ +$1 +$2 +$3 +$4 " <<<"$out" || { echo "$out"; fail "topo: rank $1 not placed at stage $2 tp $3 on $4"; }
done
echo "ok: trellis topo under srun places stage 0 on th0, stage 1 on th1"

# 3. srun without a PMI: every task refuses (exit 2), task 0 says why, nothing runs alone.
out=$(cluster_srun --mpi=none -N 2 --ntasks-per-node 2 "$T" "${JOB[@]}" 2>&1); rc=$?
[ $rc != 0 ] || { echo "$out"; fail "srun --mpi=none was not refused"; }
[ "$(grep -c 'without a process-management interface' <<<"$out")" = 1 ] || { echo "$out"; fail "expected one refusal message"; }
grep -q "trellis run:" <<<"$out" && { echo "$out"; fail "a task ran alone under srun --mpi=none"; }
echo "ok: srun --mpi=none refused with one message"

# 4. trellis plan --sbatch for these hosts (2 x 2 cores), submitted with sbatch.
"$T" make-model --preset tiny --dtype f32 --out "$W/model" > /dev/null || fail "make-model"
"$T" plan --model "$W/model" --cluster hosts=2,sockets=2,cores=1 --no-replicas --variants standard --batch 4 \
  --prompt-len 8 --gen-len 6 --sbatch "$W/job.sh" > "$W/plan.log" 2>&1 || { cat "$W/plan.log"; fail "plan --sbatch"; }
grep -q -- "--nodes=2" "$W/job.sh" && grep -q -- "--ntasks-per-node=2" "$W/job.sh" || { cat "$W/job.sh"; fail "job.sh layout"; }
id=$(TRELLIS="$T" timeout 30 sbatch --parsable --chdir "$W" "$W/job.sh") || fail "sbatch refused job.sh"
id=${id%%;*}
deadline=$((SECONDS + 60)) state=""
while :; do
  state=$(timeout 10 scontrol show job "$id" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) break ;; esac
  [ $SECONDS -lt $deadline ] || { timeout 10 scancel "$id"; cat "$W/trellis-$id.out" 2>/dev/null; fail "batch job $id still '$state' after 60 s"; }
  sleep 0.5
done
[ "$state" = COMPLETED ] || { cat "$W/job.sh" "$W/trellis-$id.out"; fail "batch job $id ended $state"; }
grep -q "4 ranks on 2 hosts" "$W/trellis-$id.out" || { cat "$W/trellis-$id.out"; fail "batch job did not run on 2 hosts"; }
workload=$(grep -o 'workload n=[^ ]*' "$W/job.sh" | cut -d' ' -f2)
timeout "$MH_TIMEOUT" "$T" run --model "$W/model" --workload "$workload" --max-seqs 4 --out "$W/one.jsonl" > "$W/one.log" 2>&1 \
  || { cat "$W/one.log"; fail "single-process run"; }
cmp -s "$W/one.jsonl" "$W/trellis-$id.jsonl" || { diff "$W/one.jsonl" "$W/trellis-$id.jsonl"; fail "batch job output differs from 1 process"; }
echo "ok: plan --sbatch script ($(grep -o 'pp [0-9]* --tp [0-9]*' "$W/job.sh")) ran as batch job $id, token-identical to 1 process"
echo "PASS ($((SECONDS - start)) s)"
