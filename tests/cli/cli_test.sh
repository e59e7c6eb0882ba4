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
if "$T" info --json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["world"]["size"]==1' ; then
  echo "ok   info --json is valid JSON"; else echo "FAIL info --json is not valid JSON"; fails=$((fails+1)); fi
echo "$fails failed"
[ "$fails" = 0 ]
