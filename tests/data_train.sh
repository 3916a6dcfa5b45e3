#!/usr/bin/env bash
# Training on a shard folder: validation loss is reported, and a run that dies on 2 ranks
# resumes on 1 rank from the loader's saved position: the resumed steps match an
# uninterrupted run (same global batch) within 1e-5.
#   tests/data_train.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
# shards of a learnable sequence (a random walk over a small cycle), written by Python
token_shards "$tmp/data" 7 0.8 5 3 train_000000=30000 train_000001=20000 val_000000=3000
COMMON=(--training.dataset=mine --training.dataset_path="$tmp/data" --model.vocab_size=509
        --training.steps=6 --training.seq_len=32 --training.global_batch_size=8
        --training.local_batch_size=2 --lr_scheduler.warmup_steps=2 --metrics.peak_tflops=0.1
        --validation.enable=true --validation.freq=3 --validation.steps=4 --checkpoint.interval=3)
"$ROOT/scripts/launch" 2 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
  --job.dump_folder="$tmp/a" > "$tmp/a.log" 2>&1
check "2-rank run on a shard folder" $?
grep -q "validation loss" "$tmp/a.log"; check "validation loss reported" $?
"$ROOT/scripts/launch" 2 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
  --job.dump_folder="$tmp/b" --checkpoint.enable=true --debug.fail_rank=1 --debug.fail_step=4 \
  > "$tmp/b1.log" 2>&1
grep -q 'position' "$tmp/b/checkpoint/step-00000003/manifest.json"; check "checkpoint holds the loader position" $?
run "$tmp/b2.log" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/b" \
  --checkpoint.enable=true
check "resume on 1 rank" $?
{ metric "$tmp/a/metrics.jsonl" 4 6 && metric "$tmp/a/metrics.jsonl" 6 6 validation_loss; } > "$tmp/a.l"
{ metric "$tmp/b/metrics.jsonl" 4 6 && metric "$tmp/b/metrics.jsonl" 6 6 validation_loss; } > "$tmp/b.l"
close "$tmp/b.l" "$tmp/a.l"
check "resumed steps 4-6 (loss, grad_norm) and the validation loss match the uninterrupted run" $?
# plots of the run: four PNG files
"$CTITAN" plot "$tmp/a" --out "$tmp/plots" > "$tmp/plot.log" 2>&1
ok=0
for f in loss lr tps memory; do
  head -c 4 "$tmp/plots/$f.png" 2>/dev/null | grep -q PNG || ok=1
done
check "ctitan plot writes loss, lr, tps and memory PNGs" $ok
# two runs on one loss chart: the second run's data written beside the first's and drawn
"$CTITAN" plot "$tmp/b" --out "$tmp/plots-b" > /dev/null 2>&1
"$CTITAN" plot "$tmp/a" --compare "$tmp/b" --out "$tmp/cmp" > /dev/null 2>&1
head -c 4 "$tmp/cmp/loss.png" 2>/dev/null | grep -q PNG &&
  cmp -s "$tmp/cmp/plot-compare.dat" "$tmp/plots-b/plot.dat"
check "ctitan plot --compare draws the second run's losses on loss.png" $?
"$CTITAN" plot "$tmp/a" --compare "$tmp/missing" --out "$tmp/cmp" > /dev/null 2> "$tmp/cmp.err"
[ $? -ne 0 ] && grep -q "missing/metrics.jsonl" "$tmp/cmp.err"; check "ctitan plot --compare names a missing run" $?
mkdir -p "$tmp/bad"
printf '{"step": 1, "loss": 2}\nnot json\n' > "$tmp/bad/metrics.jsonl"
"$CTITAN" plot "$tmp/bad" > /dev/null 2> "$tmp/plot.err"
[ $? -eq 1 ] && grep -q "metrics.jsonl:2" "$tmp/plot.err"; check "a malformed metrics line is named, exit 1" $?
finish
