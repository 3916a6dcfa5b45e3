#!/usr/bin/env bash
# The flight recorder (issue 32): every rank that still runs writes
# <dump_folder>/comm_traces/rank_N.json before the watchdog ends a hung job (and on SIGUSR1),
# and `ctitan trace-comm` names what hung.
#   (a) a training job of 3 ranks, rank 1 SIGSTOPped mid-step: SIGUSR1 first dumps every
#       rank while the job runs; after the stop, ranks 0 and 2 dump, and trace-comm names
#       the collective the watchdog saw (group and label) and rank 1 as the one with no dump;
#   (b) debug.skip_collective: a random rank issues a barrier in place of a random collective
#       of dp_shard: trace-comm reports an op mismatch at that sequence number, naming it;
#   (c) trace-comm's exit codes: 2 bad usage, 1 nothing readable, 0 with --help.
#   tests/flight.sh build/ctitan
set -u
bin=$1
src=${CT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
. "$src/tests/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export OMPI_MCA_hwloc_base_binding_policy=none OMP_NUM_THREADS=1
T=2 # comm.timeout_seconds
small="--training.dataset=synthetic --training.seq_len=32 --training.local_batch_size=2
  --model.vocab_size=509 --metrics.peak_tflops=0.1 --comm.timeout_seconds=$T"
has() { grep -q -- "$2" "$1" || { echo "  '$2' missing from $1:"; tail -8 "$1"; return 1; }; }
rank_pid() { # MPIEXEC_PID RANK (as tests/watchdog.sh finds it)
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}
wait_files() { # N FILES...: until all exist (N tenths of a second at most)
  local n=$1 i=0
  shift
  while [ $i -lt "$n" ]; do
    local all=1
    for f in "$@"; do [ -s "$f" ] || all=0; done
    [ $all -eq 1 ] && return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

# ---- (a) SIGUSR1, then SIGSTOP of rank 1
out=$tmp/stop
log=$tmp/stop.log
traces=$out/comm_traces
mpiexec -n 3 "$bin" train "$src/configs/debug.toml" $small --training.steps=100000 \
  --job.dump_folder="$out" --comm.progress=thread > "$log" 2>&1 &
mp=$!
n=0
until [ "$(cat "$out/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] || [ $n -ge 600 ]; do
  sleep 0.1; n=$((n + 1))
done
kill -USR1 $mp # mpiexec forwards it to every rank
wait_files 100 "$traces"/rank_{0,1,2}.json
ok=$?
[ $ok -eq 0 ] && for r in 0 1 2; do
  grep -q '"reason":"on request (signal)"' "$traces/rank_$r.json" || { echo "  rank $r: reason"; ok=1; }
done
[ $ok -eq 0 ] && mkdir "$tmp/usr1" && cp "$traces"/rank_*.json "$tmp/usr1/" &&
  "$bin" trace-comm "$tmp/usr1" > "$tmp/usr1.txt" && has "$tmp/usr1.txt" "dumps from 3 of 3 ranks"
check "SIGUSR1 to mpiexec: every rank of a running job dumps, trace-comm reads them" $?
rm -f "$traces"/rank_*.json

victim=$(rank_pid $mp 1)
[ -n "$victim" ] && kill -STOP "$victim"
n=0
while kill -0 $mp 2>/dev/null && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
echo "  the job ended $((n / 10)).$((n % 10)) s after the SIGSTOP (comm.timeout_seconds = $T)"
kill -0 $mp 2>/dev/null && { echo "  the job still runs after 30 s"; kill -9 $mp; }
wait $mp
rc=$?
# mpiexec's teardown resumes (SIGCONT) the stopped rank before it kills it, so it may serve
# the dump request late, from a state that moved on after the stop: the case under test is
# the stopped rank that cannot dump, so that late file is set aside.
[ -n "$victim" ] && { kill -9 "$victim" 2>/dev/null; while kill -0 "$victim" 2>/dev/null; do sleep 0.1; done; }
[ -f "$traces/rank_1.json" ] && mv "$traces/rank_1.json" "$tmp/late_rank_1.json"
wd=$(grep -m1 '^\[rank [02]\] error: watchdog:' "$log")
group=$(sed -n 's/.* on group \([a-z_]*\) (.*/\1/p' <<< "$wd")
label=$(sed -n 's/^[^:]*: watchdog: [^(]*(\([^)]*\)) on group .*/\1/p' <<< "$wd")
echo "  watchdog: ${wd:0:160}..."
echo "  group '$group', label '$label'"
[ -n "$victim" ] && [ $rc -ne 0 ] && [ -n "$group" ] &&
  grep -q '"reason":"[^"]*watchdog: ' "$traces/rank_0.json" &&
  grep -q '"reason":"[^"]*watchdog: ' "$traces/rank_2.json"
check "SIGSTOP rank 1: the job ends, ranks 0 and 2 wrote their dumps (exit $rc)" $?
"$bin" trace-comm "$out" > "$tmp/stop.txt"
rc=$?
grep '^diagnosis:' "$tmp/stop.txt" | head -3
# the collective named is the first one rank 1 never entered: the one the watchdog timed out
# on, or (comm.progress = thread) an earlier one the comm thread had in flight ahead of the
# compute thread's wait (seen once: the all-gather prefetching bucket 1 while the watchdog
# waited in the reduce-scatter of bucket 2); either way on the watchdog's group
[ $rc -eq 0 ] && has "$tmp/stop.txt" "dumps from 2 of 3 ranks (none from rank 1)" &&
  grep '^diagnosis:' "$tmp/stop.txt" | grep "group $group seq [0-9]* " |
    grep -q "rank 1 wrote no dump"
ok=$?
if [ $ok -eq 0 ] && [ -n "$label" ] &&
  ! grep "^diagnosis: group $group " "$tmp/stop.txt" | grep -qF "\"$label\""; then
  echo "  the first collective rank 1 never entered is not the watchdog's ('$label'):"
  echo "  an earlier one was in flight on the comm thread"
  grep "^diagnosis: group $group " "$tmp/stop.txt" | grep -q "ranks 0,2 wait in it" || ok=1
fi
check "trace-comm names group $group, the first collective rank 1 never entered, and rank 1 (no dump)" $ok

# ---- (b) a desynchronised rank
# step 1 issues collectives 1..24 on dp_shard (all-gathers and reduce-scatters); rerun one
# trial with CT_FLIGHT_RANK and CT_FLIGHT_SEQ
R=${CT_FLIGHT_RANK:-$((RANDOM % 3))}
S=${CT_FLIGHT_SEQ:-$((2 + RANDOM % 23))}
echo "  (b): rank $R, seq $S"
out=$tmp/skip
timeout 60 mpiexec -n 3 "$bin" train "$src/configs/debug.toml" $small --training.steps=20 \
  --job.dump_folder="$out" --debug.skip_collective_rank=$R --debug.skip_collective_seq=$S \
  > "$tmp/skip.log" 2>&1
rc=$?
"$bin" trace-comm "$out" > "$tmp/skip.txt"
trc=$?
grep '^diagnosis:' "$tmp/skip.txt" | head -3
others=$(for r in 0 1 2; do [ $r -ne $R ] && printf '%s,' $r; done)
others=${others%,}
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $trc -eq 0 ] && has "$tmp/skip.txt" "dumps from 3 of 3 ranks" &&
  grep -q "^diagnosis: group dp_shard seq $S: op mismatch: .*rank $R: barrier 0 bytes" "$tmp/skip.txt" &&
  grep -q "^diagnosis: group dp_shard seq $S: op mismatch: .*ranks $others: [a-z-]* [1-9][0-9]* bytes" "$tmp/skip.txt" &&
  has "$tmp/skip.txt" "^rank $R (host"
check "rank $R skips dp_shard's collective $S: trace-comm reports the op mismatch at seq $S (exit $rc)" $?

# ---- (c) exit codes
"$bin" trace-comm > /dev/null 2>&1; a=$?
"$bin" trace-comm "$out" extra > /dev/null 2>&1; b=$?
"$bin" trace-comm --bogus > /dev/null 2>&1; c=$?
"$bin" trace-comm "$tmp/nowhere" > /dev/null 2>&1; d=$?
mkdir "$tmp/bad" && echo '{"rank": 0, "groups": [' > "$tmp/bad/rank_0.json"
"$bin" trace-comm "$tmp/bad" > /dev/null 2>&1; e=$?
mkdir "$tmp/empty" && "$bin" trace-comm "$tmp/empty" > /dev/null 2>&1; f=$?
"$bin" trace-comm --help | grep -q "usage: ctitan trace-comm DIR"; g=$?
echo "  exits: usage $a $b $c, unreadable $d $e $f, help $g"
[ "$a$b$c$d$e$f$g" = "2221110" ]
check "trace-comm exit codes: 2 bad usage, 1 unreadable or no dumps, 0 --help" $?
finish
