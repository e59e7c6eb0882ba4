#!/usr/bin/env bash
# Faults of `trellis run` under mpirun (4 ranks, pp=2 x tp=2):
#  1. kill -9 of rank 2 mid-run: the job exits non-zero within the deadline and the output
#     names rank 2; under --enable-recovery (survivors left alive by mpirun) the first
#     report of trellis's own names the dead rank, for ranks 1, 2 and 3;
#  1a. --enable-recovery is refused with the reason unless comm.allow_mpi_recovery is set;
#  1c. --out keeps the answers that finished before a rank died (written as they end);
#  1e. a full disk under --out keeps whole lines and fails nothing (root only);
#  1d. a SIGSTOPped rank (hung, alive) is the one the first report names, for ranks 1-3;
#  2. SIGINT to mpirun (Ctrl-C): every rank stops cleanly (summary printed, "stopped
#     cleanly", nobody killed), well before the run would have ended.
#   run_faults.sh TRELLIS MPIEXEC [MPI FLAGS...]
set -u
T=$1; shift
MPI=("$@")
W=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
export TRELLIS_KERNEL_THREADS=1 TRELLIS_LOG_LEVEL=info
fail() { echo "FAIL: $*"; [ -f "$W/log" ] && tail -40 "$W/log"; exit 1; }
# Long enough (tens of seconds on an idle 2-core machine) that SIGINT arrives mid-run.
LONG=(run --pp 2 --tp 2 --workload n=1024,in=16,out=480 --max-context 512)

# Waits until rank 0 says generation started (the log line printed just before it).
wait_started() {
  for _ in $(seq 1 600); do
    grep -q "trellis run: pp=2" "$W/log" 2>/dev/null && { sleep 1; return 0; }
    kill -0 "$PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# The pid of world rank $1 among mpirun's children (Open MPI puts the rank in the environment).
rank_pid() {
  for p in $(pgrep -P "$PID"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}

# 1. A rank dies.
: > "$W/log"  # now, not in the launched child: wait_started must not see the last run's log
"${MPI[@]}" -np 4 "$T" --set comm.deadline_ms=5000 "${LONG[@]}" > "$W/log" 2>&1 &
PID=$!
wait_started || fail "the run did not start"
victim=$(rank_pid 2)
[ -n "$victim" ] || fail "cannot find rank 2's process"
start=$(date +%s)
kill -9 "$victim"
for _ in $(seq 1 300); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID" 2>/dev/null && fail "the job still runs 30 s after rank 2 died"
wait "$PID"; rc=$?; PID=
took=$(( $(date +%s) - start ))
[ "$rc" != 0 ] || fail "the job exited 0 after rank 2 died"
grep -qiE "rank 2|process rank 2" "$W/log" || fail "nothing names rank 2"
echo "ok: rank 2 killed -> job exited $rc after ${took}s naming rank 2"

# 1a. --enable-recovery is refused before anything starts (issue 20.2: after a rank died the
# survivors named it and exited, and mpirun then waited for ever), with the reason, once.
# (Under --enable-recovery mpirun itself exits 0 whatever its ranks do, MPI_Abort included,
# so the ranks' refusal and that nothing ran are what can be checked.)
out=$(timeout 60 "${MPI[@]}" -np 2 --enable-recovery "$T" run --preset tiny --prompt hi 2>&1 </dev/null); rc=$?
[ "$rc" != 124 ] || fail "--enable-recovery: the job hung"
[ "$(grep -c "mpirun --enable-recovery keeps the job running" <<<"$out")" = 1 ] ||
  fail "the refusal of --enable-recovery is not said exactly once: $out"
grep -q "requests:" <<<"$out" && fail "--enable-recovery was refused but the run went on: $out"
echo "ok: mpirun --enable-recovery refused with the reason, nothing ran (mpirun exit $rc)"

# 1b. The same with --enable-recovery (allowed with comm.allow_mpi_recovery), so that mpirun does not kill the survivors first: then
# trellis's own detection must fail the job, and its first report must name the dead rank
# (the shm link, the shm all-reduce group and the channel notice a dead pid within ~100 ms;
# deadline 5 s). Rank 1 dies in stage 0's TP group, 2 is the sampler, 3 is in stage 1's.
for v in 1 2 3; do
  : > "$W/log"  # now, not in the launched child: wait_started must not see the last run's log
  "${MPI[@]}" -np 4 --enable-recovery "$T" --set comm.allow_mpi_recovery=true --set comm.deadline_ms=5000 "${LONG[@]}" > "$W/log" 2>&1 &
  PID=$!
  wait_started || fail "the run did not start"
  victim=$(rank_pid $v)
  [ -n "$victim" ] || fail "cannot find rank $v's process"
  start=$(date +%s)
  kill -9 "$victim"
  for _ in $(seq 1 300); do grep -q "\[critical\]" "$W/log" && break; sleep 0.1; done
  first=$(grep -m1 "\[critical\]" "$W/log")
  took=$(( $(date +%s) - start ))
  # Evidence for a miss: which of mpirun's children carried which rank, and whether the
  # victim outlived its SIGKILL (a flake seen once in CI: the run finished with every rank).
  ranks_now=$(for p in $(pgrep -P "$PID"); do echo "$p:$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')"; done | tr '\n' ' ')
  victim_alive=no; kill -0 "$victim" 2>/dev/null && victim_alive="yes ($(ps -o stat=,comm= -p "$victim" 2>/dev/null))"
  kill -9 "$PID" 2>/dev/null; pkill -9 -P "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=
  [ -n "$first" ] || fail "no rank reported the death of rank $v within 30 s (killed pid $victim; still alive: $victim_alive; mpirun's children pid:rank now: ${ranks_now:-none})"
  grep -q "rank $v (pid" <<<"$first" || fail "the first report does not name rank $v as dead: $first"
  echo "ok: with --enable-recovery, the first report (${took}s) names rank $v: $first"
done

# 1d. A hung rank (SIGSTOP: alive, answers nothing) is the one blamed (issue 20.3): its
# host-mates' watchdogs see it stopped and fail the job at half the deadline, before any
# wait on a live rank gives up and blames that one. Ranks 1, 2 and 3, deadline 4 s.
for v in 1 2 3; do
  : > "$W/log"  # now, not in the launched child: wait_started must not see the last run's log
  "${MPI[@]}" -np 4 "$T" --set comm.deadline_ms=4000 "${LONG[@]}" > "$W/log" 2>&1 &
  PID=$!
  wait_started || fail "the run did not start"
  victim=$(rank_pid $v)
  [ -n "$victim" ] || fail "cannot find rank $v's process"
  start=$(date +%s)
  kill -STOP "$victim"
  for _ in $(seq 1 300); do grep -q "\[critical\]" "$W/log" && break; sleep 0.1; done
  first=$(grep -m1 "\[critical\]" "$W/log")
  took=$(( $(date +%s) - start ))
  kill -CONT "$victim" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$PID" 2>/dev/null; pkill -9 -P "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=
  [ -n "$first" ] || fail "no rank reported the stopped rank $v within 30 s"
  grep -q "rank $v (pid [0-9]*, same host) has been stopped" <<<"$first" ||
    fail "the first report does not name rank $v as stopped: $first"
  echo "ok: rank $v stopped -> the first report (${took}s) names it: $first"
done

# 1c. Answers that finished before a rank died stay in --out (issue 23.7): each request's
# line is written and flushed as it ends, not when the run ends, and rank 0 says how many
# it wrote. --enable-recovery keeps rank 0 alive to say so (plain mpirun kills it at once).
: > "$W/log"  # now, not in the launched child: wait_started must not see the last run's log
# 200000 requests of 8 + 48 tokens: minutes of work, so the run cannot end before the kill
# lands (with out=8 it took ~40 s on an idle 2-core machine, and one CI rehearsal under load
# saw rank 0 finish the run and fail only in the collectives after it, with nothing to report).
"${MPI[@]}" -np 4 --enable-recovery "$T" --set comm.allow_mpi_recovery=true --set comm.deadline_ms=5000 run --pp 2 --tp 2 \
  --workload n=200000,in=8,out=48 --max-context 64 --out "$W/out.jsonl" > "$W/log" 2>&1 &
PID=$!
wait_started || fail "the run did not start"
lines() { if [ -f "$W/out.jsonl" ]; then wc -l < "$W/out.jsonl"; else echo 0; fi; }
for _ in $(seq 1 300); do [ "$(lines)" -ge 8 ] && break; kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
[ "$(lines)" -ge 8 ] || fail "no answer in --out 30 s into the run: it is written only at the end"
victim=$(rank_pid 3)
[ -n "$victim" ] || fail "cannot find rank 3's process"
kill -9 "$victim"
for _ in $(seq 1 300); do grep -q "before the run failed" "$W/log" && break; kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
sleep 0.5
kill -9 "$PID" 2>/dev/null; pkill -9 -P "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=
said=$(grep -o "[0-9]* of 200000 requests were written before the run failed" "$W/log" | head -1)
[ -n "$said" ] || fail "rank 0 did not say how many answers it wrote"
n=$(lines)
[ "${said%% *}" = "$n" ] || fail "rank 0 says '$said' but --out has $n lines"
/usr/bin/python3 - "$W/out.jsonl" <<'PY' || fail "--out holds a line that is not a whole answer"
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    assert j["status"] == "ok" and len(j["tokens"]) == 48, line
PY
echo "ok: rank 3 killed after $n answers -> all $n are in --out, and rank 0 said so"

# 1e. A full disk under --out (root: a 32 KiB tmpfs): the run still completes with its
# summary and exit 0, the file keeps only whole lines (the answers written before it filled,
# as many as rank 0 says), and no FILE.tmp is left behind (the fault suite found the final
# in-order rewrite failing the finished run and leaving both).
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$W/full" && mount -t tmpfs -o size=32k tmpfs "$W/full" || fail "cannot mount a tmpfs"
  "$T" run --preset tiny --workload n=400,in=8,out=8 --out "$W/full/out.jsonl" > "$W/log" 2>&1; rc=$?
  said=$(grep -o "holds the [0-9]* answers written before writing failed" "$W/log" | grep -o "[0-9]*")
  n=$(/usr/bin/python3 -c 'import json,sys; print(sum(1 for l in open(sys.argv[1]) if json.loads(l)))' "$W/full/out.jsonl" 2>/dev/null)
  left=$(ls "$W/full")
  umount "$W/full"
  [ "$rc" = 0 ] || fail "a full --out disk failed the run (exit $rc)"
  grep -q "requests: 400 finished" "$W/log" || fail "no summary after the disk filled"
  [ -n "$said" ] && [ "$said" = "$n" ] || fail "--out holds '$n' whole lines, rank 0 says '$said' (or a partial line)"
  [ "$left" = out.jsonl ] || fail "left behind on the full disk: $left"
  echo "ok: --out on a full disk -> run completed (exit 0), $n whole answers kept, nothing else left"
fi

# 2. Ctrl-C.
: > "$W/log"  # now, not in the launched child: wait_started must not see the last run's log
"${MPI[@]}" -np 4 "$T" "${LONG[@]}" > "$W/log" 2>&1 &
PID=$!
wait_started || fail "the run did not start"
start=$(date +%s)
kill -INT "$PID"
for _ in $(seq 1 300); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID" 2>/dev/null && fail "the job still runs 30 s after SIGINT"
wait "$PID"; rc=$?; PID=
grep -q "every rank stopped cleanly" "$W/log" || fail "no clean stop after SIGINT (exit $rc)"
grep -q "interrupted before it finished" "$W/log" || fail "the summary does not list the interrupted requests"
grep -qiE "killed|critical" "$W/log" && fail "a rank was killed or failed after SIGINT"
echo "ok: SIGINT -> every rank stopped cleanly in $(( $(date +%s) - start ))s (exit $rc)"
echo PASS
