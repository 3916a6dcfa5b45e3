#!/usr/bin/env bash
# ctitan launch, the supervisor (issue 16), on this host: bad input and the restart limit end
# with a clear message and a non-zero exit; a job whose rank announced an abort is ended as a
# whole even when mpiexec would keep waiting (the cut-link case, played here by ranks that
# ignore SIGTERM); a stopped supervisor ends its job; nothing is left running after any of it.
# (Hosts, links and resumed training: tests/multihost.sh and tests/faults.sh.)
#   tests/launch.sh build/ctitan
set -u
bin=$(readlink -f "$1")
src=${CT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
test_comm=$(dirname "$bin")/test_comm
. "$src/tests/lib.sh"
mark=ctlaunch$$ # in every job's command line here: what is left behind carries it
left() { pgrep -f -- "$mark" | wc -l; }
has() { grep -q -- "$2" "$1" || { echo "  '$2' missing from $1:"; tail -5 "$1"; return 1; }; }
launch() { # LOG ARGS...: ctitan launch with a time limit; sets rc
  local log=$1
  shift
  timeout 120 "$bin" launch "$@" > "$log" 2>&1
  rc=$?
}
printf "localhost slots=2\n" > "$tmp/one-host"

# 1. the restart limit: every attempt fails; two attempts, then a clear message and its exit
launch "$tmp/limit.log" -n 2 --nnodes 1:1 --max-restarts 1 -- sh -c 'exit 3' "$mark"
[ $rc -eq 3 ] && [ "$(grep -c "attempt [0-9]*: 2 ranks" "$tmp/limit.log")" -eq 2 ] &&
  has "$tmp/limit.log" "the job failed (exit 3) and the restart limit (--max-restarts 1) is reached" &&
  [ "$(left)" -eq 0 ]
check "restart limit reached: exit $rc, two attempts, message, nothing left" $?

# 2. MIN larger than the hosts, bad values, an unreadable hostfile: exit 2 naming the value
launch "$tmp/min.log" --hostfile "$tmp/one-host" --nnodes 2:3 -- true
[ $rc -eq 2 ] && has "$tmp/min.log" "--nnodes 2:3: $tmp/one-host lists 1 host(s), fewer than MIN = 2"
check "MIN larger than the hosts: exit $rc" $?
ok=0
for bad in "--nnodes 3:2" "--nnodes 0:1" "--max-restarts x" "-n 0" "--hostfile $tmp/none"; do
  # shellcheck disable=SC2086
  launch "$tmp/bad.log" $bad -- true
  [ $rc -eq 2 ] && has "$tmp/bad.log" "${bad%% *}" || { echo "  $bad: exit $rc"; ok=1; }
done
check "bad values: exit 2 naming the option" $ok

# 3. exit 2 (bad usage) is never retried
launch "$tmp/usage.log" -n 2 --nnodes 1:1 --max-restarts 3 -- sh -c 'exit 2' "$mark"
[ $rc -eq 2 ] && [ "$(grep -c "attempt [0-9]*:" "$tmp/usage.log")" -eq 1 ] &&
  has "$tmp/usage.log" "not restarting"
check "exit 2 not retried: exit $rc" $?

# 4. a hung rank under the watchdog: each attempt aborts, the supervisor restarts once, gives
# up, and the hung rank is gone too
launch "$tmp/hang.log" -n 3 --nnodes 1:1 --max-restarts 1 -- "$test_comm" --hang 1 blocking 2
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "watchdog: all-reduce" "$tmp/hang.log")" -ge 2 ] &&
  has "$tmp/hang.log" "restart limit" && [ "$(pgrep -f -- "$test_comm --hang" | wc -l)" -eq 0 ]
check "hung rank: the watchdog aborts each attempt, exit $rc, nothing left" $?

# 5. a rank announces a watchdog abort but mpiexec keeps waiting (its ranks ignore SIGTERM, as
# ranks behind a cut link cannot be reached): the supervisor ends the job after its grace
t0=$(date +%s)
launch "$tmp/abort.log" -n 2 -- sh -c '[ "$OMPI_COMM_WORLD_RANK" = 0 ] &&
  echo "[rank 0] error: watchdog: barrier of 2 ranks (test) on group world (2 ranks) has not completed; aborting the job" >&2
  trap "" TERM; exec sleep 100' "$mark"
dt=$(($(date +%s) - t0))
[ $rc -eq 1 ] && [ $dt -lt 60 ] && has "$tmp/abort.log" "a rank aborted the job" && [ "$(left)" -eq 0 ]
check "watchdog abort announced, mpiexec waiting: job ended after $dt s, exit $rc, nothing left" $?

# 6. the supervisor told to stop (SIGTERM) ends its job and every rank, then exits 143
"$bin" launch -n 2 -- sh -c 'trap "" TERM; exec sleep 100' "$mark" > "$tmp/term.log" 2>&1 &
sup=$!
n=0
until [ "$(left)" -ge 2 ] || [ $n -ge 300 ]; do sleep 0.1; n=$((n + 1)); done
kill -TERM $sup
wait $sup
rc=$?
[ $rc -eq 143 ] && [ "$(left)" -eq 0 ] && has "$tmp/term.log" "told to stop"
check "supervisor stopped: exit $rc, nothing left" $?
pkill -9 -f -- "$mark" 2>/dev/null
finish
