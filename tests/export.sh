#!/usr/bin/env bash
# `ctitan export`: a checkpoint saved by 2 ranks (Llama 3.1 RoPE scaling on) exported to
# Hugging Face names + config.json gives, through an HF-style forward (rotate_half), the logits
# of the reference model on the checkpoint's own tensors (tests/reference/hf_check.py).
#   tests/export.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
"$ROOT/scripts/launch" 2 "$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=2 \
  --training.seq_len=32 --model.rope_scaling=true --checkpoint.enable=true \
  --job.dump_folder="$tmp/run" --metrics.peak_tflops=0.1 > "$tmp/train.log" 2>&1
check "2-rank run with a checkpoint" $?
"$CTITAN" export "$tmp/run/checkpoint" "$tmp/hf" > "$tmp/export.log" 2>&1
[ $? -eq 0 ] && [ -s "$tmp/hf/model.safetensors" ] && [ -s "$tmp/hf/config.json" ]; check "export writes model.safetensors and config.json" $?
/usr/bin/python3 "$ROOT/tests/reference/hf_check.py" "$tmp/hf" "$tmp/run/checkpoint/step-00000002"
check "HF-style forward on the export equals the reference on the checkpoint" $?
"$CTITAN" export "$tmp/none" "$tmp/hf2" > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "no checkpoint" "$tmp/err"; check "missing checkpoint: named, exit 2" $?
"$CTITAN" export "$tmp/run/checkpoint" > /dev/null 2>&1
[ $? -eq 2 ]; check "missing OUT_DIR: exit 2" $?
finish
