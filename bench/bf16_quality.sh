#!/usr/bin/env bash
# Training quality of bf16 mixed precision (issue 12, acceptance 2): the debug model trained
# for STEPS (default 300) steps on the default corpus with `make run`'s settings (global batch
# 16 x 256 tokens, seed, schedule, validation every 50 steps), once in float32 and once in
# bfloat16 (training.mixed_precision_param), the two runs side by side. One process each with
# 2 micro-batches by default: the same rows per step as make run's 2 FSDP ranks and less load
# on a shared machine; RANKS=2 runs each on 2 ranks as make run does. Prints both validation
# curves and the final relative difference (target: within 1%, exit 1 if not) and draws each
# run's charts with `ctitan plot`, plus both loss curves on one chart (--compare).
#   bench/bf16_quality.sh [CTITAN]            train both, then report
#   bench/bf16_quality.sh --report [CTITAN]   report on the runs already in outputs/bf16_quality
set -euo pipefail
report_only=0
[ "${1:-}" = --report ] && { report_only=1; shift; }
CTITAN=${1:-build/ctitan}
STEPS=${STEPS:-300}
RANKS=${RANKS:-1}
cd "$(dirname "$0")/.."
data=outputs/data
out=outputs/bf16_quality
train() { # precision dir
  local launch=(scripts/launch "$RANKS")
  [ "$RANKS" = 1 ] && launch=()
  "${launch[@]}" "$CTITAN" train configs/debug.toml --training.global_batch_size=16 \
    --job.dump_folder="$2" \
    --training.dataset=default --training.dataset_path="$data/default" \
    --model.tokenizer_path="$data/tokenizer.model" \
    --training.steps="$STEPS" --lr_scheduler.warmup_steps=20 --metrics.log_freq=10 \
    --validation.enable=true --validation.freq=50 --validation.steps=8 \
    --training.mixed_precision_param="$1" > "$2.log" 2>&1
}
if [ $report_only = 0 ]; then
  [ -s "$data/default/val_000000.bin" ] && [ -s "$data/tokenizer.model" ] ||
    scripts/default-corpus.sh "$CTITAN"
  rm -rf "$out" && mkdir -p "$out"
  echo "== train: debug model, float32 and bfloat16 side by side, $RANKS rank(s) each, $STEPS steps =="
  start=$(date +%s)
  train float32 "$out/fp32" & a=$!
  train bfloat16 "$out/bf16" & b=$!
  wait $a || { tail -20 "$out/fp32.log"; exit 1; }
  wait $b || { tail -20 "$out/bf16.log"; exit 1; }
  echo "   $(( $(date +%s) - start )) s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
fi
for r in fp32 bf16; do "$CTITAN" plot "$out/$r" > /dev/null; done
"$CTITAN" plot "$out/fp32" --compare "$out/bf16" --out "$out/compare"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def val(run):
    recs = [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
    return [(r["step"], r["validation_loss"]) for r in recs if "validation_loss" in r]
a, b = val("fp32"), val("bf16")
print("step  val fp32  val bf16  rel diff")
for (s, x), (_, y) in zip(a, b):
    print(f"{s:4d}  {x:8.4f}  {y:8.4f}  {(y - x) / x:+.3%}")
n = min(len(a), len(b))
d = abs(b[n - 1][1] - a[n - 1][1]) / a[n - 1][1]
print(f"last common validation (step {a[n - 1][0]}): fp32 {a[n - 1][1]:.4f}, bf16 "
      f"{b[n - 1][1]:.4f}: {d:.3%} apart ({'within' if d < 0.01 else 'NOT within'} 1%)")
sys.exit(0 if d < 0.01 else 1)
PY
