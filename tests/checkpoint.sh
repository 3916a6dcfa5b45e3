#!/usr/bin/env bash
# Checkpoint tests through the CLI:
#  - resume is exact: run 6 steps, or die in step 4 and resume: steps 4-6 bitwise identical;
#  - reshard on load: save on 4 ranks, resume on 2 and on 1 (same global batch): losses and
#    gradient norms of the resumed steps equal the uninterrupted run's within 1e-5;
#  - keep_latest_k prunes; `latest` names the newest;
#  - a corrupted or truncated checkpoint file is named, exit 1, and nothing is overwritten;
#  - SIGTERM: finish the step, save, exit 0.
#   tests/checkpoint.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
COMMON=(--training.steps=6 --training.seq_len=32 --training.global_batch_size=8
        --training.local_batch_size=2 --lr_scheduler.warmup_steps=2 --metrics.peak_tflops=0.1
        --model.vocab_size=509 --checkpoint.interval=3)
# 1. exact resume on 1 rank (the crash run exits non-zero by design: its status is not checked)
run "$tmp/a.log" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/a"
check "uninterrupted run (exit 0)" $?
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/b" \
  --checkpoint.enable=true --debug.fail_rank=0 --debug.fail_step=4 > "$tmp/b1.log" 2>&1
[ -f "$tmp/b/checkpoint/step-00000003/manifest.json" ]; check "checkpoint of step 3 exists after the crash in step 4" $?
run "$tmp/b2.log" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/b" \
  --checkpoint.enable=true && grep -q "loaded step 3" "$tmp/b2.log"; check "resume loads step 3 (exit 0)" $?
metric "$tmp/a/metrics.jsonl" 4 6 > "$tmp/a.l"; metric "$tmp/b/metrics.jsonl" 4 6 > "$tmp/b.l"
same "$tmp/a.l" "$tmp/b.l"; check "resumed steps 4-6: loss and grad_norm bitwise equal the uninterrupted run" $?
# killed right after step 3's checkpoint is committed (nothing else of step 3 done): step 3's
# metrics record is there, so the resumed run (from step 3) continues a complete loss curve
CT_TEST_KILL_AFTER_SAVE=3 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
  --job.dump_folder="$tmp/k" --checkpoint.enable=true > "$tmp/k1.log" 2>&1
rc=$?
[ $rc -eq 137 ] && [ -f "$tmp/k/checkpoint/step-00000003/manifest.json" ] &&
  metric "$tmp/k/metrics.jsonl" 3 3 > /dev/null
check "killed right after the step-3 checkpoint (exit $rc): step 3's record is in metrics.jsonl" $?
run "$tmp/k2.log" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/k" \
  --checkpoint.enable=true && grep -q "loaded step 3" "$tmp/k2.log" &&
  metric "$tmp/a/metrics.jsonl" 1 6 > "$tmp/a16.l" && metric "$tmp/k/metrics.jsonl" 1 6 > "$tmp/k.l" &&
  same "$tmp/a16.l" "$tmp/k.l"
check "resumed from step 3: steps 1-6 all recorded, bitwise equal to the uninterrupted run" $?

# generation from the checkpoint alone (it carries config.toml) equals generation via the config
[ -f "$tmp/b/checkpoint/step-00000006/config.toml" ]; check "checkpoint carries its config" $?
"$CTITAN" generate --checkpoint "$tmp/b/checkpoint" --prompt-ids 1,2,3 --max-new-tokens 5 \
  --temperature 0 > "$tmp/g1" 2> "$tmp/g1.err"
rc=$?
"$CTITAN" generate "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/b" \
  --prompt-ids 1,2,3 --max-new-tokens 5 --temperature 0 > "$tmp/g2" 2>&1
[ $rc -eq 0 ] && [ "$(grep -c '^generated: [0-9]* [0-9]* [0-9]* [0-9]* [0-9]*$' "$tmp/g1")" -eq 1 ] \
  && cmp -s "$tmp/g1" "$tmp/g2"; check "generate --checkpoint DIR: 5 greedy tokens, same as via the config" $?

# 2. reshard: save on 4 ranks (FSDP), resume on 2 ranks and on 1 rank
"$LAUNCH" 4 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/c" \
  --checkpoint.enable=true --debug.fail_rank=2 --debug.fail_step=4 > "$tmp/c1.log" 2>&1
[ -f "$tmp/c/checkpoint/step-00000003/manifest.json" ]; check "4-rank checkpoint of step 3 exists" $?
for n in 2 1; do
  rm -rf "$tmp/d$n"; mkdir -p "$tmp/d$n"; cp -r "$tmp/c/checkpoint" "$tmp/d$n/"
  run "$tmp/d$n.log" "$LAUNCH" $n "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --job.dump_folder="$tmp/d$n" --checkpoint.enable=true &&
    grep -q "loaded step 3" "$tmp/d$n.log"; check "4-rank checkpoint loads on $n rank(s) (exit 0)" $?
  metric "$tmp/d$n/metrics.jsonl" 4 6 > "$tmp/d$n.l"
  close "$tmp/d$n.l" "$tmp/a.l"
  check "resumed on $n rank(s): steps 4-6 loss and grad_norm match the 1-rank run within 1e-5" $?
done

# 3. pruning and latest
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/e" \
  --checkpoint.enable=true --checkpoint.interval=1 --checkpoint.keep_latest_k=2 > "$tmp/e.log" 2>&1
[ "$(ls "$tmp/e/checkpoint" | grep -c '^step-')" -eq 2 ] && [ -d "$tmp/e/checkpoint/step-00000006" ] \
  && [ -d "$tmp/e/checkpoint/step-00000005" ]; check "keep_latest_k=2 keeps steps 5 and 6" $?
[ "$(cat "$tmp/e/checkpoint/latest")" = "6" ]; check "latest names step 6" $?

# 4. corruption: flip a byte of the newest checkpoint's data file
f="$tmp/e/checkpoint/step-00000006/rank-00000.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=100000 conv=notrunc 2>/dev/null
cp "$f" "$tmp/corrupt.copy"
# asked for explicitly: an error naming the file, and nothing touched
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=8 --job.dump_folder="$tmp/e" \
  --checkpoint.enable=true --checkpoint.keep_latest_k=2 --checkpoint.load_step=6 > "$tmp/e2.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "rank-00000.safetensors' is corrupted" "$tmp/e2.log"; check "load_step=6 corrupted: file named, exit 1 (got $rc)" $?
cmp -s "$f" "$tmp/corrupt.copy" && [ -d "$tmp/e/checkpoint/step-00000005" ]; check "nothing overwritten or pruned after the failed load" $?
# the newest one by default: falls back to step 5, says so, trains on
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=7 --job.dump_folder="$tmp/e" \
  --checkpoint.enable=true --checkpoint.keep_latest_k=2 > "$tmp/e4.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "falling back to step 5" "$tmp/e4.log" && grep -q "loaded step 5" "$tmp/e4.log"
check "newest corrupted: falls back to step 5 and says so, exit 0 (got $rc)" $?
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=7 --job.dump_folder="$tmp/e" \
  --checkpoint.enable=true --checkpoint.load_step=7 > "$tmp/e5.log" 2>&1
[ $? -eq 0 ] && grep -q "loaded step 7" "$tmp/e5.log"; check "the checkpoint written after the fallback loads" $?
# truncated manifest
head -c 100 "$tmp/e/checkpoint/step-00000007/manifest.json" > "$tmp/m" && cp "$tmp/m" "$tmp/e/checkpoint/step-00000007/manifest.json"
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/e" \
  --checkpoint.enable=true --checkpoint.load_step=7 > "$tmp/e3.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "manifest.json' is missing or malformed" "$tmp/e3.log"; check "truncated manifest named, exit 1 (got $rc)" $?
# a model that does not match
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --model.vocab_size=512 --job.dump_folder="$tmp/a2" \
  > /dev/null 2>&1
cp -r "$tmp/b/checkpoint" "$tmp/a2/" 2>/dev/null
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --model.vocab_size=512 --job.dump_folder="$tmp/a2" \
  --checkpoint.enable=true > "$tmp/a3.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "is of another model: model.vocab_size is 509 in the checkpoint, 512 in this run" "$tmp/a3.log"; check "another model's checkpoint named (exit $rc)" $?

# damaged copies of the 4-rank checkpoint, each loaded explicitly: exit 1, file/tensor named
bad() { # NAME EXPECTED_MESSAGE: run on the damaged copy in $tmp/bad
  "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/bad" \
    --checkpoint.enable=true --checkpoint.load_step=3 > "$tmp/bad.log" 2>&1
  local rc=$?
  [ $rc -eq 1 ] && grep -q "$2" "$tmp/bad.log"; check "$1: exit 1 (got $rc), message names it" $?
  [ $rc -eq 1 ] || tail -3 "$tmp/bad.log"
}
fresh() { rm -rf "$tmp/bad"; mkdir -p "$tmp/bad"; cp -r "$tmp/c/checkpoint" "$tmp/bad/"; B="$tmp/bad/checkpoint/step-00000003"; }
fresh; rm "$B/rank-00002.safetensors"
bad "missing rank file" "cannot open '.*rank-00002.safetensors'"
fresh; f="$B/rank-00001.safetensors"; head -c 50000 "$f" > "$tmp/t" && cp "$tmp/t" "$f"
bad "truncated rank file" "rank-00001.safetensors' is truncated or extended"
fresh; sed -i 's/"n_layers":\s*[0-9]*/"n_layers": 7/' "$B/manifest.json"
bad "manifest of another model" "is of another model: model.n_layers is 7 in the checkpoint, 6 in this run"
fresh; /usr/bin/python3 -c "
import json,sys
p=sys.argv[1]; m=json.load(open(p)); m['tensors']['layers.2.attention.wk.weight']['shape'][0]+=4
json.dump(m,open(p,'w'),indent=1)" "$B/manifest.json"
bad "manifest shape that its pieces do not cover" "pieces of tensor 'layers.2.attention.wk.weight' do not cover"
fresh; /usr/bin/python3 -c "
import json,sys
p=sys.argv[1]; m=json.load(open(p)); m['files']['../../etc/passwd']=m['files'].pop('rank-00000.safetensors')
json.dump(m,open(p,'w'),indent=1)" "$B/manifest.json"
bad "manifest naming a file outside the folder" "file entry '../../etc/passwd' is malformed"
[ -f "$tmp/c/checkpoint/step-00000003/rank-00002.safetensors" ]; check "the original checkpoint is untouched" $?

# 5. SIGTERM: finish the step, save, exit 0
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=100000 --job.dump_folder="$tmp/s" \
  --checkpoint.enable=true --checkpoint.interval=100000 > "$tmp/s.log" 2>&1 &
pid=$!
# the event (a first step logged), not a fixed wait
until grep -q "step:" "$tmp/s.log" 2>/dev/null; do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -TERM $pid
wait $pid
rc=$?
n=$(cat "$tmp/s/checkpoint/latest" 2>/dev/null || echo none)
[ $rc -eq 0 ] && [ -f "$tmp/s/checkpoint/step-$(printf %08d "$n")/manifest.json" ]; check "SIGTERM: exit 0 (got $rc) with a checkpoint of step $n" $?

finish
