#!/usr/bin/env bash
# The main job (`make run`): train TorchTitan's debug model with FSDP on 2 local ranks, on
# synthetic data with a learnable pattern, so a newcomer sees the loss fall.
# Writes ./outputs/run/metrics.jsonl.
set -euo pipefail
CTITAN=${1:-build/ctitan}
cd "$(dirname "$0")/.."
echo "== ctitan: training the debug model (6.2M parameters) for 60 steps with FSDP on 2 ranks =="
scripts/launch 2 "$CTITAN" train configs/debug.toml \
  --job.dump_folder=./outputs/run \
  --training.steps=60 \
  --lr_scheduler.warmup_steps=5
echo "== metrics: ./outputs/run/metrics.jsonl =="
