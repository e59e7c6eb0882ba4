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
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --svg "$TMP/p.svg" --top 5 --variants all
grep -q '</svg>' "$TMP/p.svg" && grep -q 'ladder' "$TMP/p.svg" || { echo "FAIL svg"; fail=1; }
check json 0 '"ranked": \[' -- "$TRELLIS" plan --model llama-3.1-70b --cluster hosts=2,gpus=8,gpu=H100-SXM,nics=8x400g-ib --json --top 2
check appendix 0 'appendix model' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --sim-model appendix --top 2
check slo 0 'SLO +TPOT <= 20 ms' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 20 --top 2
# Defaults a user can run: the model as trained (standard), goodput under the default SLOs,
# and the mpirun line of the top pick; other variants only when asked, labelled.
out=$("$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --top 20)
rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /x/' <<<"$out")
if [[ -n $rows ]] && ! grep -qv ' standard ' <<<"$rows" && ! grep -q 'needs a model trained' <<<"$out" &&
   grep -q '^SLO      TPOT <= 50 ms, TTFT <= 2000 ms (defaults' <<<"$out" && grep -q '^objective goodput' <<<"$out"; then
  echo "ok   defaults-standard-goodput"
else echo "FAIL defaults-standard-goodput"; echo "$out" | head -20; fail=1; fi
# Every ranked row meets the default SLOs (TPOT column 9, TTFT column 10).
if awk '$1 ~ /^[0-9]+$/ && $2 ~ /x/ && ($9 > 50 || $10 > 2000) {bad=1} END {exit bad}' <<<"$rows"; then
  echo "ok   defaults-meet-slo"
else echo "FAIL defaults-meet-slo"; echo "$rows"; fail=1; fi
# The launch block runs the layout the table ranks first: mpirun -np p*t ... serve --pp P --tp T,
# with its prefill chunk (the default objective picks a chunked layout on this cluster).
row=$(awk '$1 == "1" {print $2, $5, $6}' <<<"$out")
read -r grid batch chunk <<<"$row"
IFS=x read -r d pp tp <<<"$grid"
[[ $chunk =~ ^[0-9]+$ ]] || { echo "FAIL launch-line: #1 is not chunked ('$chunk')"; fail=1; }
serve=$(grep -F "mpirun -np $((pp * tp)) --hostfile hosts.0 " <<<"$out" | grep -F ' trellis serve ')
if grep -qF "trellis serve --model \"\$TRELLIS_MODEL\" --pp $pp --tp $tp --max-seqs $batch --prefill-chunk $chunk --port 8000" <<<"$serve" &&
   grep -qE '^  node0 slots=[0-9]+' <<<"$out"; then echo "ok   launch-line ($grid)"
else echo "FAIL launch-line: #1 '$grid'"; echo "$out" | tail -12; fail=1; fi
out=$("$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --top 30 --variants all)
if grep -qE ' (ladder|desync4) .*\(needs a model trained for it\)$' <<<"$out" &&
   ! grep -qE ' standard .*needs a model trained' <<<"$out"; then echo "ok   variants-labelled"
else echo "FAIL variants-labelled"; echo "$out" | head -20; fail=1; fi
check throughput-no-default-slo 0 '^objective throughput' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --top 2 --objective throughput
"$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --top 2 --objective throughput | grep -q '^SLO' &&
  { echo "FAIL throughput-no-default-slo: an SLO line"; fail=1; }
check slo-negative 2 'slo-tpot-ms: must be >= 0 ms \(0 drops the SLO\)' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --slo-tpot-ms -3
check slo-zero-drops 0 '^SLO      TPOT <= 50 ms, TTFT <= - ' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --slo-ttft-ms 0 --top 1
check latency-objective 0 '^objective latency' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --top 2 --objective latency
check unknown-objective 1 "unknown objective 'fast'; valid: goodput, throughput, latency" -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --objective fast
# p = 1 has no pipeline bubble (the idle time between steps is host work, reported apart).
"$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --json --top 10 --objective throughput > "$TMP/p1.json"
if python3 - "$TMP/p1.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["ranked"] if r["pp"] == 1]
assert rows and all(r["decode_breakdown_ms"]["bubble"] == 0 for r in rows), rows
assert any(r["decode_breakdown_ms"]["host_gap"] > 0 for r in rows)
assert all("pipeline bubble" not in r["dominant"] for r in rows)
PY
then echo "ok   p1-no-bubble"; else echo "FAIL p1-no-bubble"; fail=1; fi
# A TP group spanning hosts is explained in one line (text) and in JSON.
check tp-across-hosts 0 '^TP across hosts: t=16 spans 2 hosts, so each all-reduce also crosses ib-ndr at 50.0 GB/s per rank.*best layout with TP inside a host, d=1 p=2 t=8' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 2x8xH100-NDR --no-replicas --objective throughput --batch 16,32 --top 2
"$TRELLIS" plan --model llama-3.1-405b --cluster 2x8xH100-NDR --no-replicas --objective throughput --batch 16,32 --json --top 1 > "$TMP/x.json"
if python3 - "$TMP/x.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
x = j["tp_across_hosts"]
assert j["ranked"][0]["tp"] == 16 and j["ranked"][0]["tp_hosts"] == 2
assert x["hosts"] == 2 and x["link"] == "ib-ndr" and x["link_GBps_per_rank"] == 50.0, x
assert 0 < x["inter_host_ms_per_step"] < x["decode_step_ms"], x
assert x["best_tp_inside_a_host"]["tp"] == 8 and x["best_tp_inside_a_host"]["tp_hosts"] == 1
assert x["explanation"].startswith("TP across hosts")
PY
then echo "ok   tp-across-hosts-json"; else echo "FAIL tp-across-hosts-json"; fail=1; fi
# Catalog: GB200 NVL72 (a 72-GPU NVLink domain over 18 trays) and H20 on RoCE 400G.
check nvl72 0 'NVLink domains of 72 GPUs \(18 hosts each\) over nvl72' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 1xNVL72 --top 3
check nvl72-tp-on-nvlink 0 '^ +1 +[0-9]+x1x8 .* nvl72$' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 1xNVL72 --top 1
check nvl72-attribute 0 'cluster  36 host\(s\) x 4 GB200.*NVLink domains of 72' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster hosts=36,gpus=4,gpu=GB200,nics=4x400g-roce,nvlink-domain=72 --top 1
check h20-roce 0 'cluster  2 host\(s\) x 8 H20, in-host nvlink4, fabric roce-400' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH20-ROCE400 --top 1
check nvlink-domain-bad 1 'nvlink-domain=12: must be a multiple of the 8 devices per host' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster hosts=2,gpus=8,nvlink-domain=12
# Prefill chunk: a plan dimension (a column, JSON, the launch line); bad values name the flag.
out=$("$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --top 40 --prefill-chunk 0,512 --batch 8)
if grep -qE '^ +[0-9]+ .* whole ' <<<"$out" && grep -qE '^ +[0-9]+ .* 512 ' <<<"$out" &&
   grep -qE '^ +# d x p x t +m variant +batch chunk ' <<<"$out"; then echo "ok   prefill-chunk-column"
else echo "FAIL prefill-chunk-column"; echo "$out" | head -20; fail=1; fi
"$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100-NDR --json --top 3 --prefill-chunk 0,256 > "$TMP/c.json"
if python3 - "$TMP/c.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["ranked"]
assert rows and all(r["prefill_chunk"] in (0, 256) and r["prefill"]["chunk"] == r["prefill_chunk"] for r in rows), rows
for r in rows:
    p = r["prefill"]
    if r["prefill_chunk"]:
        assert p["iterations"] == 4 and 0 < p["chunk_share"] <= 1 and p["tpot_interference_ms"] > 0, p
    else:
        assert p["microbatches"] >= 1 and p["iterations"] == 1, p
PY
then echo "ok   prefill-chunk-json"; else echo "FAIL prefill-chunk-json"; fail=1; fi
check prefill-chunk-negative 1 '--prefill-chunk -256: must be >= 0 tokens \(0: whole prompts\)' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --prefill-chunk 0,-256
check prefill-chunk-not-integer 1 "--prefill-chunk '512,1.5': '1.5' is not a whole number of tokens" -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --prefill-chunk 512,1.5
check prefill-chunk-beyond-context 1 '--prefill-chunk 200000: longer than the context of llama-3.1-8b \(131072 tokens\)' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --prefill-chunk 200000
# Precision: fp8 where the GPU has FP8 tensor cores.
check fp8-column 0 '^ +1 .* fp8 ' -- "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH20 --dtype all --top 3
check fp8-no-tensor-cores 1 '--dtype fp8: A100-SXM has no FP8 tensor cores; devices that have them: H100-SXM' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xA100 --dtype fp8
# Bad input names the valid choices.
check unknown-fabric 1 "unknown fabric 'FOO' in cluster '2x8xH100-FOO'; valid fabrics: hdr, ndr, roce100" -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 2x8xH100-FOO
check unknown-spec-gpu 1 "unknown gpu 'TPU'; valid GPUs: .*H20" -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster hosts=2,gpus=8,gpu=TPU
check unknown-spec-key 1 "unknown key 'foo'; valid keys: hosts .* nvlink-domain" -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster hosts=2,gpus=8,foo=1
# Experts and MLA are modelled (issue 21 item 3): a config with experts is planned with an ep
# column; a field about experts or routing the planner does not know is refused by name.
mkdir -p "$TMP/moe" "$TMP/moe-unknown"
echo '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100, "num_local_experts": 8, "num_experts_per_tok": 2}' > "$TMP/moe/config.json"
check moe-planned 0 '^ +# d x p x t +m +ep variant' -- "$TRELLIS" plan --model "$TMP/moe" --cluster 1x8xH100 --top 3
echo '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100, "num_local_experts": 8, "num_experts_per_tok": 2, "expert_capacity_factor": 1.25}' > "$TMP/moe-unknown/config.json"
check moe-unknown-field-refused 1 "field 'expert_capacity_factor' \(experts, routing or latent attention\) is not modelled" -- \
  "$TRELLIS" plan --model "$TMP/moe-unknown" --cluster 1x8xH100
# DeepSeek-V3 on 2x8 H100: fp8 fits with expert parallelism (ep > 1 in the table and the
# JSON), bf16 does not fit at all.
check moe-deepseek-fp8-ep 0 '^ +1 +[0-9]+x[0-9]+x[0-9]+ +[0-9]+ +([2-9]|[1-9][0-9]+) standard +fp8 .*, EP ' -- \
  "$TRELLIS" plan --model deepseek-v3 --cluster 2x8xH100-NDR --dtype fp8 --top 3
check moe-deepseek-json-ep 0 '"ep": ([2-9]|[1-9][0-9]+),' -- \
  "$TRELLIS" plan --model deepseek-v3 --cluster 2x8xH100-NDR --dtype fp8 --top 3 --json
check moe-deepseek-bf16-memory 1 'binding constraint is device memory' -- \
  "$TRELLIS" plan --model deepseek-v3 --cluster 2x8xH100-NDR --dtype bf16 --top 3
mkdir -p "$TMP/neox"
echo '{"num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 8, "vocab_size": 1000, "use_parallel_residual": true}' > "$TMP/neox/config.json"
out=$("$TRELLIS" plan --model "$TMP/neox" --cluster 1x8xH100 --top 5)
if grep -q 'trained as parallel (config: use_parallel_residual)' <<<"$out" && grep -qE '^ +1 .* parallel ' <<<"$out" &&
   grep -q -- '--variant parallel' <<<"$out" && ! grep -q 'needs a model trained' <<<"$out"; then
  echo "ok   parallel-trained"
else echo "FAIL parallel-trained"; echo "$out"; fail=1; fi
check unknown-model 1 'valid models: .*llama-3.1-70b' -- "$TRELLIS" plan --model llama-9 --cluster 2x8xH100
check unknown-cluster 1 'unknown cluster .*2x8xH100-NDR.*H100-SXM' -- "$TRELLIS" plan --model llama-3.1-8b --cluster bogus
check unknown-gpu 1 'valid devices: .*B200' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --gpu TPU
check unknown-variant 1 'valid( variants)?: standard' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --variants turbo
check nothing-fits 1 'no feasible configuration: binding constraint is device memory.*GiB' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 1x2xH100
check slo-impossible 1 'no feasible configuration: binding constraint is the latency SLO' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 0.1
# ... with the best infeasible plans and how far each misses.
check slo-closest 1 'closest misses, one per grid.*' -- \
  "$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 5
out=$("$TRELLIS" plan --model llama-3.1-70b --cluster 2x8xH100 --slo-tpot-ms 5 --top 3)
if [[ $(grep -cE '^ +[0-9]+ .*TPOT [0-9.]+ ms > SLO 5.00 ms \(\+[0-9]+%\)$' <<<"$out") == 3 ]]; then echo "ok   slo-closest-rows"
else echo "FAIL slo-closest-rows"; echo "$out"; fail=1; fi
check memory-closest 1 '1 +1x1x2 .*memory: needs 379.9 GiB per device > 76.0 GiB usable \(\+400%\)' -- \
  "$TRELLIS" plan --model llama-3.1-405b --cluster 1x2xH100
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
check sbatch-srun 0 "^srun --mpi=pmix $TRELLIS run --model $TMP/ckpt --pp [0-9]+ --tp [0-9]+ --max-seqs [0-9]+( --prefill-chunk [0-9]+)? --workload n=[0-9]+,in=1024,out=512 --out trellis-.*\.jsonl$" -- \
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
# SWIFT (Eq. 6 estimate): said in the header and the JSON, the run line drafts, bad values
# are refused with the flag named.
check swift-text 0 'SWIFT decode: estimate from Eq\. \(6\) with M=2\.19, α=0\.87, r=0\.20 \(not measured on this cluster\)' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --swift --top 2
check swift-run-line 0 'trellis run --model .* --swift --workload' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --swift-m 4 --top 1
check swift-json 0 '"measured": false' -- "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --swift-alpha 0.95 --json --top 1
check swift-bad-alpha 1 '--swift-alpha: the acceptance rate must be in \(0, 1\] \(got 1.5\)' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --swift-alpha 1.5
check swift-bad-m 1 '--swift-m: the mean generated length M must be >= 1' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --swift --swift-m 0.5
check swift-bad-r 1 '--swift-r: .* is not a finite number' -- \
  "$TRELLIS" plan --model llama-3.1-8b --cluster 1x8xH100 --swift-r abc
# --layer-split auto plans the split trellis run --layer-split auto makes (Llama-3.2-1B on two
# stages: 10 | 6 + head) and says so on the launch line; the default is trellis run's even split.
for split in even auto; do
  "$TRELLIS" plan --model llama-3.2-1b --cluster 1x2xH100 --no-replicas --objective throughput --batch 64 \
    --layer-split $split --json --top 20 > "$TMP/split-$split.json"
done
if python3 - "$TMP/split-even.json" "$TMP/split-auto.json" <<'PY'
import json, sys
for path, want in ((sys.argv[1], [8, 8]), (sys.argv[2], [10, 6])):
    rows = [r for r in json.load(open(path))["ranked"] if r["pp"] == 2]
    assert rows and all(r["layers_per_stage"] == want for r in rows), (path, [r["layers_per_stage"] for r in rows])
PY
then echo "ok   layer-split"; else echo "FAIL layer-split"; fail=1; fi
check layer-split-bad 2 '--layer-split: balanced not in \{even,auto\}' -- "$TRELLIS" plan --model llama-3.2-1b --cluster 1x2xH100 --layer-split balanced
exit $fail
