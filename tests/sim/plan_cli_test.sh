#!/usr/bin/env bash
# `trellis plan` end to end: a ranked table and an SVG for Llama-3.1-70B on 2x8 H100, JSON,
# the appendix model, bad input (unknown model, cluster, malformed calibration, nothing
# feasible) with the messages the issue asks for, a shared hwloc XML, --validate, and the
# Slurm batch script of --sbatch (layout lines, srun line, job array for replicas).
set -u
TRELLIS=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
check() {  # check NAME EXPECTED_RC PATTERN -- command...
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $want_rc ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name (rc $rc, want $want_rc, pattern '$pattern')"
    echo "$out" | head -20
    fail=1
  else
    echo "ok   $name"
  fi
}

check table 0 'why #1: .*takes [0-9]+% of each decode step' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --svg "$TMP/p.svg" --top 5
grep -q '</svg>' "$TMP/p.svg" && grep -q 'ladder' "$TMP/p.svg" || { echo "FAIL svg"; fail=1; }
check json 0 '"ranked": \[' -- "$TRELLIS" plan --model llama-3.1-70b --cluster hosts=2,gpus=8,gpu=H100-SXM,nics=8x400g-ib --json --top 2
check appendix 0 'appendix model' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --sim-model appendix --top 2
check slo 0 'SLO +TPOT <= 20 ms' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 20 --top 2
check unknown-model 1 'valid models: .*llama-3.1-70b' -- "$TRELLIS" plan --model llama-9 --cluster 2x8xH100
check unknown-cluster 1 'unknown cluster .*2x8xH100-NDR.*H100-SXM' -- "$TRELLIS" plan --model llama-3.1-8b --cluster bogus
check unknown-gpu 1 'valid devices: .*B200' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --gpu TPU
check unknown-variant 1 'valid( variants)?: standard' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --variants turbo
check nothing-fits 1 'no feasible configuration: binding constraint is device memory.*GiB' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 1x2xH100
check slo-impossible 1 'no feasible configuration: binding constraint is the latency SLO' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 0.1
echo '{"schema": "trellis.calibration.v1", "links": [{"class": "rdma", "alpha_us": "x", "bandwidth_GBps": 1}]}' > "$TMP/bad.json"
check bad-calibration 1 "field 'links\[0\].alpha_us'" -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 2x8xH100 --calibration "$TMP/bad.json"
echo '{"schema": "trellis.calibration.v1", "links": [{"class": "rdma", "alpha_us": 9, "bandwidth_GBps": 3, "max_bytes": 1024}]}' > "$TMP/cal.json"
check calibrated-range 0 'exceed the calibrated range' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --calibration "$TMP/cal.json" --no-replicas --variants standard
XML=${TRELLIS_SHARED:-$(dirname "$0")/../../../shared}/topologies/hwloc-nvidia-dgx2.xml
if [[ -f $XML ]]; then
  check xml 0 '16 V100-SXM3' -- "$TRELLIS" plan --model llama-3.1-8b --topo-file "$XML" --top 2
fi
cat > "$TMP/runs.json" <<'JSON'
{"schema": "trellis.measurements.v1", "runs": [
  {"pp": 1, "tp": 1, "batch": 4, "variant": "standard", "tokens_per_s": 100, "tpot_ms": 40},
  {"pp": 2, "tp": 1, "batch": 4, "variant": "standard", "tokens_per_s": 120, "tpot_ms": 33}]}
JSON
check validate 0 'median \|error\|' -- \
  "$TRELLIS" plan --model smollm2-135m --cluster hosts=1,sockets=2 --validate "$TMP/runs.json"
# --sbatch: a Slurm batch script for the top pick (run for real on the emulated cluster by
# tests/multihost/slurm_2x2.sh). GPU cluster, all 16 GPUs in one replica: 2 nodes x 8 tasks.
check sbatch-gpu 0 'sbatch script for 1x[0-9]+x[0-9]+ .* written to' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --no-replicas --top 3 --sbatch "$TMP/gpu.sh"
sbatch_ok() {  # sbatch_ok NAME FILE LINE... : FILE is a bash script holding every LINE
  local name=$1 file=$2 l
  shift 2
  bash -n "$file" || { echo "FAIL $name: not valid bash"; fail=1; return; }
  for l in "$@"; do
    grep -qxF -- "$l" "$file" || { echo "FAIL $name: no line '$l' in"; cat "$file"; fail=1; return; }
  done
  echo "ok   $name"
}
sbatch_ok sbatch-gpu-lines "$TMP/gpu.sh" '#SBATCH --nodes=2' '#SBATCH --ntasks-per-node=8' '#SBATCH --gpus-per-task=1'
# The srun line runs the layout the table ranks first, on all 16 GPUs.
out=$("$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --no-replicas --top 1 --sbatch "$TMP/gpu.sh")
row=$(awk '$1 == "1" {print $2}' <<<"$out")
run=$(grep -oE 'srun --mpi=pmix "\$TRELLIS" run --model "\$MODEL" --pp [0-9]+ --tp [0-9]+' "$TMP/gpu.sh")
pp=$(awk '{print $8}' <<<"$run"); tp=$(awk '{print $10}' <<<"$run")
if [[ -n $run && $row == "1x${pp}x${tp}" && $((pp * tp)) == 16 ]]; then echo "ok   sbatch-gpu-pick ($row)"
else echo "FAIL sbatch-gpu-pick: table #1 '$row', script '$run'"; fail=1; fi
# CPU hosts (2 x 2 NUMA nodes x 4 cores): 2 tasks per node, 4 cores each, no GPUs.
check sbatch-cpu 0 'written to' -- "$TRELLIS" plan --model smollm2-135m --cluster hosts=2,sockets=2,cores=4 \
  --no-replicas --variants standard --sbatch "$TMP/cpu.sh"
sbatch_ok sbatch-cpu-lines "$TMP/cpu.sh" '#SBATCH --nodes=2' '#SBATCH --ntasks-per-node=2' '#SBATCH --cpus-per-task=4'
grep -q -- '--gpus-per-task' "$TMP/cpu.sh" && { echo "FAIL sbatch-cpu: --gpus-per-task on CPU hosts"; fail=1; }
# The script itself: a catalog model needs TRELLIS_MODEL; with it, srun gets the run line.
mkdir -p "$TMP/bin" "$TMP/ckpt"
printf '#!/bin/sh\necho "srun $*"\n' > "$TMP/bin/srun"; chmod +x "$TMP/bin/srun"
check sbatch-needs-model 2 'set TRELLIS_MODEL to smollm2-135m' -- env PATH="$TMP/bin:$PATH" bash "$TMP/cpu.sh"
check sbatch-srun 0 "^srun --mpi=pmix $TRELLIS run --model $TMP/ckpt --pp [0-9]+ --tp [0-9]+ --max-seqs [0-9]+ --workload n=[0-9]+,in=1024,out=512 --out trellis-.*\.jsonl$" -- \
  env PATH="$TMP/bin:$PATH" TRELLIS="$TRELLIS" TRELLIS_MODEL="$TMP/ckpt" SLURM_JOB_ID=7 bash "$TMP/cpu.sh"
# Data-parallel replicas become a job array, one replica per array task.
out=$("$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --top 1 --sbatch "$TMP/dp.sh")
d=$(grep -oE 'sbatch script for [0-9]+' <<<"$out" | awk '{print $4}')
if [[ -z $d ]]; then echo "FAIL sbatch-replicas: no sbatch line"; echo "$out"; fail=1
elif [[ $d -gt 1 ]]; then sbatch_ok "sbatch-replicas ($d)" "$TMP/dp.sh" "#SBATCH --array=0-$((d - 1))"
elif grep -q -- '--array' "$TMP/dp.sh"; then echo "FAIL sbatch-replicas: an array for 1 replica"; fail=1
else echo "ok   sbatch-replicas (1)"; fi
check sbatch-stdout 0 '^#!/bin/bash' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --sbatch -
"$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --sbatch - | grep -q 'why #1' && { echo "FAIL sbatch-stdout: table printed too"; fail=1; }
check sbatch-json-stdout 1 'both want stdout' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --sbatch - --json
exit $fail
