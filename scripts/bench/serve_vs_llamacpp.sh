#!/usr/bin/env bash
# trellis serve beside llama.cpp's server (llama-cpp-python), same GGUF, same prompts, same
# machine, same greedy sampling (temperature 0): scripts/bench-serve against each server at
# several Poisson request rates, then one Markdown table (throughput, TTFT and TPOT p50/p99,
# goodput under --goodput SLOs). Servers run one at a time, each alone on the machine.
#
# Usage: scripts/bench/serve_vs_llamacpp.sh [options]
#   --model GGUF          default: TRELLIS_SMOLLM2_GGUF from ~/.cache/trellis/models.env
#   --trellis PATH        default build/release/launchers/trellis
#   --layouts "1x1 2x1"   trellis layouts PPxTP (default "1x1 2x1"; PP*TP ranks under mpirun)
#   --prefill-chunks "0 128"  trellis --prefill-chunk values, each layout with each (default "0")
#   --dataset FILE        prompts JSONL (default scripts/bench/serve_prompts.jsonl)
#   --long-prompts        the dataset mixes short chat prompts with long ones (every other
#                         request asks to summarise 300-600 tokens of a text from
#                         /usr/share/common-licenses), the load where chunked prefill matters
#   --rates "0.5 1 2 4 inf"  request rates (req/s; inf = all at once)
#   --num-prompts N       requests per rate (default 32)
#   --max-tokens N        per request (default 64)
#   --goodput "ttft:1000 tpot:100"  SLOs in ms for goodput (default as shown)
#   --threads N           llama.cpp threads (default: all cores, nproc)
#   --llama-chat-format F llama.cpp --chat_format (default: the GGUF's own template, as trellis)
#   --no-llamacpp         trellis only;  --no-trellis  llama.cpp only
#   --port P              first port (default 8400)
#   --out DIR             results (default out/serve-bench): per run .json and .txt, server logs,
#                         table.md
# Needs the project venv (scripts/setup-peers: llama-cpp-python[server], openai/httpx).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/trellis
py=${TRELLIS_PEER_PYTHON:-$cache/venv/bin/python}

model="" trellis=$repo/build/release/launchers/trellis layouts="1x1 2x1" rates="0.5 1 2 4 inf"
num_prompts=32 max_tokens=64 chunks="0" dataset=$repo/scripts/bench/serve_prompts.jsonl long_prompts=0 goodput="ttft:1000 tpot:100" threads=$(nproc) chat_format=""
run_llama=1 run_trellis=1 port=8400 out=$repo/out/serve-bench

die() { echo "serve_vs_llamacpp: $*" >&2; exit 1; }
need_arg() { if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value"; fi; }
while [ $# -gt 0 ]; do
  case $1 in
    --model) need_arg "$@"; model=$2; shift 2 ;;
    --trellis) need_arg "$@"; trellis=$2; shift 2 ;;
    --layouts) need_arg "$@"; layouts=$2; shift 2 ;;
    --prefill-chunks) need_arg "$@"; chunks=$2; shift 2 ;;
    --dataset) need_arg "$@"; dataset=$2; shift 2 ;;
    --long-prompts) long_prompts=1; shift ;;
    --rates) need_arg "$@"; rates=$2; shift 2 ;;
    --num-prompts) need_arg "$@"; num_prompts=$2; shift 2 ;;
    --max-tokens) need_arg "$@"; max_tokens=$2; shift 2 ;;
    --goodput) need_arg "$@"; goodput=$2; shift 2 ;;
    --threads) need_arg "$@"; threads=$2; shift 2 ;;
    --llama-chat-format) need_arg "$@"; chat_format=$2; shift 2 ;;
    --no-llamacpp) run_llama=0; shift ;;
    --no-trellis) run_trellis=0; shift ;;
    --port) need_arg "$@"; port=$2; shift 2 ;;
    --out) need_arg "$@"; out=$2; shift 2 ;;
    -h|--help) sed -n 2,28p "$0"; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done

# --- validate inputs ---------------------------------------------------------------------
for v in num_prompts max_tokens threads port; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a positive integer, got '${!v}'"
done
for r in $rates; do
  [[ $r == inf || $r =~ ^[0-9]*\.?[0-9]+$ ]] || die "--rates: '$r' is not a number or inf"
done
for l in $layouts; do
  [[ $l =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "--layouts: '$l' is not PPxTP (e.g. 2x1)"
done
for c in $chunks; do
  [[ $c =~ ^[0-9]+$ ]] || die "--prefill-chunks: '$c' is not a non-negative integer"
done
[ -f "$dataset" ] || die "--dataset $dataset: no such file"
if [ -z "$model" ] && [ -f "$cache/models.env" ]; then
  model=$(sed -n 's/^TRELLIS_SMOLLM2_GGUF=//p' "$cache/models.env" | head -1)
fi
[ -n "$model" ] || die "no model: give --model GGUF or run scripts/setup-models"
[ -f "$model" ] || die "--model $model: no such file"
[ -x "$py" ] || die "no venv python at $py: run scripts/setup-peers"
"$py" -c "import httpx" 2>/dev/null || "$py" -c "import httpx2" 2>/dev/null ||
  die "$py lacks httpx/httpx2 (scripts/setup-peers installs openai, which brings it)"
if [ $run_llama = 1 ]; then
  "$py" -c "import llama_cpp.server" 2>/dev/null ||
    die "$py lacks llama-cpp-python[server] (scripts/setup-peers; or --no-llamacpp)"
fi
if [ $run_trellis = 1 ]; then
  [ -x "$trellis" ] || die "--trellis $trellis: not built (scripts/build release)"
fi
mkdir -p "$out"
rm -f "$out"/*.json
if [ $long_prompts = 1 ]; then
  # Every other request: summarise a 1,500-3,000 character span of a licence text (300-600
  # SmolLM2 tokens); the others are the short chat prompts of --dataset.
  "$py" - "$dataset" "$out/long_prompts.jsonl" <<'PY' || die "could not build the long-prompt dataset"
import glob, json, random, sys
short = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
texts = [open(f, errors="replace").read() for f in sorted(glob.glob("/usr/share/common-licenses/*"))
         if not f.endswith(".gz")]
texts = [t for t in texts if len(t) > 4000]
if not texts: sys.exit("no licence texts over 4000 characters in /usr/share/common-licenses")
rng = random.Random(0)
with open(sys.argv[2], "w") as out:
    for i in range(64):
        if i % 2 == 0:
            t = texts[i // 2 % len(texts)]
            n = rng.randint(1500, 3000)
            at = rng.randint(0, len(t) - n)
            out.write(json.dumps({"text": "Summarise this text in two sentences:\n\n" + t[at:at + n]}) + "\n")
        else:
            out.write(json.dumps(short[i // 2 % len(short)]) + "\n")
PY
  dataset=$out/long_prompts.jsonl
fi

# --- servers -----------------------------------------------------------------------------
server_pid="" server_kids=""
stop_server() {
  [ -n "$server_pid" ] || return 0
  # SIGTERM to the ranks (mpirun's children; a SIGTERM to Open MPI's mpirun ends the job
  # with status 1 and kills ranks that take over a second to drain) or to the server itself.
  server_kids=$(pgrep -P "$server_pid" || true)
  # shellcheck disable=SC2086
  if [ -n "$server_kids" ]; then kill -TERM $server_kids 2>/dev/null || true
  else kill -TERM "$server_pid" 2>/dev/null || true; fi
  for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
  # shellcheck disable=SC2086
  kill -KILL -- "-$server_pid" $server_kids 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid="" server_kids=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# start_server NAME READY_PATH CMD... : in its own session, log in $out/NAME.log; waits up to
# 300 s for GET READY_PATH to answer 200.
start_server() {
  local name=$1 ready=$2; shift 2
  echo "== $name: $*"
  setsid "$@" >>"$out/$name.log" 2>&1 </dev/null &
  server_pid=$!
  local deadline=$((SECONDS + 300))
  until curl -sf -o /dev/null "http://127.0.0.1:$port$ready"; do
    kill -0 "$server_pid" 2>/dev/null || { tail -20 "$out/$name.log" >&2; die "$name exited before it was ready"; }
    [ $SECONDS -lt $deadline ] || { tail -20 "$out/$name.log" >&2; die "$name not ready within 300 s"; }
    sleep 0.5
  done
}

# server_cmd NAME: sets `cmd` (the command line, on $port) and `ready` (the path that answers
# 200 once it can serve) for "llama.cpp" or "trellis-ppPtpT".
server_cmd() {
  case $1 in
    llama.cpp)
      # --interrupt_requests False: by default llama-cpp-python cancels the running request
      # when a new one arrives; queue them instead, as a server under load must.
      cmd=("$py" -m llama_cpp.server --model "$model" --host 127.0.0.1 --port "$port" --n_ctx 2048
           --n_threads "$threads" --n_threads_batch "$threads" --interrupt_requests False --verbose False)
      [ -n "$chat_format" ] && cmd+=(--chat_format "$chat_format")
      ready=/v1/models ;;
    trellis-pp*)
      local spec=${1#trellis-pp} chunk=0
      [[ $spec == *-chunk* ]] && { chunk=${spec##*-chunk}; spec=${spec%-chunk*}; }
      local pp=${spec%tp*} tp=${spec##*tp}
      cmd=("$trellis" serve --model "$model" --port "$port" --max-context 2048 --prefill-chunk "$chunk")
      if [ $((pp * tp)) -gt 1 ]; then
        cmd=("$repo/scripts/mpirun-local" -np $((pp * tp)) "${cmd[@]}" --pp "$pp" --tp "$tp")
      fi
      cmd=(env -u TRELLIS_API_KEY "${cmd[@]}")
      ready=/health ;;
  esac
}

names=()
[ $run_llama = 1 ] && names+=(llama.cpp)
if [ $run_trellis = 1 ]; then
  for l in $layouts; do
    for c in $chunks; do
      if [ "$c" = 0 ]; then names+=("trellis-pp${l%x*}tp${l#*x}"); else names+=("trellis-pp${l%x*}tp${l#*x}-chunk$c"); fi
    done
  done
fi
[ ${#names[@]} -gt 0 ] || die "nothing to run (--no-llamacpp and --no-trellis)"
rm -f "$out"/*.log

# Rates outside, servers inside, a fresh server for every run: whatever else the machine
# does at the time falls on all servers alike, and no idle server competes for the cores.
for r in $rates; do
  for name in "${names[@]}"; do
    server_cmd "$name"
    start_server "$name" "$ready" "${cmd[@]}"
    echo "-- $name at $r req/s"
    # shellcheck disable=SC2086
    "$py" "$repo/scripts/bench/bench_serve.py" --base-url "http://127.0.0.1:$port" \
      --dataset "$dataset" --num-prompts "$num_prompts" --request-rate "$r" --max-tokens "$max_tokens" --temperature 0 \
      --seed 0 --goodput $goodput --label "$name" --save-result "$out/$name-rate$r.json" \
      | tee "$out/$name-rate$r.txt" | sed -n '/Successful requests/p;/Output token throughput/p;/Median TTFT/p;/Median TPOT/p;/goodput/p'
    stop_server
    port=$((port + 1))
  done
done

echo
echo "GGUF $(basename "$model"), $num_prompts prompts per rate from $(basename "$dataset")," \
     "max_tokens $max_tokens, temperature 0, $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -1))" \
     | tee "$out/table.md"
echo | tee -a "$out/table.md"
"$py" "$repo/scripts/bench/serve_table.py" "$out"/*.json | tee -a "$out/table.md"
echo "results in $out"
