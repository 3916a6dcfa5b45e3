#!/usr/bin/env bash
# Fault trials: a 2-rank job that saves a checkpoint every step (synchronous and async saves
# alternating, keep_latest_k=2 so pruning runs too) is killed with SIGKILL at a random moment
# - the whole job, or one rank - while it is saving. Afterwards the checkpoint `latest` names
# and the newest complete one must both load and verify (ctitan generate reads the manifest,
# checks every file's size and checksum and loads the weights), and no stray folder may look
# complete.
#   tests/checkpoint_kill.sh build/ctitan [TRIALS=3] [SEED=random]
# bench/run.sh runs it with 24 trials.
set -u
CTITAN=$1
TRIALS=${2:-3}
SEED=${3:-$RANDOM}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
echo "seed $SEED (replay: tests/checkpoint_kill.sh CTITAN $TRIALS $SEED)"
RANDOM=$SEED
# vocab 8000: 9.2M parameters, a 110 MB checkpoint: most of the job's time is spent saving
ARGS=(--model.vocab_size=8000 --training.steps=100000 --training.seq_len=16
      --training.local_batch_size=1 --lr_scheduler.warmup_steps=2 --metrics.peak_tflops=0.1
      --checkpoint.enable=true --checkpoint.interval=1 --checkpoint.keep_latest_k=2)
for t in $(seq 1 "$TRIALS"); do
  d="$tmp/t$t"
  mode=disabled
  [ $((t % 2)) -eq 0 ] && mode=async
  what=job
  [ $((RANDOM % 2)) -eq 0 ] && what=rank
  setsid "$ROOT/scripts/launch" 2 "$CTITAN" train "$ROOT/configs/debug.toml" "${ARGS[@]}" \
    --checkpoint.async_mode=$mode --job.dump_folder="$d" > "$d.log" 2>&1 &
  pid=$! # scripts/launch execs mpiexec; OpenMPI puts each rank in a process group of its own
  # wait for the event (the first save), not for a fixed time: a slow machine only takes longer
  until grep -q "saved step 1 " "$d.log" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "saved step 1 " "$d.log"; then
    check "trial $t ($mode save): the job ended before its first save" 1
    tail -5 "$d.log"
    continue
  fi
  sleep "$((RANDOM % 20 / 10)).$((RANDOM % 10))"
  # the ranks are mpiexec's children, recorded before anything is killed (each in a process
  # group of its own, so killing mpiexec's group would leave them saving and pruning)
  ranks=$(pgrep -P "$pid")
  if [ $what = job ]; then
    kill -9 "$pid" $ranks 2>/dev/null # mpiexec and both ranks at once
  else
    victim=$(echo "$ranks" | sed -n "$((RANDOM % 2 + 1))p")
    kill -9 "$victim" 2>/dev/null
  fi
  wait $pid 2>/dev/null
  # whatever survives (a rank mpiexec left behind) goes too; then wait until every recorded
  # process is gone, so nothing writes while the checkpoint is read
  kill -9 "$pid" $ranks 2>/dev/null
  for q in $pid $ranks; do
    while kill -0 "$q" 2>/dev/null; do sleep 0.05; done
  done
  latest=$(cat "$d/checkpoint/latest" 2>/dev/null)
  if [ -z "$latest" ]; then
    check "trial $t ($mode save, kill $what): killed before the first save completed (no latest)" 1
    continue
  fi
  step_dir="$d/checkpoint/step-$(printf %08d "$latest")"
  "$CTITAN" generate --checkpoint "$step_dir" --prompt-ids 1,2,3 --max-new-tokens 1 \
    --temperature 0 > "$d.gen1" 2>&1
  r1=$?
  "$CTITAN" generate --checkpoint "$d/checkpoint" --prompt-ids 1,2,3 --max-new-tokens 1 \
    --temperature 0 > "$d.gen2" 2>&1
  r2=$?
  stray=$(find "$d/checkpoint" -maxdepth 1 -name 'step-*.tmp' -exec test -f '{}/manifest.json' \; -print | wc -l)
  saved=$(grep -c "saved step" "$d.log")
  [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ "$stray" -eq 0 ]
  check "trial $t ($mode save, kill $what after $saved saves): latest = step $latest loads and verifies; newest complete loads" $?
  [ $r1 -eq 0 ] || tail -3 "$d.gen1"
  [ $r2 -eq 0 ] || tail -3 "$d.gen2"
  rm -rf "$d"
done
finish
