# Shared by the fault scripts (link_fault_dead_rank.sh, coll_fault_dead_rank.sh,
# link_fault_link_down.sh), sourced: a probe job runs in its own process group (setsid) and
# each rank writes its report, "ok ..." or "fail SECONDS ... MESSAGE", to $OUT/rank<r>.txt.

# stop_when_reported JOB OUT RANK...: waits (60 s at most) until every RANK has written its
# report or the job has ended, then stops the job's process group; returns the job's status.
stop_when_reported() {
  local job=$1 out=$2 all r
  shift 2
  for _ in $(seq 600); do
    all=1
    for r in "$@"; do [ -f "$out/rank$r.txt" ] || all=0; done
    [ $all = 1 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.2
  stop_job "$job" 0.3
}

# stop_job JOB GRACE: SIGTERM to the job's process group, SIGKILL after GRACE seconds.
stop_job() {
  kill -- -"$1" 2>/dev/null; sleep "$2"; kill -9 -- -"$1" 2>/dev/null
  wait "$1" 2>/dev/null
}

# failure_report OUT RANK: prints rank RANK's report and sets REPORT to it; returns 1, after
# a FAIL line, when the rank wrote none or did not fail.
failure_report() {
  local f="$1/rank$2.txt"
  REPORT=""
  [ -f "$f" ] || { echo "FAIL: rank $2 wrote no report (hung or killed)"; return 1; }
  REPORT=$(cat "$f")
  echo "rank $2: $REPORT"
  case "$REPORT" in fail*) return 0 ;; esac
  echo "FAIL: rank $2 did not fail"
  return 1
}

# within_deadline RANK SECONDS DEADLINE_MS SLACK_S: whether the failure came within the
# deadline plus scheduling slack (a loaded 2-core machine); a FAIL line when not.
within_deadline() {
  awk -v s="$2" -v d="$3" -v k="$4" 'BEGIN { exit !(s <= d / 1000 + k) }' && return 0
  echo "FAIL: rank $1 took ${2}s, deadline $3 ms"
  return 1
}
