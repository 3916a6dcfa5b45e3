#!/usr/bin/env bash
# The watchdog (issue 16): a rank that hangs or is stopped ends the whole job, within
# comm.timeout_seconds + 10 s, with one message naming the collective, its label, the step and
# the ranks that did not arrive (for a point-to-point wait: the transfer and its peer); no
# process is left behind.
#   tests/watchdog.sh build/ctitan
set -u
bin=$1
src=${CT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
test_comm=$(dirname "$bin")/test_comm
. "$src/tests/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export OMPI_MCA_hwloc_base_binding_policy=none OMP_NUM_THREADS=1
T=3   # comm.timeout_seconds
LIMIT=$((T + 10))

# within NAME LOG SECONDS: the job ended within LIMIT seconds (plus start-up, for the unit runs)
within() {
  [ "$3" -le "$LIMIT" ] || echo "  $1 took $3 s (limit $LIMIT)"
  [ "$3" -le "$LIMIT" ]
}
has() { grep -q -- "$2" "$1" || { echo "  '$2' missing from $1:"; tail -5 "$1"; return 1; }; }

# 1-2. A rank that never arrives (it sleeps outside any collective), blocking and stream.
t0=$(date +%s)
timeout 60 mpiexec -n 3 "$test_comm" --hang 2 blocking $T > "$tmp/blocking.log" 2>&1
rc=$?
dt=$(($(date +%s) - t0 - 2))  # start-up
cat "$tmp/blocking.log" | grep watchdog | head -2
[ $rc -ne 0 ] && [ $rc -ne 124 ] && within blocking "$tmp/blocking.log" $dt &&
  has "$tmp/blocking.log" "all-reduce of 1 doubles (clip: gradient sum of squares) during checkpoint save of step 7 on group world" &&
  has "$tmp/blocking.log" "at step 7; ranks that did not arrive: rank 2 (at step 7, in no collective"
check "blocking all-reduce: rank 2 named, label, context and step in the message" $?

t0=$(date +%s)
timeout 60 mpiexec -n 2 "$test_comm" --hang 1 stream $T > "$tmp/stream.log" 2>&1
rc=$?
dt=$(($(date +%s) - t0 - 2))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && within stream "$tmp/stream.log" $dt &&
  has "$tmp/stream.log" "(all-gather of bucket 3) on group world" &&
  has "$tmp/stream.log" "did not arrive: rank 1 (at step 7"
check "comm-stream all-gather: rank 1 named, bucket in the message" $?

# A rank late for the end (stopped or hung after the last collective): the others do not wait
# in MPI_Finalize forever; the barrier before it is watched like any collective.
t0=$(date +%s)
timeout 60 mpiexec -n 3 "$test_comm" --hang 1 final $T > "$tmp/final.log" 2>&1
rc=$?
dt=$(($(date +%s) - t0 - 2))
grep watchdog "$tmp/final.log" | head -2
[ $rc -ne 0 ] && [ $rc -ne 124 ] && within final "$tmp/final.log" $dt &&
  has "$tmp/final.log" "barrier of 3 ranks (before MPI_Finalize) on group world (finalize)" &&
  has "$tmp/final.log" "did not arrive: rank 1 (at step 7"
check "a rank late for MPI_Finalize: the job ends, rank 1 named (exit $rc)" $?

# A pipeline neighbour that never sends: the watched point-to-point wait names the transfer
# and the peer (issue 15).
t0=$(date +%s)
timeout 60 mpiexec -n 2 "$test_comm" --hang 1 p2p $T > "$tmp/p2p.log" 2>&1
rc=$?
dt=$(($(date +%s) - t0 - 2))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && within p2p "$tmp/p2p.log" $dt &&
  has "$tmp/p2p.log" "watchdog: test receive of an activation (point-to-point with rank 1) on group point-to-point" &&
  has "$tmp/p2p.log" "did not arrive: rank 1 (at step 7, in no collective"
check "point-to-point receive: the transfer and rank 1 named" $?

# 3-4. SIGSTOP one rank of a training job, inline and thread progress.
rank_pid() { # MPIEXEC_PID RANK
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}
stop_trial() { # NAME PROGRESS RANK
  local out=$tmp/$1 log=$tmp/$1.log
  mpiexec -n 2 "$bin" train "$src/configs/debug.toml" --training.steps=100000 \
    --training.seq_len=32 --training.local_batch_size=2 --model.vocab_size=509 \
    --metrics.peak_tflops=0.1 --job.dump_folder="$out" --comm.progress="$2" \
    --comm.timeout_seconds=$T > "$log" 2>&1 &
  local mp=$! n=0
  until [ "$(cat "$out/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] || [ $n -ge 600 ]; do
    sleep 0.1; n=$((n + 1))
  done
  local victim
  victim=$(rank_pid $mp "$3")
  [ -n "$victim" ] || { echo "  no rank $3 found"; kill $mp; wait $mp; return 1; }
  kill -STOP "$victim"
  local t0
  t0=$(date +%s)
  n=0
  while kill -0 $mp 2>/dev/null && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
  local dt=$(($(date +%s) - t0)) ok=0
  if kill -0 $mp 2>/dev/null; then
    echo "  $1: the job still runs $dt s after SIGSTOP (a hang)"
    kill -9 "$victim" $mp 2>/dev/null
    ok=1
  fi
  wait $mp
  local rc=$?
  # mpiexec continues and terminates its ranks; the stopped one then finds its peers gone and
  # ends through its own watchdog
  n=0
  while kill -0 "$victim" 2>/dev/null && [ $n -lt $((LIMIT * 10)) ]; do sleep 0.1; n=$((n + 1)); done
  [ $n -gt 0 ] && echo "  $1: the stopped rank ended $((n / 10)) s after mpiexec"
  if kill -0 "$victim" 2>/dev/null; then
    echo "  $1: the stopped rank was left behind"
    kill -9 "$victim"
    ok=1
  fi
  grep watchdog "$log" | head -2
  echo "  $1: job ended $dt s after SIGSTOP, exit $rc"
  [ $ok -eq 0 ] && [ $rc -ne 0 ] && within "$1" "$log" $dt &&
    has "$log" "watchdog: .* step [0-9]*; ranks that did not arrive: rank $3 (no answer"
}
stop_trial stop_inline inline 1
check "SIGSTOP rank 1, inline progress: job ends, rank 1 named" $?
stop_trial stop_thread thread 0
check "SIGSTOP rank 0, thread progress: job ends, rank 0 named" $?
finish
