#!/usr/bin/env bash
# A rank that dies mid-step takes the whole job down: every other rank exits, the launcher
# exits non-zero within 60 s and names the failed rank. Also: bad usage exits 2.
#   tests/cli_faults.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"

for victim in 1 0; do
  start=$(date +%s)
  timeout 120 "$ROOT/scripts/launch" 3 "$CTITAN" train "$ROOT/configs/debug.toml" \
    --training.steps=20 --training.seq_len=64 --metrics.peak_tflops=0.1 \
    --job.dump_folder="$tmp/run$victim" --debug.fail_rank=$victim --debug.fail_step=3 \
    > "$tmp/out$victim" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  echo "  rank $victim killed: exit $rc after ${took}s; launcher said:"
  grep -iE "rank|signal|killed" "$tmp/out$victim" | head -5 | sed 's/^/    /'
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; check "job exits non-zero when rank $victim dies" $?
  [ "$took" -le 60 ]; check "job ends within 60 s when rank $victim dies" $?
  grep -qE "process rank $victim .*(exited|signal)" "$tmp/out$victim"; check "launcher names the failed rank $victim" $?
  ! grep -q "step:    20" "$tmp/out$victim"; check "no step completes after the failure" $?
done

# Bad usage exits 2, runtime failures 1.
"$CTITAN" > /dev/null 2>&1; [ $? -eq 2 ]; check "no command: exit 2" $?
"$CTITAN" frobnicate > /dev/null 2>&1; [ $? -eq 2 ]; check "unknown command: exit 2" $?
"$CTITAN" train "$tmp/missing.toml" > /dev/null 2>&1; [ $? -eq 2 ]; check "missing config: exit 2" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --training.stepz=3 2> "$tmp/err" > /dev/null
[ $? -eq 2 ] && grep -q "training.stepz" "$tmp/err"; check "unknown key named, exit 2" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --parallelism.tensor_parallel_degree=2 2> "$tmp/err" > /dev/null
[ $? -eq 2 ] && grep -q "tensor_parallel_degree 2 does not match the world of 1" "$tmp/err"; check "tensor parallel degree larger than the world: named, exit 2" $?
mkdir -p "$tmp/data"
printf 'CTTOKENS\001\000\000\000\002\000\000\000\377\000\000\000\000\000\000\000' > "$tmp/data/train_000000.bin"
"$CTITAN" train "$ROOT/configs/debug.toml" --training.dataset=mine --training.dataset_path="$tmp/data" \
  --metrics.peak_tflops=0.1 2> "$tmp/err" > /dev/null
rc=$?
[ $rc -eq 1 ] && grep -q "train_000000.bin" "$tmp/err"; check "token shard that lies about its size: named, exit 1 (got $rc)" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --training.dataset=mine 2> "$tmp/err" > /dev/null
[ $? -eq 2 ] && grep -q "dataset_path" "$tmp/err"; check "a dataset without dataset_path: exit 2" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --job.print_config=true > "$tmp/p.toml" 2> "$tmp/p.err" &&
  "$CTITAN" train "$tmp/p.toml" --job.print_config=true > "$tmp/p2.toml" 2>> "$tmp/p.err" &&
  grep -q '^\[model\]' "$tmp/p.toml" && same "$tmp/p.toml" "$tmp/p2.toml"
check "printed config (exit 0, has [model]) reads back identically" $?

# A non-finite loss stops the run with exit 1 and keeps the last good step as a checkpoint.
"$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=5 --training.seq_len=32 \
  --optimizer.lr=1e30 --lr_scheduler.warmup_steps=0 --checkpoint.enable=true \
  --job.dump_folder="$tmp/nan" --metrics.peak_tflops=0.1 > "$tmp/nan.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "non-finite loss" "$tmp/nan.log" && [ -f "$tmp/nan/checkpoint/step-00000001/manifest.json" ]
check "non-finite loss: exit 1 (got $rc), named, checkpoint of the last good step" $?

# Bad command lines and values: each exits 2 with the key named, never a crash.
bad_args=(
  "--training.steps=0" "--training.steps=abc" "--training.steps=1.5" "--optimizer.lr=-1"
  "--optimizer.lr=nan" "--optimizer.beta1=1" "--optimizer.beta2=1.5" "--optimizer.eps=0"
  "--optimizer.weight_decay=-0.1" "--optimizer.name=SGD" "--lr_scheduler.decay_type=exp"
  "--lr_scheduler.decay_ratio=2" "--lr_scheduler.min_lr_factor=-1" "--lr_scheduler.warmup_steps=-5"
  "--training.local_batch_size=0" "--training.seq_len=-1" "--training.max_norm=0"
  "--training.mixed_precision_param=fp16" "--training.mixed_precision_reduce=bfloat16"
  "--model.flavor=7B" "--model.vocab_size=0" "--model.rope_scaling=maybe"
  "--parallelism.data_parallel_shard_degree=0" "--parallelism.data_parallel_replicate_degree=0"
  "--parallelism.fsdp_reshard_after_forward=sometimes" "--metrics.log_freq=0"
  "--metrics.peak_tflops=-1" "--checkpoint.interval=0" "--checkpoint.keep_latest_k=-1"
  "--checkpoint.load_step=-2" "--activation_checkpoint.mode=everything" "--comm.progress=spin"
  "--comm.timeout_seconds=0" "--validation.freq=0" "--debug.seed=-1" "--job.log_level=loud"
  "--nosuch.key=1" "--training.nosuch=1" "training.steps=3" "--training.steps"
  "--model.tokenizer_path=/nonexistent/tok.model" "--comm.prefetch=-1"
  "--comm.simulate_bandwidth_gbps=-1" "--comm.buckets=embed+0,9" "--profiling.profile_freq=0"
)
n_ok=0
for a in "${bad_args[@]}"; do
  "$CTITAN" train "$ROOT/configs/debug.toml" "$a" > /dev/null 2> "$tmp/bad.err"
  rc=$?
  key=${a#--}; key=${key%%=*}
  if [ $rc -eq 2 ] && grep -q "${key}" "$tmp/bad.err"; then n_ok=$((n_ok + 1)); else echo "  '$a': exit $rc: $(head -1 "$tmp/bad.err")"; fi
done
[ "$n_ok" -eq "${#bad_args[@]}" ]; check "${#bad_args[@]} bad command lines: exit 2 naming the key ($n_ok ok)" $?

# keys that would silently do nothing in this config: exit 2 naming the key
inert=("--model.hyena_order=3" "--model.hyena_l_max=64" "--debug.deterministic=false"
       "--activation_checkpoint.selective_ac_option=2" "--validation.enable=true")
hy=(--model.name=hyena --model.flavor=hyena-debug)
n_ok=0
for a in "${inert[@]}" "${hy[*]} --model.rope_scaling=true" "${hy[*]} --model.hyena_sin_freq=0"; do
  "$CTITAN" train "$ROOT/configs/debug.toml" $a > /dev/null 2> "$tmp/bad.err"
  rc=$?
  key=${a##* --}; key=${key#--}; key=${key%%=*}
  if [ $rc -eq 2 ] && grep -q "${key}" "$tmp/bad.err"; then n_ok=$((n_ok + 1)); else echo "  '$a': exit $rc: $(head -1 "$tmp/bad.err")"; fi
done
[ "$n_ok" -eq 7 ]; check "7 keys that would do nothing here: exit 2 naming the key ($n_ok ok)" $?
# `ctitan help` lists every command main.c dispatches
missing=""
for c in $(grep -o 'strcmp(cmd, "[a-z]*")' "$ROOT/src/cli/main.c" | cut -d'"' -f2 | sort -u); do
  case $c in help|version|--help|-h|--version) continue ;; esac
  "$CTITAN" help | grep -q "^  $c " || missing="$missing $c"
done
"$CTITAN" help | grep -q "generate --checkpoint DIR" || missing="$missing generate--checkpoint"
[ -z "$missing" ]; check "ctitan help lists every command (missing:${missing:- none})" $?

# generate's numeric flags: whole numbers where a count or seed is meant, p in (0, 1]
n_ok=0
gen_bad=("--max-new-tokens 1.5" "--max-new-tokens -3" "--max-new-tokens 3000000000" "--top-k 2.0"
         "--top-p 7" "--top-p 0" "--temperature nan" "--seed -1" "--seed 99999999999999999999999")
for a in "${gen_bad[@]}"; do
  "$CTITAN" generate "$ROOT/configs/debug.toml" --prompt-ids 1,2 $a > /dev/null 2> "$tmp/bad.err"
  rc=$?
  if [ $rc -eq 2 ] && grep -q -- "${a%% *}" "$tmp/bad.err"; then n_ok=$((n_ok + 1)); else echo "  generate $a: exit $rc: $(head -1 "$tmp/bad.err")"; fi
done
[ "$n_ok" -eq "${#gen_bad[@]}" ]; check "generate: ${#gen_bad[@]} bad numeric flags exit 2 naming the flag ($n_ok ok)" $?
"$CTITAN" train --help 2>&1 | grep -A1 "^ *tensor_parallel_degree" > "$tmp/help_tp"
! grep -q "not yet supported" "$tmp/help_tp" && grep -q "inside each pipeline stage" "$tmp/help_tp"
check "--help describes tensor_parallel_degree (llama3, inside each pipeline stage)" $?

finish
