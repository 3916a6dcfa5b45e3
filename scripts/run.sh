#!/usr/bin/env bash
# The main job (`make run`): real text end to end on 2 local ranks.
#  1-2. the default corpus (scripts/default-corpus.sh): the King James Bible (Debian's
#     bible-kjv, 4.3 MB of English prose), a 2048-id byte-level BPE tokenizer trained on it,
#     token shards (2% of the documents held out for validation);
#  3. train TorchTitan's debug model with FSDP on 2 ranks, with validation and checkpoints, in
#     the fastest precision this CPU computes correctly (mixed_precision_param = auto: bf16
#     matmuls where it has AVX512-BF16 or AMX, else fp32);
#  4. sample text from the trained checkpoint;
#  5. draw loss, learning-rate, throughput and memory charts (PNG).
# Everything lands in ./outputs/run (metrics.jsonl, checkpoint/) and ./outputs/data.
set -euo pipefail
CTITAN=${1:-build/ctitan}
STEPS=${STEPS:-200}
cd "$(dirname "$0")/.."
data=outputs/data
scripts/default-corpus.sh "$CTITAN"
echo "== train: debug model (6.2M parameters), FSDP on 2 ranks, $STEPS steps =="
rm -rf outputs/run
scripts/launch 2 "$CTITAN" train configs/debug.toml \
  --job.dump_folder=outputs/run \
  --training.dataset=default --training.dataset_path="$data/default" \
  --model.tokenizer_path="$data/tokenizer.model" \
  --training.steps="$STEPS" --lr_scheduler.warmup_steps=20 --metrics.log_freq=10 \
  --validation.enable=true --validation.freq=50 --validation.steps=8 \
  --checkpoint.enable=true --checkpoint.interval=100 --checkpoint.keep_latest_k=2 \
  --training.mixed_precision_param=auto
echo "== generate: from the last checkpoint =="
"$CTITAN" generate configs/debug.toml --job.dump_folder=outputs/run \
  --model.tokenizer_path="$data/tokenizer.model" --prompt "And God said" \
  --max-new-tokens 60 --temperature 0.7 --top-k 20
echo "== plots =="
"$CTITAN" plot outputs/run
echo "== metrics: outputs/run/metrics.jsonl; checkpoints: outputs/run/checkpoint =="
