#!/usr/bin/env bash
# Exit codes and messages of the `trellis` command line, single process.
# Usage: cli_test.sh PATH/TO/trellis
set -u
T="$1"
fails=0
check() {  # check NAME EXPECTED_RC EXPECTED_TEXT -- CMD...
  local name=$1 want_rc=$2 want_text=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ]; then echo "FAIL $name: exit $rc, wanted $want_rc"; echo "$out" | head -20; fails=$((fails+1)); return; fi
  if [ -n "$want_text" ] && ! grep -qF -- "$want_text" <<<"$out"; then
    echo "FAIL $name: output lacks '$want_text'"; echo "$out" | head -20; fails=$((fails+1)); return; fi
  echo "ok   $name"
}
check "no command -> usage, 2"         2 "Usage: trellis"        -- "$T"
check "unknown command -> 2"           2 "frobnicate"            -- "$T" frobnicate
check "unknown flag -> 2"              2 "--bogus"               -- "$T" info --bogus
check "help -> 0"                      0 "info"                  -- "$T" --help
check "sub help lists flags"           0 "--config"              -- "$T" info --help
check "group help"                     0 "ring"                  -- "$T" bench --help
check "version"                        0 "0."                    -- "$T" --version
check "info prints libraries"          0 "UCX transports"        -- "$T" info
check "info names MPI"                 0 "Open MPI"              -- "$T" info
check "info --json parses"             0 '"ucx_resources"'       -- "$T" info --json
check "info --config lists settings"   0 "comm.deadline_ms"      -- "$T" info --config
check "env setting shows its source"   0 "environment"           -- env TRELLIS_DEADLINE_MS=1234 "$T" info --config
check "bad env value names variable"   2 "TRELLIS_DEADLINE_MS"   -- env TRELLIS_DEADLINE_MS=soon "$T" info
check "bad --set names setting"        2 "no.such"               -- "$T" --set no.such=1 info
check "bad log level"                  2 "loud"                  -- "$T" --log-level loud info
check "ring needs 2 ranks"             1 "at least 2 ranks"      -- "$T" bench ring
check "bad size flag names flag"       1 "--max-size"            -- "$T" bench ring --max-size 12parsecs
check "run --prompt prints the answer" 0 "answer:"              -- "$T" run --preset tiny --prompt "hello" --max-tokens 3
check "run --chat needs a prompt"      2 "--chat needs text prompts" -- "$T" run --preset tiny --chat
check "run --max-tokens must be > 0"   2 "--max-tokens"          -- "$T" run --preset tiny --prompt hi --max-tokens 0
check "run --preset-dtype bf16 loads"  0 "preset tiny (bf16)"    -- "$T" run --preset tiny --preset-dtype bf16 --prompt hi --max-tokens 2
check "run --preset-dtype unknown"     2 "--preset-dtype"        -- "$T" run --preset tiny --preset-dtype f8 --prompt hi
check "serve: bad port named"          2 "serve.port"            -- "$T" serve --preset tiny --port 70000
# Every numeric setting has a range, checked when it is set (flag, --set or environment):
# exit 2 and the range in the message (issue 23.5). Memory and time are capped so that a
# regression (threads until fork fails, a server that starts) fails here instead of hanging.
CAP=(timeout -s KILL 30 bash -c 'ulimit -v 4000000; exec "$@"' capped)
check "--set threads out of range"     2 "0..1024"               -- "${CAP[@]}" "$T" --set kernels.threads=100000 run --preset tiny --prompt hi --max-tokens 1
check "env threads out of range"       2 "TRELLIS_KERNEL_THREADS" -- env TRELLIS_KERNEL_THREADS=100000 "$T" info
check "--sampler-threads out of range" 2 "1..256"                -- "${CAP[@]}" "$T" run --preset tiny --prompt hi --max-tokens 1 --sampler-threads 100000
check "--max-seqs 0 refused"           2 "run.max_seqs"          -- "${CAP[@]}" "$T" run --preset tiny --prompt hi --max-seqs 0
check "--max-context 0 refused"        2 "run.max_context"       -- "${CAP[@]}" "$T" run --preset tiny --prompt hi --max-context 0
check "--kv-budget 0 refused"          2 "run.kv_budget"         -- "${CAP[@]}" "$T" run --preset tiny --prompt hi --kv-budget 0
check "serve.* settings have ranges"   2 "1..65536"              -- "${CAP[@]}" "$T" --set serve.max_connections=0 serve --preset tiny
check "serve --max-seqs 0 refused"     2 "run.max_seqs"          -- "${CAP[@]}" "$T" serve --preset tiny --max-seqs 0
check "--workload n is bounded"        2 "n must be in 1..1000000" -- "${CAP[@]}" "$T" run --preset tiny --workload n=100000000000000,in=1,out=1
check "info --config shows ranges"     0 "0..1024"               -- "$T" info --config
# Shared memory of a dead job (issue 23.6): `trellis info` lists a segment whose creator is
# gone; the next start of any other command removes it. The name follows core/shm_names.hpp:
# /trellis-<creator pid>-<pid namespace, hex>-<what>.
( exit 0 ) & dead=$!; wait $dead
ns=$(printf '%x' "$(stat -L -c %i /proc/self/ns/pid)")
leftover="trellis-$dead-$ns-clitest-$$"
: > "/dev/shm/$leftover"
check "info lists a dead job's segment" 0 "$leftover"            -- "$T" info
[ -e "/dev/shm/$leftover" ] && echo "ok   info leaves it in place" || { echo "FAIL info removed $leftover"; fails=$((fails+1)); }
check "run starts with a sweep"        0 "answer:"               -- "$T" run --preset tiny --prompt hi --max-tokens 1
if [ -e "/dev/shm/$leftover" ]; then echo "FAIL the run left $leftover of dead pid $dead"; rm -f "/dev/shm/$leftover"; fails=$((fails+1))
else echo "ok   the run removed the dead job's segment"; fi
# Slurm's variables without a Slurm (the real thing: tests/multihost/slurm_2x2.sh).
NOMPI=(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK -u PMI_SIZE -u PMI_FD SLURM_JOB_ID=7 SLURM_CLUSTER_NAME=c)
SRUN4=("${NOMPI[@]}" SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_NUM_NODES=2 SLURM_STEP_NODELIST="n[1-2]")
check "srun without PMI refused"       2 "without a process-management interface" -- "${SRUN4[@]}" SLURM_PROCID=0 "$T" info
out=$("${SRUN4[@]}" SLURM_PROCID=3 "$T" run --preset tiny --prompt hi 2>&1); rc=$?
if [ $rc = 2 ] && [ -z "$out" ]; then echo "ok   srun task 3 refuses silently"
else echo "FAIL srun task 3: exit $rc, output '$out'"; fails=$((fails+1)); fi
check "srun, one task, runs"           0 "srun without --mpi; Slurm job 7 step 0 on cluster c" -- \
  "${NOMPI[@]}" SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 "$T" info
check "sbatch script is not a step"    0 "not a job step" -- \
  "${NOMPI[@]}" SLURM_NTASKS=4 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST="n[1-2]" "$T" info
check "--json says its version"       0 '"trellis_version": "0.'   -- "$T" run --preset tiny --prompt hi --max-tokens 1 --json
check "topo --json says its version"   0 '"trellis_version"'     -- "$T" topo --synthetic hosts=1,gpus=2 --json
check "--prefill-chunk negative"       2 "run.prefill_chunk must be in 0.." -- "$T" run --preset tiny --prompt hi --prefill-chunk -1
check "--prefill-chunk not a number"   2 "'abc' is not an integer" -- "$T" run --preset tiny --prompt hi --prefill-chunk abc
check "--prefill-chunk over the limit" 1 "more than an iteration holds" -- "$T" run --preset tiny --prompt hi --prefill-chunk 5000
check "--prefill-chunk runs"           0 "prefill chunk 4"       -- "$T" run --preset tiny --workload n=2,in=10,out=3 --prefill-chunk 4
# verify-model: the first run writes the manifest, the second matches it, a flipped byte in
# the middle of the file (weights) is named, a missing manifest named with --manifest is 2.
VM=$(mktemp -d)
"$T" make-model --preset tiny --format gguf --dtype q8_0 --out "$VM" >/dev/null 2>&1
check "verify-model writes manifest"  0 "wrote manifest $VM/model.gguf.manifest.json" -- "$T" verify-model --model "$VM/model.gguf"
check "verify-model matches"          0 "ok: all"               -- "$T" verify-model --model "$VM/model.gguf"
/usr/bin/python3 - "$VM/model.gguf" <<'PY'
import os, sys
p = sys.argv[1]; n = os.path.getsize(p)
with open(p, "r+b") as f:
    f.seek(n // 2); b = f.read(1); f.seek(n // 2); f.write(bytes([b[0] ^ 0x20]))
PY
check "verify-model names the tensor" 1 "bytes differ (SHA-256 mismatch)" -- "$T" verify-model --model "$VM/model.gguf"
check "verify-model --json mismatch"  1 '"ok":false'            -- "$T" verify-model --model "$VM/model.gguf" --json
check "verify-model missing manifest" 2 "no such file"          -- "$T" verify-model --model "$VM/model.gguf" --manifest "$VM/none.json"
check "verify-model needs --model"    2 "--model PATH is required" -- "$T" verify-model
rm -rf "$VM"
# bench model's matmuls-alone line (the decode step's weight matrices timed alone): every
# matrix of the step is in it (4 per layer + the head), its bytes are the step's weights but the
# norms, a GGUF's types are kept apart, and --no-linears drops it. Timings are not checked.
BM=$(mktemp -d)
"$T" make-model --preset tiny --format gguf --dtype q4_1 --out "$BM/q" >/dev/null 2>&1
for args in "--preset tiny --workdir $BM" "--model $BM/q/model.gguf --weights native"; do
  if "$T" bench model $args --steps 3 --no-torch --read-size 1MiB --triad-size 1MiB --json 2>/dev/null |
     /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin); l = j["linears"]; t = l["by_type"]
assert sum(v["matrices"] for v in t.values()) == 4 * 4 + 1, t
assert 0.95 * j["decode_bytes_per_token"] < l["weight_bytes_per_token"] < j["decode_bytes_per_token"], l
assert abs(sum(v["bytes"] for v in t.values()) - l["weight_bytes_per_token"]) < 1, t
assert l["tokens_per_s"] > 0 and l["share_of_step"] > 0, l
assert j["quantized_weights"] == ("q4_1" in t), t
'; then echo "ok   bench model linears ($args)"; else echo "FAIL bench model linears ($args)"; fails=$((fails+1)); fi
done
check "bench model --no-linears"      0 ""                      -- "$T" bench model --preset tiny --workdir "$BM" --steps 2 --no-torch --read-size 1MiB --triad-size 1MiB --no-linears
if "$T" bench model --preset tiny --workdir "$BM" --steps 2 --no-torch --read-size 1MiB --triad-size 1MiB --no-linears | grep -q "matmuls alone"; then
  echo "FAIL bench model --no-linears still prints the matmuls"; fails=$((fails+1)); else echo "ok   bench model --no-linears drops the line"; fi
rm -rf "$BM"
if "$T" info --json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["world"]["size"]==1' ; then
  echo "ok   info --json is valid JSON"; else echo "FAIL info --json is not valid JSON"; fails=$((fails+1)); fi
echo "$fails failed"
[ "$fails" = 0 ]
