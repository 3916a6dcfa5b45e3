#!/usr/bin/env bash
# ctitan generate on a Hyena checkpoint trained by ctitan train:
#  - greedy decoding, and seeded sampling at temperature 1 (diverse tokens: a barely trained
#    model's greedy output repeats one token), give the same tokens in all four mixer modes
#    (lazy, eager, recompute, flash all-FFT, hybrid and all-direct) over 200 positions with a
#    prompt of 5. The logits agree to ~1e-6 relative, so a sampled token could only flip if a
#    uniform draw fell within ~1e-6 of a boundary of the cumulative distribution;
#  - the checkpoint's config decides the family: --model-kind llama3 is refused (exit 2), as
#    are a bad --mixer-mode, a mixer flag on a Llama checkpoint, and more tokens than the
#    filters are long.
#   tests/hyena_generate.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
"$CTITAN" train "$ROOT/configs/debug.toml" --model.name=hyena --model.flavor=hyena-debug \
  --model.vocab_size=301 --model.hyena_l_max=256 --training.seq_len=64 \
  --training.local_batch_size=4 --training.steps=4 --checkpoint.enable=true \
  --checkpoint.interval=4 --metrics.peak_tflops=0.1 --job.dump_folder="$tmp/h" > "$tmp/train.log" 2>&1
check "train a tiny Hyena with a checkpoint" $?
G=(generate --checkpoint "$tmp/h/checkpoint" --prompt-ids 7,1,200,3,42 --max-new-tokens 200
   --temperature 0)
"$CTITAN" "${G[@]}" --mixer-mode lazy --model-kind hyena > "$tmp/lazy" 2> "$tmp/lazy.err"
[ $? -eq 0 ] && [ "$(grep -o '[0-9]\+' <(grep '^generated:' "$tmp/lazy") | wc -l)" -eq 200 ]
check "lazy: 200 greedy tokens" $?
S=(--temperature 1 --top-k 0 --seed 11)
"$CTITAN" "${G[@]}" "${S[@]}" --mixer-mode lazy > "$tmp/slazy" 2> /dev/null
[ "$(grep '^generated:' "$tmp/slazy" | tr ' ' '\n' | sort -u | wc -l)" -gt 20 ]
check "lazy sampling: diverse tokens" $?
for m in "eager" "recompute" "flash --flash-threshold 0" "flash --flash-threshold 8" \
         "flash --flash-threshold 1000"; do
  "$CTITAN" "${G[@]}" --mixer-mode $m > "$tmp/out" 2> "$tmp/err"
  [ $? -eq 0 ] && cmp -s "$tmp/out" "$tmp/lazy"; check "$m: same greedy tokens as lazy" $?
  "$CTITAN" "${G[@]}" "${S[@]}" --mixer-mode $m > "$tmp/out" 2> "$tmp/err"
  [ $? -eq 0 ] && cmp -s "$tmp/out" "$tmp/slazy"; check "$m: same sampled tokens as lazy" $?
done
"$CTITAN" "${G[@]}" --model-kind llama3 > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "holds a hyena model" "$tmp/err"; check "--model-kind llama3 on a Hyena checkpoint: exit 2" $?
"$CTITAN" "${G[@]}" --mixer-mode fast > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "mixer-mode" "$tmp/err"; check "bad --mixer-mode: exit 2" $?
"$CTITAN" generate --checkpoint "$tmp/h/checkpoint" --max-new-tokens 300 > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "do not fit" "$tmp/err"; check "more positions than the filter: exit 2" $?
"$CTITAN" generate "$ROOT/configs/debug.toml" --mixer-mode flash --job.dump_folder="$tmp/none" \
  > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "only for Hyena" "$tmp/err"; check "--mixer-mode on a Llama config: exit 2" $?
finish
