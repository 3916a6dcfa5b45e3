#!/usr/bin/env bash
# Fault trials and elastic restarts (issue 16), on two "hosts" (network namespaces, 2 ranks
# each, TCP between them) under the elastic supervisor:
#   ctitan launch --hostfile H --nnodes 1:2 --max-restarts K ctitan train ... (checkpoints on)
# A signal trial passes only when the fault landed mid-run (the steps logged then are fewer
# than the run's) and the supervisor restarted the job.
# Trials (each: no hang, no damaged checkpoint, the finished run equals an uninterrupted one
# within 1e-5 at every step, and the sample logs show every sample of every step trained
# exactly once in the surviving history):
#   kill     SIGKILL of a random rank mid-run
#   stop     SIGSTOP of a random rank (a hang: the watchdog ends it)
#   link     host 1's link set down mid-step; it comes back before the next restart
#   gone     host 1's link set down for good: the job shrinks to MIN = 1 host and finishes
#   grow     host 1 down (shrink to 2 ranks), back up, then a rank killed: the restart grows
#            back to 4 ranks
#   diskfull the checkpoint folder is a small tmpfs that fills during a save: the job ends
#            with an error naming the file, earlier checkpoints verify, and after the disk
#            is enlarged the job resumes
#   random   N trials (default 20): kill or stop a random rank at a random moment
# Prints a table: fault, detection time, restart time, steps lost, verdict.
#   tests/faults.sh build/ctitan [trial ...]     (all trials by default; root only)
#   tests/faults.sh build/ctitan --random 20     (or TRIALS=20 ... random)
set -u
bin=$(readlink -f "$1")
shift
src=${CT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
. "$src/tests/lib.sh"
hosts=$src/scripts/netns-hosts
p=ctft$$
if [ "$(id -u)" -ne 0 ] || ! ip netns add "$p-probe" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and CAP_NET_ADMIN)"
  exit 77
fi
ip netns del "$p-probe"
cleanup() {
  mountpoint -q "$tmp/full/checkpoint" 2>/dev/null && umount "$tmp/full/checkpoint"
  "$hosts" down "$p"
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
"$hosts" up "$p" 2 || exit 1
printf "10.77.0.1 slots=2\n10.77.0.2 slots=2\n" > "$tmp/hostfile"
unset OMPI_MCA_btl
export OMPI_MCA_plm_rsh_agent="$hosts agent" OMP_NUM_THREADS=1
STEPS=${STEPS:-16}
T=4 # comm.timeout_seconds
TRAIN=(train "$src/configs/debug.toml" --training.steps=$STEPS --training.seq_len=32
  --training.local_batch_size=2 --training.global_batch_size=8 --model.vocab_size=509
  --metrics.peak_tflops=0.1 --checkpoint.enable=true --checkpoint.interval=2
  --comm.timeout_seconds=$T)
on_host0() {
  ip netns exec "$p-h0" unshare --uts /bin/sh -c "hostname $p-h0; exec \"\$@\"" sh "$@"
}
# supervise DIR MAXRESTARTS [FIRST_ATTEMPT]: the elastic job, in the background; sets $sup.
# Sample logs go to DIR/samples.aN.rank-R, N = the attempt (restart count + FIRST_ATTEMPT).
supervise() {
  mkdir -p "$1"
  on_host0 "$bin" launch --hostfile "$tmp/hostfile" --net 10.77.0.0/24 --nnodes 1:2 \
    --max-restarts "$2" /bin/sh -c \
    "exec \"\$0\" \"\$@\" --debug.sample_log=$1/samples.a\$((CT_RESTART_COUNT + ${3:-0}))" \
    "$bin" "${TRAIN[@]}" --job.dump_folder="$1" > "$1/job.log" 2>&1 &
  sup=$!
}
# steps with a record in DIR's metrics.jsonl (a step saved to a checkpoint has two records)
steps_done() { grep -o '"step": *[0-9]*' "$1/metrics.jsonl" 2>/dev/null | sort -u | wc -l; }
wait_steps() { # DIR N [SECONDS]: until metrics.jsonl has records of N steps
  local n=0
  until [ "$(steps_done "$1")" -ge "$2" ] || [ $n -ge $((${3:-120} * 10)) ]; do
    sleep 0.1
    n=$((n + 1))
  done
  [ "$(steps_done "$1")" -ge "$2" ]
}
rank_pid() { # DIR RANK: the pid of that training rank (either host)
  local q
  for q in $(pgrep -f -- "--job.dump_folder=$1( |$)"); do
    if [ "$(cat /proc/$q/comm 2>/dev/null)" = ctitan ] &&
      tr '\0' '\n' < /proc/$q/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$q"
      return
    fi
  done
}
now() { date +%s.%N; }
# finish_job DIR FAULT_TIME: wait for the supervisor; print detection/restart times
finish_job() {
  local d=$1 tf=$2 n=0 td="" tr=""
  local before
  before=$(steps_done "$d")
  while kill -0 "$sup" 2>/dev/null && [ $n -lt 3000 ]; do
    if [ -z "$td" ] && grep -q "restart 1 of\|giving up\|restart limit" "$d/job.log"; then td=$(now); fi
    if [ -n "$td" ] && [ -z "$tr" ] && [ "$(steps_done "$d")" -gt "$before" ]; then tr=$(now); fi
    sleep 0.1
    n=$((n + 1))
  done
  if kill -0 "$sup" 2>/dev/null; then
    echo "  the job still runs after 300 s: a hang"
    pkill -9 -f -- "--job.dump_folder=$d" 2>/dev/null
    kill -9 "$sup" 2>/dev/null
  fi
  wait "$sup"
  rc=$?
  det=$( [ -n "$td" ] && awk "BEGIN{printf \"%.1f\", $td - $tf}" || echo "-")
  rst=$( [ -n "$tr" ] && awk "BEGIN{printf \"%.1f\", $tr - $td}" || echo "-")
}
left_behind() { # DIR: training processes still alive
  pgrep -f -- "--job.dump_folder=$1( |$)" | while read -r q; do
    [ "$(cat /proc/$q/comm 2>/dev/null)" = ctitan ] && echo "$q"
  done | wc -l
}
# verify DIR: exit 0, final history equal to the baseline, samples exactly once, checkpoints
verify() {
  /usr/bin/python3 - "$tmp/base" "$1" "$STEPS" <<'PY'
import glob, json, os, re, sys
base, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def last(d):
    out = {}
    for l in open(os.path.join(d, "metrics.jsonl")):
        r = json.loads(l); out[r["step"]] = r
    return out
a, b = last(base), last(run)
bad = [s for s in range(1, steps + 1) if s not in b or
       abs(b[s]["loss"] - a[s]["loss"]) > 1e-5 * abs(a[s]["loss"])]
# samples: for each step, the entries of the last attempt that trained it
att = {}
for f in glob.glob(os.path.join(run, "samples.a*.rank-*")):
    k = int(re.search(r"samples\.a(\d+)\.rank", f).group(1))
    for l in open(f):
        s, x = map(int, l.split())
        att.setdefault(s, {}).setdefault(k, []).append(x)
G = 8
wrong = [s for s in range(1, steps + 1) if s not in att or
         sorted(att[s][max(att[s])]) != list(range((s - 1) * G, s * G))]
lost = 0
attempts = sorted({k for s in att for k in att[s]})
if len(attempts) > 1:  # steps trained by the first attempt and trained again later
    first = max(s for s in att if 0 in att[s])
    resumed = min(s for s in att if 1 in att[s])
    lost = first - resumed + 1
print("steps_lost=%d attempts=%d loss_mismatch=%s sample_mismatch=%s" %
      (lost, len(attempts), bad[:5], wrong[:5]))
sys.exit(0 if not bad and not wrong else 1)
PY
}
row() { printf "| %-8s | %9s | %9s | %5s | %-7s | %s\n" "$@" | tee -a "$tmp/table"; }

# --------------------------------------------------------------- baseline (no fault)
mkdir -p "$tmp/base"
on_host0 "$bin" launch --hostfile "$tmp/hostfile" --net 10.77.0.0/24 -n 4 "$bin" \
  "${TRAIN[@]}" --job.dump_folder="$tmp/base" > "$tmp/base/job.log" 2>&1
check "uninterrupted baseline, 2 hosts x 2 ranks" $?
: > "$tmp/table"
row fault "detect s" "restart s" lost verdict notes

trial_signal() { # NAME SIGNAL [RANK]
  local d=$tmp/$1 r=${3:-$((RANDOM % 4))}
  supervise "$d" 3
  wait_steps "$d" $((3 + RANDOM % 6)) || { echo "  $1: never started"; tail "$d/job.log"; }
  sleep "0.$((RANDOM % 10))" # a random moment inside the step
  local victim at state
  victim=$(rank_pid "$d" "$r")
  [ -n "$victim" ] || echo "  $1: rank $r not found"
  kill -"$2" "$victim"
  local tf
  tf=$(now)
  # where the fault landed: the steps logged then, and the victim's state (T: stopped)
  at=$(steps_done "$d")
  state=$(awk '{print $3}' "/proc/$victim/stat" 2>/dev/null || echo gone)
  finish_job "$d" "$tf"
  local v out
  out=$(verify "$d")
  v=$?
  # a trial counts only when the fault landed mid-run and forced a restart
  [ "$rc" -eq 0 ] && [ "$(left_behind "$d")" -eq 0 ] && [ $v -eq 0 ] &&
    [ "$at" -lt "$STEPS" ] && grep -q "restart 1 of" "$d/job.log"
  local ok=$?
  row "$1" "$det" "$rst" "$(echo "$out" | sed -n 's/.*steps_lost=\([0-9]*\).*/\1/p')" \
    "$([ $ok -eq 0 ] && echo pass || echo FAIL)" \
    "SIG$2 rank $r after step $at (state $state), exit $rc; $out"
  [ $ok -eq 0 ] || tail -5 "$d/job.log"
  return $ok
}

trial_link() { # NAME DOWN_FOR_GOOD(0|1)
  local d=$tmp/$1
  supervise "$d" 3
  wait_steps "$d" $((3 + RANDOM % 6))
  ip -n "$p-h1" link set eth0 down
  local tf
  tf=$(now)
  if [ "$2" -eq 0 ]; then
    # back once the job has noticed (before the supervisor probes again)
    local n=0
    until grep -q "restart 1 of\|giving up" "$d/job.log" || [ $n -ge 600 ]; do sleep 0.1; n=$((n + 1)); done
    ip -n "$p-h1" link set eth0 up
  fi
  finish_job "$d" "$tf"
  ip -n "$p-h1" link set eth0 up
  local n=0
  while [ "$(left_behind "$d")" -gt 0 ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
  local v out
  out=$(verify "$d")
  v=$?
  local shrunk=0
  grep -q "attempt 1: 2 ranks on 1 host" "$d/job.log" && shrunk=1
  [ "$rc" -eq 0 ] && [ "$(left_behind "$d")" -eq 0 ] && [ $v -eq 0 ] &&
    { [ "$2" -eq 0 ] || [ $shrunk -eq 1 ]; }
  local ok=$?
  row "$1" "$det" "$rst" "$(echo "$out" | sed -n 's/.*steps_lost=\([0-9]*\).*/\1/p')" \
    "$([ $ok -eq 0 ] && echo pass || echo FAIL)" \
    "link down$([ "$2" -eq 1 ] && echo ' for good'), shrunk=$shrunk, exit $rc; $out"
  [ $ok -eq 0 ] || tail -8 "$d/job.log"
  return $ok
}

trial_grow() {
  local d=$tmp/grow
  supervise "$d" 4
  wait_steps "$d" 3
  ip -n "$p-h1" link set eth0 down
  local tf
  tf=$(now)
  # wait for the shrunken run (attempt 1, 2 ranks) to train, then bring the host back and
  # kill a rank: the next attempt must run on both hosts again
  local n=0
  until grep -q "attempt 1: 2 ranks on 1 host" "$d/job.log" || [ $n -ge 900 ]; do sleep 0.1; n=$((n + 1)); done
  local s
  s=$(steps_done "$d")
  wait_steps "$d" $((s + 2))
  ip -n "$p-h1" link set eth0 up
  kill -KILL "$(rank_pid "$d" 1)"
  finish_job "$d" "$tf"
  local v out
  out=$(verify "$d")
  v=$?
  grep -q "attempt 2: 4 ranks on 2 host" "$d/job.log"
  local grew=$?
  [ "$rc" -eq 0 ] && [ $v -eq 0 ] && [ $grew -eq 0 ] && [ "$(left_behind "$d")" -eq 0 ]
  local ok=$?
  row grow "$det" "$rst" "$(echo "$out" | sed -n 's/.*steps_lost=\([0-9]*\).*/\1/p')" \
    "$([ $ok -eq 0 ] && echo pass || echo FAIL)" "4 -> 2 -> 4 ranks, exit $rc; $out"
  [ $ok -eq 0 ] || grep "ctitan launch" "$d/job.log"
  return $ok
}

trial_diskfull() {
  local d=$tmp/full
  mkdir -p "$d/checkpoint"
  # room for about one checkpoint: the second save runs out of space
  mount -t tmpfs -o size=90m ctitan-ckpt "$d/checkpoint" || return 1
  supervise "$d" 0
  local tf
  tf=$(now)
  finish_job "$d" "$tf"
  local first_rc=$rc
  grep -m1 -i "no space" "$d/job.log"
  local good
  good=$(ls -d "$d"/checkpoint/step-* 2>/dev/null | grep -vc '\.tmp$')
  # every complete checkpoint verifies (checksums): load each through generate's loader
  local bad=0 c
  for c in $(ls -d "$d"/checkpoint/step-* | grep -v '\.tmp$'); do
    "$bin" generate --checkpoint "$c" --prompt-ids 1 --max-tokens 1 > /dev/null 2>&1 || bad=$((bad + 1))
  done
  mv "$d/job.log" "$d/job-full.log"
  # the operator makes room; the job resumes from the newest checkpoint that verifies
  mount -o remount,size=2g "$d/checkpoint"
  supervise "$d" 0 1
  finish_job "$d" "$(now)"
  local v out
  out=$(verify "$d")
  v=$?
  [ "$first_rc" -ne 0 ] && [ "$good" -ge 1 ] && [ "$bad" -eq 0 ] && [ "$rc" -eq 0 ] && [ $v -eq 0 ] &&
    grep -q "loaded step" "$d/job.log"
  local ok=$?
  row diskfull "-" "-" "$(echo "$out" | sed -n 's/.*steps_lost=\([0-9]*\).*/\1/p')" \
    "$([ $ok -eq 0 ] && echo pass || echo FAIL)" \
    "first run exit $first_rc with $good complete checkpoint(s), $bad failing to load; resumed exit $rc; $out"
  umount "$d/checkpoint"
  return $ok
}

trials=("$@")
if [ "${trials[0]:-}" = --random ]; then # --random N: the random trials alone
  TRIALS=${trials[1]:-20}
  trials=(random)
fi
[ ${#trials[@]} -gt 0 ] || trials=(kill stop link gone grow diskfull random)
for t in "${trials[@]}"; do
  case "$t" in
  kill) trial_signal kill KILL; check "SIGKILL of a rank" $? ;;
  stop) trial_signal stop STOP; check "SIGSTOP of a rank" $? ;;
  link) trial_link link 0; check "link down mid-step, back for the restart" $? ;;
  gone) trial_link gone 1; check "a host that never comes back: shrink to MIN" $? ;;
  grow) trial_grow; check "shrink, then grow back when the host returns" $? ;;
  diskfull) trial_diskfull; check "checkpoint filesystem full" $? ;;
  random)
    passed=0
    for ((i = 1; i <= ${TRIALS:-20}; i++)); do
      sig=KILL
      [ $((RANDOM % 2)) -eq 0 ] && sig=STOP
      trial_signal "random$i" $sig && passed=$((passed + 1))
    done
    echo "random trials: $passed of ${TRIALS:-20} passed"
    [ "$passed" -eq "${TRIALS:-20}" ]
    check "random kill/stop trials: $passed of ${TRIALS:-20}" $?
    ;;
  *) echo "unknown trial $t"; exit 2 ;;
  esac
done
echo
cat "$tmp/table"
finish
